"""Is a round of Bouquet's fedavg slower than a minimal Flower FedAvg app doing the same work in one process?

Wall time per round: Bouquet's `fedavg` vs a minimal Flower FedAvg app, same model, data, transport.

    python -m benchmarks.studies.flower_speed                       # 20 and 100 clients, 3 rounds, 8 repetitions
    python -m benchmarks.studies.flower_speed --clients 20 --reps 5 --model cnn

Both sides run in this one process over the same in-process transport (`server_app.harness.local_grid.LocalGrid`,
one virtual node per client, so node_config partition-id = client id) and do the same work per round:
every client trains `local-epochs` epochs of minibatch SGD on its train split starting from the global
model, the server averages the replies weighted by num-examples (Flower's `aggregate_arrayrecords` on
both sides), then every client evaluates the new global model on its test split. Bouquet runs with
`finetune-epochs=0` and `eval-every=1` (no "global + local epoch" fine-tuning) through `simulate`, with
its default `fuse-evaluate` (a round's evaluation travels with the next round's train message; the
same work per round, the last evaluation in a final phase counted in the last round).

The minimal app is a plain `ClientApp` with its own train/evaluate handlers (below) driven by Flower's
own `FedAvg(...).start(...)`. Per-round seconds: Bouquet's from its rounds.jsonl (`seconds`, measured by
its runner from the start of a round to the end of its evaluation); Flower's from a `FedAvg` subclass
that timestamps the start of `configure_train` and the end of `aggregate_evaluate` of each round, the
same window. Setup (loading data, Bouquet's identify exchange and round-0 evaluation, the final
reporting) is outside both windows and reported separately. Repetitions alternate which side runs
first; the data of every client is loaded (and cached in this process) before anything is timed.
Writes `benchmarks/results/flower_speed.{md,json}`.
"""

from __future__ import annotations

import cProfile
import json
import logging
import pstats
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from torch.nn import functional as F

from benchmarks.common import (
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    machine_facts,
    markdown_table,
    progress,
    provenance,
    set_threads,
    write_study,
)
from datasets.federated import DataSpec, load_client_data
from models import build_model
from strategies.shared.run_config import RunConfig
from server_app.harness.local_grid import LocalGrid
from server_app.harness.simulate import simulate
from strategies.shared.run_config import default_run_config

TARGET_RATIO = 1.1
BASE = {  # overrides common to both sides (MNIST is bundled, so this runs offline)
    "dataset": "mnist",
    "partition": "shards",
    "shards-per-client": 2,
    "max-samples-per-client": 200,
    "model": "mclr",
    "local-epochs": 1,
    "batch-size": 32,
    "lr": 0.05,
    "momentum": 0.0,
    "seed": 0,
    "fraction-train": 1.0,
    "eval-every": 1,
    "finetune-epochs": 0,
}


# --- the minimal Flower app -----------------------------------------------------------------------
def sgd_epochs(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int,
               batch_size: int, lr: float, momentum: float, generator: torch.Generator) -> float:
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    total = 0.0
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
    return total / max(epochs * len(y), 1)


@torch.no_grad()
def test_accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
    model.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(y), 256):
        logits = model(x[start : start + 256])
        loss += float(F.cross_entropy(logits, y[start : start + 256], reduction="sum"))
        correct += int((logits.argmax(dim=1) == y[start : start + 256]).sum())
    return loss / max(len(y), 1), correct


