"""Does FedCG beat FedAvg on multi-domain data with held-out test clients, and which of its parts (controls, ablations) make the difference?

FedCG vs FedAvg on multi-domain data with held-out test clients, its controls and ablations.

    python -m benchmarks.studies.fedcg_domains --variants fedavg,d1,distance,oracle --seeds 0,1,2 \
        --set domain-family=styles --set domains-per-client=2 --set domain-unseen-styles=blurred \
        --set domain-unseen-rotations= --name fedcg-styles-k2

Every variant runs through `server_app.harness.simulate.simulate` with the same common settings (`--set`, on
top of the defaults below): the `domains` partition of MNIST (train clients rotated 0/90/180/270°,
whole test clients held out, some of them with an unseen rotation), the same backbone, rounds,
clients per round and local epochs (and, with `--seeds`, the same seeds). Variants: `fedavg` (it
samples only train clients, as FedCG does), the controls `d1` (FedCG with one domain: the residual
capacity alone) and `oracle` (each training image's true domain; test time still uses the student),
FedCG with adjacency `distance` (eq. 6–7 after the warm-up; the shipped defaults), `identity`,
`uniform`, `random`, and `kmeans` (domains from K-means of the client models); `unbalanced` and
`<adjacency>-centered` switch `fedcg.balance` to none / centering; `avg2` and `flatten` switch the
domain classifier's pooling. Each FedCG run evaluates its test clients with both soft (student
probabilities) and hard (argmax) domain weights.

The global accuracy is over the union of the test clients' images (the paper's metric); it is split
by true domain and into seen / unseen domains from each run's per-client results (the same function
for every method, `strategies.methods.fedcg.report.accuracy_by_domain`). NMI is per image against each image's
true domain. Writes `benchmarks/results/<name>.{md,json,png}` (a table of means over the seeds, then
every run); each run's outputs go to `outputs/benchmarks/<name>/<variant>-seed<s>/`.
"""

from __future__ import annotations

import csv
import json
import logging
import shlex
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    log_progress,
    machine_facts,
    parse_set,
    set_threads,
    write_study,
)
from docs.results.studies import fedcg_domains as markdown, fedcg_domains_plot as plot
from benchmarks.compare import RUNS_DIR, read_rounds

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg": ("fedavg", {}),
    "distance": ("fedcg", {"fedcg.adjacency": "distance"}),
    "identity": ("fedcg", {"fedcg.adjacency": "identity"}),
    "uniform": ("fedcg", {"fedcg.adjacency": "uniform"}),
    "random": ("fedcg", {"fedcg.adjacency": "random"}),
    "kmeans": ("fedcg", {"fedcg.adjacency": "distance", "fedcg.clustering": "kmeans"}),
    "no-w": ("fedcg", {"fedcg.use-w": False}),
    "all-layers": ("fedcg", {"fedcg.layers": "all"}),
    # pseudo-domain balancing (fedcg.balance, default sinkhorn): the other two modes
    "distance-centered": ("fedcg", {"fedcg.adjacency": "distance", "fedcg.balance": "centering"}),
    "identity-centered": ("fedcg", {"fedcg.adjacency": "identity", "fedcg.balance": "centering"}),
    "uniform-centered": ("fedcg", {"fedcg.adjacency": "uniform", "fedcg.balance": "centering"}),
    "unbalanced": ("fedcg", {"fedcg.balance": "none"}),  # the paper's text
    # controls: the residual capacity alone (one domain), and each training image's true domain
    "d1": ("fedcg", {"fedcg.domains": 1}),
    "oracle": ("fedcg", {"fedcg.clustering": "oracle"}),
    # the domain classifier's pooling (§6.10)
    "avg2": ("fedcg", {"fedcg.classifier-pool": "avg2"}),
    "flatten": ("fedcg", {"fedcg.classifier-pool": "flatten"}),
    # the GCN's bottleneck width b (W1 [q, b], W2 [b, q]): the client's cost is mostly these weights
    "b64": ("fedcg", {"fedcg.bottleneck": 64}),
    "b16": ("fedcg", {"fedcg.bottleneck": 16}),
}
DEFAULTS: dict[str, Any] = {
    "dataset": "mnist", "partition": "domains", "model": "cnn", "domain-rotations": "0,90,180,270",
    "domain-test-clients": 0.2, "domain-unseen-rotations": "45", "num-clients": 50,
    "max-samples-per-client": 100, "num-rounds": 20, "fraction-train": 1.0, "local-epochs": 1,
    "batch-size": 10, "lr": 0.05, "finetune-epochs": 0, "client-threads": 1, "seed": 0,
}

log = logging.getLogger("bouquet.benchmarks")


