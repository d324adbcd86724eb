"""What does the safeguard's held-out slice cost a client that trains alone, and is it the samples or the batches?

    python -m benchmarks.studies.slice_cost --name slice-cost --only u07-shards,u07-shards-s1751,u07-shards-s1752

Replays the `local` method's training of every client of an untuned setting exactly (the run's
initial model, each round's per-message seed and batch order: the replay on the whole train split
is the committed Local number to the digit) three ways: on the whole train split; on the split less
the safeguard's held-out slice (`safeguard-holdout`, the same slice as the safeguard's), batched as
that part (`safeguard-batches = slice-free`); and less the slice in the batches an epoch over the
whole split makes (`whole-split`, the default). Writes `benchmarks/results/<name>.{md,json}`: per
setting, each client's test accuracy averaged over clients (the personalized mean) for the three.
Only settings where every client trains every round (fraction-train 1) can be replayed this way.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (RESULTS_DIR, benchmark_parser, code_version, log_progress,
                               machine_facts, set_threads, write_study)
from docs.results.studies import SLICE_COST_WAYS as WAYS, slice_cost as markdown


def replay(overrides: dict[str, Any], holdout: float) -> dict[str, float]:
    """The personalized mean accuracy (%) of Local on `overrides`, trained the three ways (`WAYS`)."""
    import torch

    from client_app.layers import index_mask
    from client_app.safeguard import holdout_index
    from client_app.seeding import global_seed, seed_torch
    from client_app.training import evaluate, seeded_generator, train_epochs
    from datasets.federated import load_client_data
    from models import build_model
    from strategies.shared.messages import TRAIN_LOCAL
    from strategies.shared.run_config import RunConfig

    cfg = RunConfig.from_flower(overrides)
    if cfg.fraction_train != 1.0:
        raise ValueError(f"slice_cost replays runs where every client trains every round; "
                         f"fraction-train is {cfg.fraction_train} (allowed: 1.0)")
    accuracy: dict[str, list[float]] = {way: [] for way in WAYS}
    for client in range(cfg.num_clients):
        data = load_client_data(cfg.data_spec, client)
        torch.manual_seed(cfg.seed)  # the run's initial model (server_app.app.initial_arrays)
        initial = build_model(cfg.model, data.input_shape, data.num_classes).state_dict()
        kept = holdout_index(len(data.train_y), holdout, cfg.seed, client)[0]
        mask = index_mask(kept, len(data.train_y), data.train_x.device)
        for way in WAYS:
            model = build_model(cfg.model, data.input_shape, data.num_classes)
            model.load_state_dict(initial)
            x, y, keep = ((data.train_x, data.train_y, None) if way == "whole split" else
                          (data.train_x[kept], data.train_y[kept], None) if way == "slice-free" else
                          (data.train_x, data.train_y, mask))
            with torch.random.fork_rng(devices=[]):
                for server_round in range(1, cfg.num_rounds + 1):
                    seed_torch(global_seed(cfg.seed, client, server_round, TRAIN_LOCAL))
                    train_epochs(model, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size,
                                 lr=cfg.lr, momentum=cfg.momentum, keep=keep,
                                 generator=seeded_generator(cfg.seed, client, server_round))
            result = evaluate(model, data.test_x, data.test_y, cfg.batch_size, data.target_scale)
            accuracy[way].append(result.accuracy)
    return {way: 100.0 * sum(values) / len(values) for way, values in accuracy.items()}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.slice_cost", __doc__)
    parser.add_argument("--name", default="slice-cost")
    parser.add_argument("--only", required=True, help="comma-separated untuned setting names")
    parser.add_argument("--list", default=None, help="the untuned list (default: the committed one)")
    parser.add_argument("--baselines", default="untuned-before,untuned-seeds",
                        help="untuned results names (comma-separated) whose Local numbers to show "
                             "beside the replay")
    parser.add_argument("--holdout", type=float, default=None,
                        help="held-out share (default: the run config's safeguard-holdout)")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    import json

    from benchmarks.studies.untuned import LIST, load
    from strategies.shared.run_config import default_run_config

    log_progress()
    set_threads(1)
    path = Path(args.list) if args.list else LIST
    common, settings = load(path)
    names = args.only.split(",")
    unknown = sorted(set(names) - {s["name"] for s in settings})
    if unknown:
        raise SystemExit(f"--only: no setting {', '.join(unknown)} in {path}")
    defaults = default_run_config()
    holdout = args.holdout if args.holdout is not None else float(defaults["safeguard-holdout"])
    stored = {}
    for name in args.baselines.split(","):
        baseline_file = Path(args.results_dir) / f"{name}.json"
        if baseline_file.exists():
            stored.update({r["name"]: r for r in json.loads(baseline_file.read_text())["rows"]})
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for s in (s for s in settings if s["name"] in names):
        means = replay({**defaults, **common, **s["set"], "seed": s["seed"]}, holdout)
        rows.append({"name": s["name"], "seed": s["seed"], "set": s["set"], "means": means,
                     "local": (stored.get(s["name"]) or {}).get("means", {}).get("local")})
        print(s["name"], means, flush=True)
    listed = str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)
    meta = {"name": args.name, "command": "python -m benchmarks.studies.slice_cost " + shlex.join(argv),
            "date": started, "machine": machine_facts(), "code": code_version(), "list": listed,
            "common": common, "holdout": holdout, "baselines": args.baselines}
    write_study(args.results_dir, args.name, {**meta, "rows": rows}, markdown(meta, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
