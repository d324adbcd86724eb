"""Does FLT keep up with max(FedAvg, FedAvg+FT, Local) on settings no rule was tuned on, drawn before its structure decision changed?

    python -m benchmarks.studies.untuned --generate             # draw benchmarks/experiments/untuned.toml
    python -m benchmarks.studies.untuned --name untuned-before  # FLT and the baselines, every setting
    python -m benchmarks.studies.untuned --name untuned-after --methods flt --baselines untuned-before

The list is drawn once, from a stated seed (`--draw-seed`, default 46), before a rule is changed, so
that the rule cannot be fitted to it: seeds not used by the suite (≥ 3), client counts, samples per
client from 30 to 600 (log-uniform), the structure (none, label skew, label clusters, rotated
domains) and its size, and participation. The issue's case (label clusters, about 50 samples per
client, every client taking part, the suite's 20 rounds) is added by name. Every setting shares the
budget in [common] (MNIST, MLP, 10 rounds), sized so that one setting's four results cost well
under a minute on an idle core.

Each setting runs through `benchmarks.compare.compare` (same data, partition, seed and budget for
every method). With `--baselines NAME[,NAME...]` only `--methods` run, and the baselines' numbers
are read from `benchmarks/results/NAME.json` (several names: a setting's numbers from the last that
has it; the baselines' code is unchanged between the two runs; their runs are deterministic).
Writes `benchmarks/results/<name>.{md,json}`: per setting, each method's mean accuracy, FLT −
max(FedAvg, FedAvg+FT, Local) and FLT's structure decision.
"""

from __future__ import annotations

import json
import math
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (RESULTS_DIR, benchmark_parser, code_version, log_progress,
                               machine_facts, set_threads, write_study)
from docs.results.studies import UNTUNED_BASELINES as BASELINES, untuned as markdown

LIST = Path(__file__).resolve().parent.parent / "experiments" / "untuned.toml"
COMMON = {"dataset": "mnist", "model": "mlp", "num-rounds": 10, "local-epochs": 1,
          "batch-size": 32, "lr": 0.05, "finetune-epochs": 1, "checkpoint-every": 0}
ISSUE_CASE = {"name": "issue-label-clusters-n50", "structure": "groups", "seed": 0,
              "set": {"partition": "label-clusters", "num-clusters": 5, "labels-per-cluster": 2,
                      "num-clients": 20, "max-samples-per-client": 50, "fraction-train": 1.0,
                      "num-rounds": 20}}  # the issue's budget: the suite's 20 rounds


