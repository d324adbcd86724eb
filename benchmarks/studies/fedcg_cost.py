"""What does one FedCG local epoch cost a client against one FedAvg local epoch?

Client cost: one FedCG local epoch vs one FedAvg local epoch, same backbone, data and batch size.

    python -m benchmarks.studies.fedcg_cost --samples 300 --reps 5 --name fedcg-client-cost

Times the real client handlers (`client_app.methods.fedavg.train` for message `train`, `client_app.methods.fedcg.train`
for `train.fedcg`) called directly, as the ClientApp calls them, on one client of rotated MNIST (the
`domains` partition) with one torch thread. The FedCG message is the one `strategies.methods.fedcg.server.FedCG`
builds for round 1 (model with the GCN weights, student, teacher, adjacency). One FedCG local epoch
is everything its handler does: the teacher's pseudo-domains for every image, the received
student's agreement, one epoch of the FedCG model (V̂ = GCN(A, V, W) recomputed at every step) and
one epoch of the student. With balancing (`fedcg.balance = sinkhorn`, the default) the
pseudo-domains spread over the D branches (one conv per domain present in a batch); with
`balance = none` (the paper's text) a random teacher sends (nearly) every image to one domain, so
each batch needs one merged-kernel conv. A client keeps the frozen teacher's logits in its node
state and computes them once per teacher (every T rounds: in the balancing queries), so FedCG is
timed twice: with the teacher's logits cached (`fedcg`, the client's calls after the balancing) and
with an empty node state (`fedcg-new-teacher`). The balancing itself (`query.fedcg_balance`: one
moments exchange and `fedcg.sinkhorn-iters` marginals exchanges, once per teacher) is timed on the
same client from an empty node state (it computes the teacher's logits) and shown per teacher and
per round (÷ T). Each variant is timed `reps` times after one warm-up call, alternating the order;
the table gives medians and the ratio FedCG / FedAvg (target ≤ 2×).
Writes `benchmarks/results/<name>.{md,json}`.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict

from benchmarks.common import (
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    machine_facts,
    markdown_table,
    provenance,
    set_threads,
    write_study,
)
from client_app.app import app as client_app
from models import build_model
from strategies.shared.run_config import RunConfig
from server_app.harness.local_grid import LocalGrid
from strategies.shared.run_config import default_run_config
from strategies.methods.fedcg.server import fedcg_for
from strategies.shared.phases import answer
from strategies.shared.messages import CONFIG, GLOBAL, TRAIN, TrainInstructions, with_client

TARGET_RATIO = 2.0


def _deliver(content: RecordDict, message_type: str) -> Message:
    message = Message(with_client(content, 0), dst_node_id=1, message_type=message_type)
    message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
    return message


def variant_messages(overrides: dict[str, Any]) -> tuple[RunConfig, dict[str, Message], Context]:
    """The run config, the `train` (FedAvg) and `train.fedcg` (round 1) messages, and a context."""
    cfg, messages, context, _ = round_one(overrides)
    return cfg, messages, context


def round_one(overrides: dict[str, Any]) -> tuple[RunConfig, dict[str, Message], Context, float]:
    """`variant_messages` plus the seconds the round-1 balancing queries took on this client (from an
    empty node state: the teacher's logits are computed in its first query)."""
    flat = {**default_run_config(), **overrides}
    cfg = RunConfig.from_flower(flat)
    grid = LocalGrid(client_app, 1, flat)  # also sets the task identity Flower messages need
    torch.manual_seed(cfg.seed)
    arrays = ArrayRecord(build_model(cfg.model, (1, 28, 28), 10).state_dict())
    ins = TrainInstructions(server_round=1, lr=cfg.lr, momentum=cfg.momentum, local_epochs=1,
                            batch_size=cfg.batch_size, seed=cfg.seed).config()
    context = next(iter(grid.contexts.values()))

    def respond(client: int, message: Message) -> Message:
        """The strategy's balancing queries answered by this client's real handler."""
        return client_app(_deliver(message.content, message.metadata.message_type), context)

    strategy = fedcg_for(cfg)
    strategy.bind(arrays)
    start = time.perf_counter()
    answer(strategy.update_labelling([0]), respond)
    balancing = time.perf_counter() - start
    if cfg.fedcg.balanced and strategy.labelling is None:
        raise RuntimeError("the balancing queries formed no labelling")
    online = SimpleNamespace(get_node_ids=lambda: [0])  # what configure_train asks of a grid
    fedcg = next(iter(strategy.configure_train(1, arrays, ins, online)))
    messages = {
        "fedavg": _deliver(RecordDict({GLOBAL: arrays, CONFIG: ins}), TRAIN),
        "fedcg": _deliver(fedcg.content, fedcg.metadata.message_type),
    }
    return cfg, messages, context, balancing


def empty_state(context: Context) -> Context:
    """The node's context without its state (no cached teacher logits)."""
    return Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config,
                   state=RecordDict(), run_config=context.run_config)