def client_results(path: Path) -> tuple[dict[int, float], dict[int, float]]:
    """(correct, num-examples) per client from a run's clients.csv (the global model's predictions)."""
    correct, examples = {}, {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if not row.get("num-examples"):
                continue
            client = int(row["client-id"])
            value = row.get("global-correct") or row.get("correct")
            correct[client], examples[client] = float(value), float(row["num-examples"])
    return correct, examples


def run_variant(label: str, seed: int, common: dict[str, Any], runs_dir: Path, truth: Any,
                test_clients: list[int], reuse: bool = False) -> dict[str, Any]:
    """Run one variant with one seed (or, with `reuse`, read the finished run of the same name and
    settings)."""
    from server_app.harness.simulate import simulate
    from strategies.methods.fedcg.report import accuracy_by_domain

    method, extra = VARIANTS[label]
    name = f"{label}-seed{seed}"
    overrides = {**common, **extra, "seed": seed, "method": method, "output-dir": str(runs_dir),
                 "run-name": name}
    started = time.perf_counter()
    done = runs_dir / name / "summary.json"
    if reuse and done.exists() and _same_settings(runs_dir / name / "config.json", overrides):
        log.info("%s: reusing the finished run in %s", label, done.parent)
        summary = json.loads(done.read_text())
    else:
        summary = simulate(overrides)
    correct, examples = client_results(runs_dir / name / "clients.csv")
    row: dict[str, Any] = {
        "variant": label, "seed": seed, "method": method, "overrides": extra,
        "global-accuracy": summary["final"].get("global-accuracy"),
        "by-domain": accuracy_by_domain(correct, examples, truth, test_clients),
        "seconds-per-round": summary.get("seconds-per-round"),
        "wall-seconds": time.perf_counter() - started,
        "curve": [{"round": r["round"], "global-accuracy": r.get("global-accuracy")}
                  for r in read_rounds(runs_dir / name / "rounds.jsonl")],
    }
    if "fedcg" in summary:
        block = summary["fedcg"]
        row["fedcg"] = {key: block.get(key) for key in (
            "global-accuracy-soft", "global-accuracy-hard", "accuracy-soft", "accuracy-hard", "nmi",
            "lambda", "adjacency", "domain-histogram", "test-student-histogram", "student-agreement",
            "client-domain", "largest-domain-share", "test-largest-domain-share", "balance")}
    return row


def _same_settings(config_path: Path, overrides: dict[str, Any]) -> bool:
    """Whether a finished run's config.json has every override of this variant."""
    from strategies.shared.run_config import RunConfig
    from strategies.shared.run_config import default_run_config

    if not config_path.exists():
        return False
    config = json.loads(config_path.read_text())
    wanted = RunConfig.from_flower({**default_run_config(), **overrides}).flat()
    return all(config.get(key) == wanted[key] for key in overrides if key != "output-dir")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.fedcg_domains", __doc__)
    parser.add_argument("--variants", default="fedavg,distance,identity,uniform",
                        help=f"comma-separated, from {', '.join(VARIANTS)}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; every variant runs each")
    parser.add_argument("--name", required=True)
    parser.add_argument("--reuse", action="store_true",
                        help="read variants whose run (same name and settings) already finished")
    args = parser.parse_args(argv)
    log_progress()
    set_threads(1)
    from datasets.federated import load_partition
    from datasets.partition import heldout_test_clients
    from strategies.shared.run_config import RunConfig
    from strategies.shared.run_config import default_run_config
    from strategies.methods.fedcg.report import domain_name

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; allowed: {', '.join(VARIANTS)}")
    common = {**DEFAULTS, **parse_set(args.set)}
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    common.pop("seed", None)
    runs_dir = RUNS_DIR / args.name
    started = datetime.now(timezone.utc)
    rows = []
    for seed in seeds:
        cfg = RunConfig.from_flower({**default_run_config(), **common, "seed": seed, "method": "fedcg"})
        truth = load_partition(cfg.data_spec)[1]
        held_out = heldout_test_clients(cfg.data_spec.partition)
        test_clients = list(range(cfg.num_clients)) if held_out is None else held_out.tolist()
        for label in variants:
            log.info("%s: running %s, seed %d", args.name, label, seed)
            rows.append(run_variant(label, seed, common, runs_dir, truth, test_clients, args.reuse))
            log.info("%s: %s seed %d global accuracy %s (%.0f s)", args.name, label, seed,
                     rows[-1]["global-accuracy"], rows[-1]["wall-seconds"])
    settings = {k: v for k, v in cfg.flat().items()
                if k not in ("method", "run-name", "output-dir", "seed")}
    meta = {"name": args.name, "command": "python -m benchmarks.studies.fedcg_domains " + shlex.join(argv),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
            "code": code_version(), "settings": settings, "variants": variants,
            "test-clients": len(test_clients), "seeds": seeds,
            "domains": list(dict.fromkeys(domain_name(truth, c) for c in test_clients)),
            "runs-dir": str(runs_dir)}
    write_study(RESULTS_DIR, args.name, {**meta, "rows": rows}, markdown(meta, rows), indent=2)
    plot(rows, RESULTS_DIR / f"{args.name}.png", args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