# --- drawing the list -------------------------------------------------------------------------------
def draw(draw_seed: int, count: int) -> list[dict[str, Any]]:
    """`count` settings drawn with `random.Random(draw_seed)`, then the issue's case."""
    rng = random.Random(draw_seed)
    settings = []
    for i in range(count):
        clients = rng.choice([10, 12, 16, 20, 24, 30])
        samples = int(round(math.exp(rng.uniform(math.log(30), math.log(600)))))
        kind = rng.choice(["iid", "dirichlet", "label-clusters", "label-clusters", "domains", "shards"])
        keys: dict[str, Any] = {"partition": kind}
        structure = "none"
        if kind == "dirichlet":
            keys["dirichlet-alpha"] = rng.choice([0.3, 1.0, 3.0])
            structure = "label skew"
        elif kind == "label-clusters":
            labels = rng.choice([1, 2, 3])
            keys["num-clusters"] = rng.randint(2, min(10 // labels, 6))
            keys["labels-per-cluster"] = labels
            structure = "groups"
        elif kind == "domains":
            count_rot = rng.choice([2, 3, 4])
            keys["domain-rotations"] = ",".join(str(a) for a in [0, 90, 180, 270][:count_rot])
            structure = "groups"
        elif kind == "shards":
            keys["shards-per-client"] = rng.choice([2, 3])
            structure = "label skew"
        keys.update({"num-clients": clients, "max-samples-per-client": samples,
                     "fraction-train": rng.choice([1.0, 0.5, 0.2])})
        settings.append({"name": f"u{i + 1:02d}-{kind}", "structure": structure,
                         "seed": rng.randrange(3, 10_000), "set": keys})
    return [*settings, ISSUE_CASE]


def toml_text(draw_seed: int, count: int, settings: list[dict[str, Any]]) -> str:
    def value(v: Any) -> str:
        return json.dumps(v) if isinstance(v, str) else (repr(v) if isinstance(v, float) else str(v))

    lines = ["# Settings no rule was tuned on (benchmarks/untuned.py). Drawn by",
             f"#     python -m benchmarks.studies.untuned --generate --draw-seed {draw_seed} --count {count}",
             "# before FLT's structure decision was changed; the last entry is the issue's case.", "",
             "[common]", *(f"{k} = {value(v)}" for k, v in COMMON.items())]
    for s in settings:
        keys = ", ".join(f"{json.dumps(k)} = {value(v)}" for k, v in s["set"].items())
        lines += ["", "[[settings]]", f"name = {json.dumps(s['name'])}",
                  f"structure = {json.dumps(s['structure'])}", f"seed = {s['seed']}",
                  f"set = {{ {keys} }}"]
    return "\n".join(lines) + "\n"


def load(path: Path = LIST) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    import tomllib

    data = tomllib.loads(path.read_text())
    for key in ("common", "settings"):
        if key not in data:
            raise ValueError(f"{path}: missing [{key}]")
    for s in data["settings"]:
        missing = {"name", "structure", "seed", "set"} - set(s)
        if missing:
            raise ValueError(f"{path}: setting {s.get('name', '?')} lacks {sorted(missing)}")
    return data["common"], data["settings"]


def more_seeds(settings: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """Each setting, then the same setting at its next `count` seeds (named `<name>-s<seed>`, as the
    seeds added to the lists by hand are); nothing but the seed changes."""
    out = []
    for s in settings:
        out.append(s)
        out += [{**s, "name": f"{s['name']}-s{s['seed'] + k}", "seed": s["seed"] + k}
                for k in range(1, count + 1)]
    return out


def suite_decisions() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The suite's settings (benchmarks/experiments/suite.toml) at seed 0 and each ρ, one round."""
    from benchmarks.suite import load_grid

    grid = load_grid()
    common = {**grid.common, "num-rounds": 1, "finetune-epochs": 0}
    structure = {"label-clusters": "groups", "domains": "groups"}
    settings = [{"name": f"suite-{setting.name}-rho{rho:g}", "seed": 0,
                 "structure": structure.get(setting.name, "label skew"),
                 "set": {"num-clients": grid.common["num-clients"],
                         "max-samples-per-client": grid.common["max-samples-per-client"],
                         **setting.overrides, "fraction-train": rho}}
                for setting in grid.settings.values() for rho in grid.participation]
    return common, settings


# --- running ----------------------------------------------------------------------------------------
def means(summary: dict[str, Any]) -> dict[str, float | None]:
    final = summary.get("final") or {}
    out = {summary["method"]: (final.get("personalized") or {}).get("mean")}
    if summary["method"] == "fedavg":
        out["fedavg+FT"] = (final.get("finetuned") or {}).get("mean")
    return out


def flt_decision(summary: dict[str, Any]) -> dict[str, Any]:
    """FLT's structure decision, its fine-tuned ("+FT") mean and, where it hands out the consensus,
    the pooled held-out evidence for the fine-tuned answers at the last evaluation that reported it
    (standard errors)."""
    flt = summary.get("flt") or {}
    keys = ("edges", "structure-contrast", "structure-p", "complete-graph")
    decision = {k: flt.get(k) for k in keys if k in flt}
    tuned = ((summary.get("final") or {}).get("finetuned") or {}).get("mean")
    if tuned is not None:
        decision["finetuned"] = tuned
    evidence = [p["safeguard-finetune-evidence"] for p in summary.get("curve") or []
                if "safeguard-finetune-evidence" in p]
    if evidence:
        decision["finetune-evidence"] = evidence[-1]
    return decision


def run(settings: list[dict[str, Any]], common: dict[str, Any], methods: list[str],
        workdir: Path) -> list[dict[str, Any]]:
    from benchmarks.compare import compare

    rows = []
    for s in settings:
        overrides = {**common, **s["set"], "seed": s["seed"]}
        started = time.perf_counter()
        summaries = compare(methods, overrides, s["name"], results_dir=workdir / "results",
                            runs_dir=workdir / "runs" / s["name"])
        row = {"name": s["name"], "structure": s["structure"], "seed": s["seed"], "set": s["set"],
               "means": {}, "seconds": time.perf_counter() - started}
        for summary in summaries:
            row["means"].update(means(summary))
            if summary["method"] == "flt":
                row["flt"] = flt_decision(summary)
        rows.append(row)
        print(s["name"], row["means"], row.get("flt"), f"{row['seconds']:.0f} s", flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("untuned", __doc__)
    parser.add_argument("--generate", action="store_true", help="draw the list into --list and stop")
    parser.add_argument("--draw-seed", type=int, default=46)
    parser.add_argument("--count", type=int, default=13, help="drawn settings (the issue's case is added)")
    parser.add_argument("--list", default=str(LIST))
    parser.add_argument("--name", default="untuned")
    parser.add_argument("--methods", default="flt,fedavg,local")
    parser.add_argument("--baselines", default=None,
                        help="results name(s), comma-separated, whose FedAvg / FedAvg+FT / Local "
                             "numbers to reuse")
    parser.add_argument("--only", default=None, help="comma-separated setting names")
    parser.add_argument("--more-seeds", type=int, default=0, metavar="K",
                        help="run each selected setting at its next K seeds as well")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="run-config override for every setting (repeatable)")
    parser.add_argument("--suite", action="store_true",
                        help="instead of the list: the robustness suite's settings at seed 0 and each "
                             "of its ρ, FLT alone for one round (its structure decision under both "
                             "rules; where they agree the suite's FLT numbers are unchanged)")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    path = Path(args.list)
    if args.generate:
        path.write_text(toml_text(args.draw_seed, args.count, draw(args.draw_seed, args.count)))
        print(path.read_text())
        return 0
    from benchmarks.common import parse_set

    log_progress()
    set_threads(1)
    common, settings = suite_decisions() if args.suite else load(path)
    if args.suite:
        path = Path("benchmarks/experiments/suite.toml")
    if args.only:
        names = args.only.split(",")
        settings = [s for s in settings if s["name"] in names]
    if args.more_seeds < 0:
        parser.error(f"--more-seeds must be >= 0, got {args.more_seeds}")
    settings = more_seeds(settings, args.more_seeds)
    common = {**common, **parse_set(args.set)}
    methods = [m for m in args.methods.split(",") if m]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(settings, common, methods, Path(tmp))
    out = Path(args.results_dir)
    if args.baselines:
        stored = {r["name"]: r for name in args.baselines.split(",")
                  for r in json.loads((out / f"{name}.json").read_text())["rows"]}
        for r in rows:
            for b in BASELINES:
                r["means"].setdefault(b, stored[r["name"]]["means"].get(b))
    meta = {"name": args.name, "command": "python -m benchmarks.studies.untuned " + shlex.join(argv),
            "date": started, "machine": machine_facts(), "code": code_version(),
            "list": str(path.relative_to(Path.cwd())) if path.is_absolute() and path.is_relative_to(Path.cwd()) else str(path),
            "common": common, "baselines": args.baselines}
    write_study(out, args.name, {**meta, "rows": rows}, markdown(meta, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