def time_handlers(overrides: dict[str, Any], reps: int) -> dict[str, list[float]]:
    cfg, messages, context, _ = round_one(overrides)
    messages["fedcg-new-teacher"] = messages["fedcg"]
    times: dict[str, list[float]] = {name: [] for name in messages}
    for name, message in messages.items():  # warm-up: data loading, first-call allocations
        client_app(message, context)
    for rep in range(reps):
        order = list(messages) if rep % 2 == 0 else list(reversed(messages))
        for name in order:
            ctx = empty_state(context) if name == "fedcg-new-teacher" else context
            start = time.perf_counter()
            reply = client_app(messages[name], ctx)
            times[name].append(time.perf_counter() - start)
            if reply.has_error():
                raise RuntimeError(f"{name}: {reply.error.reason}")
    times["balancing"] = [round_one(overrides)[3] for _ in range(min(reps, 3))] if cfg.fedcg.balanced else [0.0]
    return times


def cost_table(rows: list[dict[str, Any]]) -> list[str]:
    """One row per variant: FedAvg's and FedCG's seconds per epoch and their ratios."""
    return markdown_table(
        ["variant", "FedAvg s/epoch", "FedCG s/epoch (teacher cached)", "ratio",
         "FedCG s/epoch (new teacher)", "ratio", "balancing s/teacher", "ratio with balancing"],
        "lrrrrrrr",
        [(r["variant"], f"{r['fedavg-seconds']:.3f}", f"{r['fedcg-seconds']:.3f}", f"{r['ratio']:.2f}×",
          f"{r['fedcg-new-teacher-seconds']:.3f}", f"{r['ratio-new-teacher']:.2f}×",
          f"{r['balancing-seconds']:.3f}", f"{r['ratio-with-balancing']:.2f}×") for r in rows])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.fedcg_cost", __doc__)
    parser.add_argument("--samples", type=int, default=300, help="training images of the client")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--name", default="fedcg-client-cost")
    args = parser.parse_args(argv)
    set_threads(1)
    base = {"method": "fedcg", "dataset": "mnist", "partition": "domains", "num-clients": 4,
            "max-samples-per-client": args.samples, "test-fraction": 0.01, "model": args.model,
            "batch-size": args.batch_size, "lr": 0.01, "client-threads": 1}
    variants = [
        ("defaults: balance sinkhorn, classifier stride 1, GCN bottleneck b = 16", {}),
        ("b = 64 (the earlier default)", {"fedcg.bottleneck": 64}),
        ("balance none (the paper's text: pseudo-domains in one branch)", {"fedcg.balance": "none"}),
        ("domain classifiers with stride 2", {"fedcg.domain-stride": 2}),
        ("GCN without W (no bottleneck weights)", {"fedcg.use-w": False}),
    ]
    started = datetime.now(timezone.utc)
    rows = []
    for label, extra in variants:
        times = time_handlers({**base, **extra}, args.reps)
        fedavg, fedcg = statistics.median(times["fedavg"]), statistics.median(times["fedcg"])
        new = statistics.median(times["fedcg-new-teacher"])
        balancing = statistics.median(times["balancing"])
        period = RunConfig.from_flower({**default_run_config(), **base, **extra}).fedcg.teacher_period
        rows.append({"variant": label, "overrides": extra, "fedavg-seconds": fedavg,
                     "fedcg-seconds": fedcg, "ratio": fedcg / fedavg, "fedcg-new-teacher-seconds": new,
                     "ratio-new-teacher": new / fedavg, "balancing-seconds": balancing,
                     "ratio-with-balancing": (fedcg + balancing / period) / fedavg, "times": times})
        print(f"{label}: fedavg {fedavg:.3f} s, fedcg {fedcg:.3f} s (new teacher {new:.3f} s), ratio "
              f"{fedcg / fedavg:.2f} ({new / fedavg:.2f})")
    meta = {"name": args.name, "command": "python -m benchmarks.studies.fedcg_cost " + shlex.join(argv),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
            "code": code_version(), "settings": base}
    lines = [*provenance(meta, f"# {args.name}: one FedCG local epoch vs one FedAvg local epoch"), ""]
    lines += [
        f"One client of rotated MNIST (`domains`), {args.samples} training images, model `{args.model}`, "
        f"batch {args.batch_size}, one local epoch, one torch thread; D = 4, 2-layer GCN; each row "
        "is the defaults but for what it names. Median of "
        f"{args.reps} calls of the real client handler (after a warm-up call). Target: ratio ≤ "
        f"{TARGET_RATIO:g}. *Teacher cached*: the client already holds the frozen teacher's logits "
        "(every training call after the balancing queries, which fill the cache); *new teacher*: a "
        "call with an empty node state. *Balancing*: the client's time in the balancing queries of "
        "one teacher (1 + sinkhorn-iters exchanges, from an empty node state), and the ratio with it "
        "spread over the T rounds of a teacher: (FedCG + balancing / T) ÷ FedAvg.",
        "",
        *cost_table(rows),
    ]
    lines.append("")
    write_study(RESULTS_DIR, args.name, {**meta, "rows": rows}, "\n".join(lines), indent=2, echo="paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