def minimal_flower_app(spec: DataSpec, model_name: str) -> ClientApp:
    """A plain Flower ClientApp: train and evaluate handlers, nothing else."""
    app = ClientApp()

    def received_model(message: Message, data) -> torch.nn.Module:
        model = build_model(model_name, data.input_shape, data.num_classes)
        model.load_state_dict(message.content["arrays"].to_torch_state_dict())
        return model

    def reply_record(model: torch.nn.Module) -> ArrayRecord:
        return ArrayRecord(model.state_dict())

    @app.train()
    def train(message: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        data, cfg = load_client_data(spec, pid), message.content["config"]
        model = received_model(message, data)
        generator = torch.Generator().manual_seed(cfg["seed"] * 1_000_003 ** 2
                                                  + pid * 1_000_003 + cfg["server-round"])
        loss = sgd_epochs(model, data.train_x, data.train_y, cfg["local-epochs"],
                          cfg["batch-size"], cfg["lr"], cfg["momentum"], generator)
        metrics = MetricRecord({"train-loss": loss, "num-examples": len(data.train_y)})
        return Message(RecordDict({"arrays": reply_record(model), "metrics": metrics}),
                       reply_to=message)

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        data = load_client_data(spec, int(context.node_config["partition-id"]))
        loss, correct = test_accuracy(received_model(message, data), data.test_x, data.test_y)
        metrics = MetricRecord({"eval-loss": loss, "accuracy": correct / len(data.test_y),
                                "num-examples": len(data.test_y)})
        return Message(RecordDict({"metrics": metrics}), reply_to=message)

    return app


class TimedFedAvg(FedAvg):
    """Flower's FedAvg, unchanged, plus a timestamp at the start and the end of every round."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.round_start: dict[int, float] = {}
        self.round_end: dict[int, float] = {}
        self.accuracy: dict[int, float] = {}

    def configure_train(self, server_round, arrays, config, grid):
        self.round_start[server_round] = time.perf_counter()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round, replies):
        result = super().aggregate_evaluate(server_round, replies)
        self.round_end[server_round] = time.perf_counter()
        if result is not None and "accuracy" in result:
            self.accuracy[server_round] = 100.0 * float(result["accuracy"])
        return result

    def round_seconds(self) -> list[float]:
        return [self.round_end[r] - self.round_start[r] for r in sorted(self.round_end)]


# --- one run of each side -------------------------------------------------------------------------
def run_config(clients: int, rounds: int, base: dict[str, Any]) -> dict[str, Any]:
    return {**default_run_config(), **base, "method": "fedavg", "num-clients": clients,
            "num-rounds": rounds}


def run_flower(config: dict[str, Any]) -> dict[str, Any]:
    cfg = RunConfig.from_flower(config)
    t0 = time.perf_counter()
    grid = LocalGrid(minimal_flower_app(cfg.data_spec, cfg.model), cfg.num_clients, config)
    data = load_client_data(cfg.data_spec, 0)
    torch.manual_seed(cfg.seed)
    arrays = ArrayRecord(build_model(cfg.model, data.input_shape, data.num_classes).state_dict())
    n = cfg.num_clients
    strategy = TimedFedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=n,
                           min_evaluate_nodes=n, min_available_nodes=n)
    strategy.start(
        grid=grid, initial_arrays=arrays, num_rounds=cfg.num_rounds,
        train_config=ConfigRecord({"lr": cfg.lr, "momentum": cfg.momentum, "seed": cfg.seed,
                                   "local-epochs": cfg.local_epochs, "batch-size": cfg.batch_size}),
    )
    seconds = strategy.round_seconds()
    return {"seconds": seconds, "total": time.perf_counter() - t0,
            "final-accuracy": strategy.accuracy.get(cfg.num_rounds)}


def run_bouquet(config: dict[str, Any], output_dir: Path, run_name: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    summary = simulate({**config, "output-dir": str(output_dir), "run-name": run_name})
    total = time.perf_counter() - t0
    lines = (output_dir / run_name / "rounds.jsonl").read_text().splitlines()
    rounds = [json.loads(line) for line in lines if line.strip()]
    final = summary["final"]
    return {"seconds": [r["seconds"] for r in rounds if r["round"] > 0], "total": total,
            "final-accuracy": final.get("global-accuracy")}


def warm_up(clients: Sequence[int], base: dict[str, Any], output_dir: Path) -> None:
    """Load every client's data into this process's cache and run each side once, untimed."""
    for n in clients:
        cfg = RunConfig.from_flower(run_config(n, 1, base))
        for client in range(n):
            load_client_data(cfg.data_spec, client)
    config = run_config(min(clients), 1, base)
    run_bouquet(config, output_dir, "warm-up")
    run_flower(config)


def measure(clients: Sequence[int], rounds: int, reps: int, base: dict[str, Any],
            output_dir: Path) -> dict[int, dict[str, Any]]:
    warm_up(clients, base, output_dir)
    timings: dict[int, dict[str, Any]] = {}
    for n in progress(list(clients), "flower_speed"):
        config = run_config(n, rounds, base)
        per = {"bouquet": [], "flower": [], "bouquet-runs": [], "flower-runs": []}
        for rep in range(reps):
            order = ("bouquet", "flower") if rep % 2 == 0 else ("flower", "bouquet")
            for side in order:
                run = (run_bouquet(config, output_dir, f"bouquet-{n}-{rep}") if side == "bouquet"
                       else run_flower(config))
                per[side] += run["seconds"]
                per[f"{side}-runs"].append(run)
                logging.getLogger("bouquet.benchmarks").info(
                    "%d clients, rep %d, %s: median %.3f s/round", n, rep, side,
                    statistics.median(run["seconds"]))
        timings[n] = per
    return timings


# --- where the time goes (cProfile of one run of each side) --------------------------------------
# (label, [(file suffix, function name), ...]); the per-round seconds of each are summed.
COMPONENTS: list[tuple[str, list[tuple[str, str]]]] = [
    ("ClientApp calls (all client-side work)", [("flwr/clientapp/client_app.py", "__call__")]),
    ("  local SGD epochs", [("client_app/training.py", "train_epochs"),
                            ("benchmarks/studies/flower_speed.py", "sgd_epochs")]),
    ("  test-split evaluation", [("client_app/training.py", "evaluate"),
                                 ("benchmarks/studies/flower_speed.py", "test_accuracy")]),
    ("  build model + load received weights", [("client_app/runtime.py", "model"),
                                               ("benchmarks/studies/flower_speed.py", "received_model")]),
    ("  reply ArrayRecord from the model", [("client_app/runtime.py", "model_record"),
                                            ("benchmarks/studies/flower_speed.py", "reply_record")]),
    ("  message contracts (pydantic read/write)", [("strategies/shared/messages.py", "read"),
                                                   ("strategies/shared/messages.py", "config"),
                                                   ("strategies/shared/messages.py", "metrics")]),
    ("  run-config lookup per message", [("client_app/node.py", "run_config")]),
    ("deepcopy (LocalGrid copies each message's content)", [("python3.11/copy.py", "deepcopy")]),
    ("server: aggregate_train (weighted average)", [("flwr/serverapp/strategy/fedavg.py",
                                                     "aggregate_train")]),
    ("server: configure_train + configure_evaluate", [
        ("flwr/serverapp/strategy/fedavg.py", "configure_train"),
        ("flwr/serverapp/strategy/fedavg.py", "configure_evaluate")]),
    ("Bouquet: ClientGrid routing + byte counting", [("server_app/clients.py", "send_and_receive")]),
    ("Bouquet: identify refresh per round", [("server_app/clients.py", "refresh")]),
    ("Bouquet: per-client metrics summary", [("server_app/metrics.py", "accuracy_summary")]),
    ("Bouquet: rounds.jsonl + console log", [("server_app/runner.py", "_record_round")]),
]


def _cumulative(stats: pstats.Stats, suffix: str, func: str) -> float | None:
    """Cumulative seconds of the functions `func` defined in a file ending in `suffix` (None: none
    was called)."""
    times = [ct for (path, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()
             if name == func and path.replace("\\", "/").endswith(suffix)]
    return sum(times) if times else None


def _profile(side: str, config: dict[str, Any], output_dir: Path) -> tuple[pstats.Stats, dict]:
    profiler = cProfile.Profile()
    profiler.enable()
    run = (run_bouquet(config, output_dir, "profile") if side == "bouquet" else run_flower(config))
    profiler.disable()
    return pstats.Stats(profiler), run


def _components(short: pstats.Stats, long: pstats.Stats, rounds: int) -> dict[str, float]:
    """Per-round seconds of each component present: (long run − short run) / rounds."""
    def per_round(suffix: str, func: str) -> float | None:
        after = _cumulative(long, suffix, func)
        return None if after is None else after - (_cumulative(short, suffix, func) or 0.0)

    out = {}
    for label, targets in COMPONENTS:
        values = [v for v in (per_round(suffix, func) for suffix, func in targets) if v is not None]
        if not values:
            continue  # not on this side
        value = sum(values)
        if label.startswith("Bouquet: ClientGrid"):
            # ClientGrid.send_and_receive contains LocalGrid.push_messages (the clients): keep its own part
            value -= per_round("server_app/harness/local_grid.py", "push_messages") or 0.0
        out[label] = max(value, 0.0) / rounds
    return out


def profile_sides(clients: int, rounds: int, base: dict[str, Any], output_dir: Path,
                  repeats: int = 3) -> dict[str, Any]:
    """cProfile a 1-round and a (1 + rounds)-round run of each side, `repeats` times alternating
    the sides; the difference divided by `rounds` is the per-round cost of each component, free of
    setup (profiler-inflated). Medians over the repeats."""
    samples: dict[str, list[dict[str, float]]] = {"bouquet": [], "flower": []}
    seconds: dict[str, list[float]] = {"bouquet": [], "flower": []}
    for repeat in range(repeats):
        for side in ("bouquet", "flower") if repeat % 2 == 0 else ("flower", "bouquet"):
            short, _ = _profile(side, run_config(clients, 1, base), output_dir)
            long, run = _profile(side, run_config(clients, 1 + rounds, base), output_dir)
            samples[side].append(_components(short, long, rounds))
            seconds[side] += run["seconds"]
    out: dict[str, Any] = {"clients": clients, "rounds": rounds, "repeats": repeats,
                           "components": {}}
    for side in ("bouquet", "flower"):
        out[f"{side}-profiled-s/round"] = statistics.median(seconds[side])
        for label, _ in COMPONENTS:
            values = [sample[label] for sample in samples[side] if label in sample]
            if values:
                out["components"].setdefault(label, {})[side] = statistics.median(values)
    return out


# --- the client handlers alone, without the profiler --------------------------------------------
def handler_overhead(base: dict[str, Any], iterations: int = 300) -> dict[str, float]:
    """Median µs of one train and one evaluate message through Bouquet's ClientApp and through the
    minimal app (same model, weights and client data), interleaved, alternating which goes first."""
    from client_app.app import app as bouquet_app
    from strategies.shared.messages import CONFIG, GLOBAL, EvaluateInstructions, TrainInstructions
    from strategies.shared.messages import with_client

    config = run_config(20, 1, base)
    cfg = RunConfig.from_flower(config)
    context = next(iter(LocalGrid(bouquet_app, cfg.num_clients, config).contexts.values()))
    flower_app = minimal_flower_app(cfg.data_spec, cfg.model)
    data = load_client_data(cfg.data_spec, 0)
    arrays = ArrayRecord(build_model(cfg.model, data.input_shape, data.num_classes).state_dict())
    train_ins = TrainInstructions(server_round=1, lr=cfg.lr, momentum=cfg.momentum,
                                  local_epochs=cfg.local_epochs, batch_size=cfg.batch_size,
                                  seed=cfg.seed).config()
    eval_ins = EvaluateInstructions(server_round=1, batch_size=cfg.batch_size, seed=cfg.seed,
                                    finetune_epochs=0, lr=cfg.lr, momentum=cfg.momentum).config()
    flower_train = ConfigRecord({"lr": cfg.lr, "momentum": cfg.momentum, "seed": cfg.seed,
                                 "local-epochs": cfg.local_epochs, "batch-size": cfg.batch_size,
                                 "server-round": 1})
    cases = {
        ("bouquet", "train"): (bouquet_app, lambda: with_client(
            RecordDict({GLOBAL: arrays, CONFIG: train_ins}), 0)),
        ("flower", "train"): (flower_app, lambda: RecordDict(
            {"arrays": arrays, "config": flower_train})),
        ("bouquet", "evaluate"): (bouquet_app, lambda: with_client(
            RecordDict({GLOBAL: arrays, CONFIG: eval_ins}), 0)),
        ("flower", "evaluate"): (flower_app, lambda: RecordDict(
            {"arrays": arrays, "config": ConfigRecord()})),
    }
    times: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
    for i in range(iterations):
        for kind in ("train", "evaluate"):
            for side in ("bouquet", "flower") if i % 2 == 0 else ("flower", "bouquet"):
                app, content = cases[(side, kind)]
                message = Message(content(), dst_node_id=context.node_id, message_type=kind)
                message.metadata.__dict__["_message_id"] = f"{i:032x}"
                start = time.perf_counter()
                app(message, context)
                times[(side, kind)].append(time.perf_counter() - start)
    skip = iterations // 10  # first calls warm caches
    return {f"{side}-{kind}-us": 1e6 * statistics.median(values[skip:])
            for (side, kind), values in times.items()}


# --- report ---------------------------------------------------------------------------------------
def speed_table(timings: dict[int, dict[str, Any]]) -> str:
    rows = []
    for n, per in sorted(timings.items()):
        b, f = statistics.median(per["bouquet"]), statistics.median(per["flower"])
        fastest = min(per["bouquet"]) / min(per["flower"])
        rows.append((n, f"{b:.3f}", f"{f:.3f}", f"{b / f:.2f}", f"{fastest:.2f}"))
    return "\n".join(markdown_table(
        ["clients", "Bouquet s/round median", "Flower FedAvg s/round median", "ratio",
         "ratio of fastest rounds"], "rrrrr", rows))


def _paired_ratio(per: dict[str, Any]) -> float:
    """Median over repetitions of (Bouquet median / Flower median) of the same repetition."""
    return statistics.median(
        statistics.median(b["seconds"]) / statistics.median(f["seconds"])
        for b, f in zip(per["bouquet-runs"], per["flower-runs"]))


def report(meta: dict[str, Any], timings: dict[int, dict[str, Any]],
           profile: dict[str, Any] | None, handlers: dict[str, float] | None = None) -> str:
    base = meta["base"]
    worst = max(statistics.median(p["bouquet"]) / statistics.median(p["flower"])
                for p in timings.values())
    lines = [
        *provenance(meta, "# Bouquet `fedavg` vs a minimal Flower FedAvg app: wall time per round",
                    "; a shared, noisy machine: medians and ratios are what to read"),
        f"- data and model: {base['dataset']}, partition `{base['partition']}` "
        f"(shards-per-client {base['shards-per-client']}), max-samples-per-client "
        f"{base['max-samples-per-client']} (80% train / 20% test), model `{base['model']}`; "
        f"{meta['rounds']} rounds per run, {meta['reps']} repetitions per side alternating which "
        "side goes first; every number is the median over all timed rounds "
        f"({meta['rounds']} × {meta['reps']}) of a side",
        "",
        "Per round, on both sides, over the same in-process transport (`LocalGrid`, one virtual node "
        "per client): every client gets the global model, builds the model and loads the weights, "
        f"runs {base['local-epochs']} epoch(s) of SGD (batch {base['batch-size']}, lr {base['lr']}, "
        f"momentum {base['momentum']}) on its train split and replies; the server takes the "
        "num-examples-weighted average (Flower's `FedAvg.aggregate_train` on both sides); then "
        "every client evaluates the new global model on its test split. Bouquet runs "
        "`simulate({method: fedavg, finetune-epochs: 0, eval-every: 1, ...})`, i.e. without the "
        "\"global + local epoch\" fine-tuning. Bouquet's seconds are its rounds.jsonl `seconds` "
        "(start of the round to the end of its evaluation); Flower's are timed by a `FedAvg` "
        "subclass from the start of `configure_train` to the end of `aggregate_evaluate`.",
        "",
        speed_table(timings),
        "",
        "The last column divides the fastest round of each side, the least disturbed by other "
        "work on the machine. Paired ratio (median over repetitions of the per-repetition ratio): "
        + ", ".join(f"{n} clients {_paired_ratio(p):.2f}" for n, p in sorted(timings.items()))
        + f". Target: ratio of medians ≤ {TARGET_RATIO}; "
        + ("met" if worst <= TARGET_RATIO else "**not met**") + f" (worst {worst:.3f}).",
        "",
        "Whole runs (setup included; Bouquet's also contains its identify exchange, its round-0 "
        "evaluation of the initial model and writing its results), median seconds: "
        + ", ".join(
            f"{n} clients: Bouquet {statistics.median(r['total'] for r in p['bouquet-runs']):.2f}, "
            f"Flower {statistics.median(r['total'] for r in p['flower-runs']):.2f}"
            for n, p in sorted(timings.items())) + ".",
    ]
    if profile:
        rounds = profile["rounds"]
        lines += [
            "",
            f"## Where the time goes ({profile['clients']} clients, cProfile, median of "
            f"{profile['repeats']} profiles per side)",
            "",
            f"Seconds per round under the profiler (which inflates Python-heavy parts): the "
            f"cumulative time of each component in a {1 + rounds}-round run minus that in a "
            f"1-round run, divided by {rounds}, so setup and Bouquet's round 0 cancel out. "
            "Indented rows are parts of the row above them; — = not on that side.",
            "",
            *markdown_table(
                ["component", "Bouquet", "Flower minimal"], "lrr",
                [("whole round (profiled median)", f"{profile['bouquet-profiled-s/round']:.3f}",
                  f"{profile['flower-profiled-s/round']:.3f}"),
                 *((label.replace("  ", "&nbsp;&nbsp;"),
                    *(f"{sides[s]:.3f}" if s in sides else "—" for s in ("bouquet", "flower")))
                   for label, sides in profile["components"].items())]),
            "",
            explain(profile),
        ]
    if handlers:
        per_client = (handlers["bouquet-train-us"] + handlers["bouquet-evaluate-us"]
                      - handlers["flower-train-us"] - handlers["flower-evaluate-us"])
        rows = []
        for kind in ("train", "evaluate"):
            b, f = handlers[f"bouquet-{kind}-us"], handlers[f"flower-{kind}-us"]
            rows.append((kind, f"{b:.0f}", f"{f:.0f}", f"{b - f:+.0f} ({(b / f - 1) * 100:+.0f}%)"))
        lines += [
            "",
            "The client handlers alone, without the profiler (one message through each ClientApp, "
            "interleaved, median µs):",
            "",
            *markdown_table(["message", "Bouquet", "Flower minimal", "difference"], "lrrr", rows),
        ]
        lines += [
            "",
            f"That is {per_client:+.0f} µs per client per round on the client side ("
            + ", ".join(f"{per_client * n / 1e3:+.1f} ms per round at {n} clients"
                        for n in sorted(timings))
            + "): Bouquet's handlers also validate the message contracts (pydantic), resolve the "
            "logical client and its run config, move the model to the device and reply with more "
            "metrics.",
        ]
    lines += [
        "",
        "Same work, checked: the global accuracy after the last round (both sides use the same "
        "seeds, initial model, client data and batch order) is "
        + "; ".join(f"{n} clients: Bouquet {_final(p, 'bouquet')}, Flower {_final(p, 'flower')}"
                    for n, p in sorted(timings.items())) + ".",
        "",
        "Outside the timed rounds Bouquet does more than the minimal app, by design: a "
        "`query.identify` exchange with every node before round 1 (stable client ids, code "
        "fingerprint check), an evaluation of the initial model (round 0), and at the end "
        "summary.json, clients.csv and an accuracy plot (matplotlib, a few tenths of a second). "
        "That is the difference in the whole-run times above; it does not grow with the number "
        "of rounds.",
        "",
        "Both sides build a fresh torch model for every message (random initialisation that the "
        "received weights then overwrite) and deserialise every array from its .npy bytes "
        "(`ArrayRecord.to_torch_state_dict`); with a model this small that is of the same order as "
        "the local SGD itself (see \"build model + load received weights\").",
    ]
    return "\n".join(lines) + "\n"


def _final(per: dict[str, Any], side: str) -> str:
    values = sorted({round(r["final-accuracy"], 6) for r in per[f"{side}-runs"]
                     if r["final-accuracy"] is not None})
    return " / ".join(f"{v:.2f}%" for v in values) or "—"


def explain(profile: dict[str, Any]) -> str:
    """One paragraph naming the components where Bouquet spends more per round than Flower."""
    components = profile["components"]
    total = components["ClientApp calls (all client-side work)"]
    client_extra = total.get("bouquet", 0.0) - total.get("flower", 0.0)
    diffs = []
    for label, sides in components.items():
        if label.startswith("ClientApp calls"):
            continue
        diffs.append((sides.get("bouquet", 0.0) - sides.get("flower", 0.0), label.strip()))
    named_client = sum(d for d, label in diffs
                       if label in {lbl.strip() for lbl, _ in COMPONENTS if lbl.startswith("  ")})
    diffs.append((client_extra - named_client, "other client-side work (client_runtime, reply "
                                               "messages)"))
    extra = profile["bouquet-profiled-s/round"] - profile["flower-profiled-s/round"]
    same_code = ("local SGD epochs", "test-split evaluation",
                 "server: aggregate_train (weighted average)")
    noise = max(abs(d) for d, label in diffs if label in same_code)
    top = [(d, label) for d, label in sorted(diffs, reverse=True)
           if d > max(noise, 0.0005) and label not in same_code][:5]
    parts = ", ".join(f"{label} +{d:.3f} s" for d, label in top)
    return (
        f"Under the profiler a Bouquet round at {profile['clients']} clients took {extra:+.3f} s "
        f"compared with the minimal app; the largest per-round differences: {parts or 'none'}. "
        "Local SGD, test evaluation and the aggregation run the same code on both sides (Flower's "
        "`FedAvg.aggregate_train`; SGD and evaluation loops written alike), so their difference, "
        f"at most {noise:.3f} s here, is the noise of this breakdown."
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.flower_speed", __doc__)
    parser.add_argument("--clients", default="20,100", help="comma-separated client counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--model", default=BASE["model"])
    parser.add_argument("--dataset", default=BASE["dataset"])
    parser.add_argument("--max-samples-per-client", type=int, default=BASE["max-samples-per-client"])
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the cProfile breakdown at the largest client count")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1; 0 = torch's default)")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    parser.add_argument("--name", default="flower_speed")
    args = parser.parse_args(argv)

    bench_log = logging.getLogger("bouquet.benchmarks")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    bench_log.addHandler(handler)
    bench_log.setLevel(logging.INFO)
    bench_log.propagate = False
    logging.getLogger("flwr").setLevel(logging.WARNING)  # both sides log through "flwr": keep quiet

    set_threads(args.threads)
    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    base = {**BASE, "model": args.model, "dataset": args.dataset,
            "max-samples-per-client": args.max_samples_per_client}
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="bouquet-speed-") as tmp:
        timings = measure(clients, args.rounds, args.reps, base, Path(tmp))
        profile = None if args.no_profile else profile_sides(max(clients), args.rounds, base,
                                                             Path(tmp))
        handlers = handler_overhead(base)
    meta = {
        "command": ("python -m benchmarks.studies.flower_speed " + shlex.join(argv)).strip(),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_facts(),
        "code": code_version(),
        "base": base,
        "rounds": args.rounds,
        "reps": args.reps,
    }
    text = report(meta, timings, profile, handlers)
    print(speed_table(timings))
    write_study(results_dir, args.name,
                {**meta, "timings": {str(n): t for n, t in timings.items()}, "profile": profile,
                 "handlers": handlers}, text, indent=2, echo="paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
