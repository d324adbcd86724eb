"""How much of a DP-SGD round is the accountant's ε, and how much does caching it save?

    python -m benchmarks.studies.privacy_accountant --pairs 3 --name privacy-accountant

Runs the privacy grid's DP-SGD cell (benchmarks/experiments/privacy.toml, label clusters, ε = 8:
12 MNIST clients of at most 200 samples, the MLP, 6 rounds, seed 0, its calibrated σ = 1.0657 and
the target ε = 8) once per variant and pair, each run a fresh process, the two variants in turn
(A B, B A, ...): `opacus`, ε computed as before the cache (a fresh `RDPAccountant` and its
`get_epsilon` for every call: each client's report, the server's ledger of every client every round,
every step of a target's search), and `cached`, `strategies.shared.privacy.epsilon` as it is (one
step's RDP cached per noise multiplier and sampling rate, ε per exact history and δ). Both variants
must report the same ε in every round and the same final metrics (the run stops otherwise). The table
gives each variant's median seconds per round (the runs' own `seconds-per-round`) and the ratio per
pair. Writes `benchmarks/results/<name>.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.common import (RESULTS_DIR, benchmark_parser, code_version, machine_facts,
                               markdown_table, provenance, set_threads, write_study)

CELL = {"dataset": "mnist", "num-clients": 12, "num-rounds": 6, "model": "mlp",
        "max-samples-per-client": 200, "local-epochs": 1, "batch-size": 32, "lr": 0.05,
        "finetune-epochs": 1, "checkpoint-every": 0, "safeguard": "off", "dp-max-grad-norm": 1.0,
        "dp-clip-norm": 1.0, "partition": "label-clusters", "num-clusters": 4,
        "labels-per-cluster": 2, "dp": "sample", "dp-delta": 1e-5, "dp-target-epsilon": 8.0,
        "seed": 0, "dp-noise-multiplier": 1.0657, "dp-upload-noise-multiplier": 1.0657}
VARIANTS = ("opacus", "cached")


def _uncached(entries: tuple, delta: float) -> float:
    """ε as computed before the cache: a fresh RDPAccountant per call."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = list(entries)
    return float(accountant.get_epsilon(delta=delta))


def one_run(variant: str, method: str, out: Path) -> None:
    """One federation in this process with the `variant` accountant; its numbers to `out`."""
    from server_app.harness.simulate import simulate
    from strategies.shared import privacy

    set_threads(1)
    if variant == "opacus":
        privacy._epsilon = _uncached  # `epsilon` looks it up at every call
    with tempfile.TemporaryDirectory() as runs:
        summary = simulate({**CELL, "method": method, "output-dir": runs, "run-name": "run"})
        rounds = [json.loads(line) for line in (Path(runs) / "run" / "rounds.jsonl").open()]
    out.write_text(json.dumps({
        "seconds-per-round": summary["seconds-per-round"],
        "privacy": [r.get("privacy") for r in rounds],
        "final": summary["final"]}))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.privacy_accountant", __doc__)
    parser.add_argument("--pairs", type=int, default=3, help="runs of each variant, in turn")
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--name", default="privacy-accountant")
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        one_run(args.one, args.method, args.out)
        return 0
    set_threads(1)  # as in each run (the machine facts record this process's threads)
    started = datetime.now(timezone.utc)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as scratch:
        for pair in range(args.pairs):
            for variant in VARIANTS if pair % 2 == 0 else reversed(VARIANTS):
                out = Path(scratch) / f"{variant}-{pair}.json"
                subprocess.run([sys.executable, "-m", "benchmarks.studies.privacy_accountant",
                                "--one", variant, "--method", args.method, "--out", str(out)],
                               check=True)
                runs[variant].append(json.loads(out.read_text()))
                print(f"pair {pair} {variant}: {runs[variant][-1]['seconds-per-round']:.2f} s/round",
                      flush=True)
    reference = runs["opacus"][0]
    for variant, done in runs.items():
        for run in done:
            if run["privacy"] != reference["privacy"] or run["final"] != reference["final"]:
                raise SystemExit(f"the {variant} accountant changed a number: ε per round "
                                 f"{run['privacy']} against {reference['privacy']}")
    before = [r["seconds-per-round"] for r in runs["opacus"]]
    after = [r["seconds-per-round"] for r in runs["cached"]]
    ratios = [a / b for a, b in zip(before, after)]
    rows = [{"method": args.method, "pair": i, "opacus-seconds-per-round": a,
             "cached-seconds-per-round": b, "ratio": a / b} for i, (a, b) in enumerate(zip(before, after))]
    meta = {"name": args.name,
            "command": "python -m benchmarks.studies.privacy_accountant " + shlex.join(argv),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
            "code": code_version(), "settings": {**CELL, "method": args.method}}
    lines = [*provenance(meta, f"# {args.name}: the accountant's share of a DP-SGD round"), "",
             f"`{args.method}` on the privacy grid's label-clusters `dp = \"sample\"` ε = 8 cell (12 "
             "MNIST clients of at most 200 samples, the MLP, 6 rounds, seed 0, σ = 1.0657, target "
             "ε = 8), one torch thread, each run a fresh process, the variants in turn. *Opacus*: ε "
             "by a fresh `RDPAccountant.get_epsilon` at every call (as before the cache); *cached*: "
             "one step's RDP cached per (σ, q) and ε per exact history and δ. Both reported the same "
             "ε in every round and the same final metrics. Seconds per round: the run's median "
             "round; ratio: Opacus ÷ cached, per pair.", "",
             *markdown_table(["method", "pair", "Opacus s/round", "cached s/round", "ratio"], "lrrrr",
                             [(r["method"], str(r["pair"]), f"{r['opacus-seconds-per-round']:.2f}",
                               f"{r['cached-seconds-per-round']:.2f}", f"{r['ratio']:.1f}×")
                              for r in rows]),
             "", f"Median: {statistics.median(before):.2f} s/round before, "
             f"{statistics.median(after):.2f} s/round cached, ratio {statistics.median(ratios):.1f}×.",
             ""]
    write_study(RESULTS_DIR, args.name, {**meta, "rows": rows}, "\n".join(lines), indent=2, echo="paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
