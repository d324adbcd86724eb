"""FedCG vs FedAvg on multi-domain data with held-out test clients, its controls and ablations.

    python -m benchmarks.fedcg_domains --variants fedavg,d1,distance,oracle --seeds 0,1,2 \
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
    markdown_table,
    parse_set,
    provenance,
    set_threads,
)
from benchmarks.compare import RUNS_DIR, plot_curves, read_rounds

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


def _num(value: Any, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def last_rounds_mean(row: dict[str, Any], rounds: int = 5) -> float | None:
    """Mean global accuracy over the last `rounds` evaluated rounds (the final round alone is noisy)."""
    values = [p["global-accuracy"] for p in row["curve"] if p.get("global-accuracy") is not None]
    return sum(values[-rounds:]) / len(values[-rounds:]) if values else None


def measures(row: dict[str, Any]) -> dict[str, float | None]:
    """The numbers of one run that the tables show (FedAvg: soft = hard = its accuracy)."""
    fedcg = row.get("fedcg") or {}
    nmi = fedcg.get("nmi") or {}
    soft_by = fedcg.get("accuracy-soft") or row["by-domain"]
    hard_by = fedcg.get("accuracy-hard") or row["by-domain"]
    return {
        "global-soft": fedcg.get("global-accuracy-soft", row["global-accuracy"]),
        "global-hard": fedcg.get("global-accuracy-hard", row["global-accuracy"]),
        "last-5": last_rounds_mean(row),
        "seen-soft": soft_by.get("seen"), "unseen-soft": soft_by.get("unseen"),
        "unseen-hard": hard_by.get("unseen"),
        "nmi-test": nmi.get("student-final"), "nmi-train": nmi.get("student-train-final"),
        "nmi-labels": nmi.get("pseudo-domain-final"),
        "largest-train": fedcg.get("largest-domain-share"),
        "largest-test": fedcg.get("test-largest-domain-share"),
        "s-per-round": row["seconds-per-round"],
    }


COLUMNS = [("global-soft", "global (soft)", 2), ("global-hard", "global (hard)", 2),
           ("last-5", "last 5 rounds (soft)", 2), ("seen-soft", "seen (soft)", 2),
           ("unseen-soft", "unseen (soft)", 2), ("unseen-hard", "unseen (hard)", 2),
           ("nmi-test", "NMI student, test images", 3), ("nmi-train", "NMI student, train images", 3),
           ("nmi-labels", "NMI pseudo-labels", 3), ("largest-train", "largest domain (train labels)", 2),
           ("largest-test", "largest domain (test student)", 2), ("s-per-round", "s/round", 1)]


def _mean_sd(values: list[float | None], digits: int) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def variant_table(variants: list[str], rows: list[dict[str, float | None]],
                  columns: list[tuple[str, str, int]]) -> list[str]:
    """Markdown lines: one row per variant, each column (key, title, digits) as mean ± sd over that
    variant's `rows` (dicts with a `variant` key)."""
    table = []
    for variant in variants:
        values = [r for r in rows if r["variant"] == variant]
        table.append([variant, *(_mean_sd([v[key] for v in values], digits) for key, _, digits in columns)])
    return markdown_table(["variant", *(title for _, title, _ in columns)], "l" + "r" * len(columns), table)


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    s = meta["settings"]
    lines = [*provenance(meta, f"# {meta['name']}"), ""]
    family = s.get("domain-family", "rotations")
    seen = s["domain-styles"] if family == "styles" else s["domain-rotations"]
    unseen = (s.get("domain-unseen-styles") if family == "styles" else s["domain-unseen-rotations"]) or "none"
    lines.append(
        f"- setting: {s['dataset']} `domains`, family {family}: {seen} for the train clients "
        f"({s.get('domains-per-client', 1)} per train client, images split between them), "
        f"{s['num-clients']} clients of which {meta['test-clients']} held out whole as test clients "
        f"(one domain each; unseen: {unseen}), model `{s['model']}`, {s['num-rounds']} rounds, "
        f"fraction-train {s['fraction-train']}, {s['local-epochs']} local epoch(s), batch "
        f"{s['batch-size']}, lr {s['lr']}, {s['max-samples-per-client']} images per client, seeds "
        f"{', '.join(str(x) for x in meta['seeds'])}")
    fedcg_keys = sorted(k for k in s if k.startswith("fedcg."))
    if fedcg_keys:
        lines.append("- FedCG settings (before each variant's overrides): "
                     + ", ".join(f"{k}={s[k]}" for k in fedcg_keys))
    lines.append("- variants: " + "; ".join(
        f"`{v}` = {VARIANTS[v][0]} {VARIANTS[v][1] or ''}".rstrip() for v in meta["variants"]))
    lines += [
        "",
        "Accuracy (%) over the union of the held-out test clients' images after the last round (and "
        "its mean over the last 5 rounds); *seen* = test clients whose domain the training images "
        "have, *unseen* = the held-out domain(s); soft = the student's probabilities as domain weights "
        "(default), hard = its argmax (FedAvg: the same number). NMI per image against the true "
        "domain: the final student on the seen test clients' images and on the last round's training "
        "images, and the pseudo-labels the last round trained with. Largest domain: its share of the "
        "last round's training pseudo-labels / of the test images under the student's argmax.",
        "",
        f"Mean ± sd over {len(meta['seeds'])} seed(s):",
        "",
    ]
    lines += variant_table(list(meta["variants"]),
                           [{"variant": r["variant"], **measures(r)} for r in rows], COLUMNS)
    names = meta["domains"]
    table = []
    for row in rows:
        fedcg = row.get("fedcg") or {}
        nmi = fedcg.get("nmi") or {}
        m = measures(row)
        by = (fedcg.get("accuracy-soft") or row["by-domain"]).get("by-domain", {})
        lam = fedcg.get("lambda") or {}
        cells = [row["variant"], str(row["seed"]), _num(m["global-soft"]), _num(m["seen-soft"]),
                 _num(m["unseen-soft"])] + [_num(by.get(n)) for n in names]
        cells += [_num(nmi.get("student-final"), 3), _num(nmi.get("teacher-round-0"), 3),
                  ", ".join(f"{v:.3f}" for v in lam.values()) or "—"]
        table.append(cells)
    lines += ["", "Every run (accuracy per test domain uses soft weights):", "",
              *markdown_table(["variant", "seed", "global (soft)", "seen", "unseen", *names,
                               "NMI student (test)", "NMI teacher (round 0)", "λ (final)"],
                              "lr" + "r" * (6 + len(names)), table)]
    lines += ["", "Domain histograms (pseudo-domains of the last round's training images; student argmax "
              "of the test images) and the final adjacency:", ""]
    for row in rows:
        fedcg = row.get("fedcg")
        if fedcg:
            adjacency = [[round(v, 3) for v in line] for line in fedcg.get("adjacency") or []]
            lines.append(f"- `{row['variant']}` seed {row['seed']}: train {fedcg.get('domain-histogram')}, "
                         f"test {fedcg.get('test-student-histogram')}, A = {adjacency}")
    lines += ["", f"![global accuracy per round]({meta['name']}.png)", ""]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    series = [(f"{row['variant']} (seed {row['seed']})", [(p["round"], p["global-accuracy"])
                                                          for p in row["curve"]
                                                          if p.get("global-accuracy") is not None])
              for row in rows]
    plot_curves(series, path, "global accuracy on held-out test clients (%)", title)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("fedcg_domains", __doc__)
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
    meta = {"name": args.name, "command": "python -m benchmarks.fedcg_domains " + shlex.join(argv),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
            "code": code_version(), "settings": settings, "variants": variants,
            "test-clients": len(test_clients), "seeds": seeds,
            "domains": list(dict.fromkeys(domain_name(truth, c) for c in test_clients)),
            "runs-dir": str(runs_dir)}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{args.name}.json").write_text(json.dumps({**meta, "rows": rows}, indent=2,
                                                              default=str))
    (RESULTS_DIR / f"{args.name}.md").write_text(markdown(meta, rows))
    plot(rows, RESULTS_DIR / f"{args.name}.png", args.name)
    print(markdown(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
