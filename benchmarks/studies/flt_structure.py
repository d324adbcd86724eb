"""Does the thresholded graph's contrast tell data with client groups from data without, across partitions, client counts and seeds?

FLT's structure check across partitions, client counts and seeds: does the thresholded graph's
contrast (`strategies.methods.flt.relatedness.structure_contrast`) tell data with client groups from
data without?

    python -m benchmarks.studies.flt_structure [--seeds 0 1 2]

Each setting runs FLT for one round (the autoencoder round and Form Client Relatedness come before
it) with `flt.no-structure=keep`, so the thresholded graph is what FLT would use without the check.
Per setting and seed: the edges per client, their share inside the true structure
(`strategies.shared.graph.structure_share`: the same true cluster where the partition has clusters,
else the label-histogram cosine of the linked clients), the contrast (the edges' median distance
between latent centroid sets over the non-edges'), and what the earlier rule, a contrast below
`flt.min-contrast` 0.3 (replaced by FLT's structure test, `flt.structure-confidence`),
decides. Writes `benchmarks/results/<name>.{md,json}`.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    machine_facts,
    set_threads,
    write_study,
)
from docs.results.studies import flt_structure as markdown
from benchmarks.suite import data_budget

SUITE = data_budget()  # the robustness suite's clients and training
TABLES = {"dataset": "mnist", "num-clients": 50, "model": "mlp", "max-samples-per-client": 300,
          "local-epochs": 2, "batch-size": 10, "lr": 0.01, "momentum": 0.5}  # FLT's method tables
CLUSTERS = {"partition": "label-clusters", "num-clusters": 5, "labels-per-cluster": 2}
# (setting, overrides, structure): "groups" = groups of clients that share labels or a domain,
# "label skew" = each client's labels differ without groups, "none" = alike up to sampling
SETTINGS: list[tuple[str, dict[str, Any], str]] = [
    ("iid, 20 clients", {**SUITE, "partition": "iid"}, "none"),
    ("iid, 50 clients", {**TABLES, "partition": "iid"}, "none"),
    ("iid, 100 clients", {**TABLES, "num-clients": 100, "partition": "iid"}, "none"),
    ("Dirichlet α=1, 50 clients", {**TABLES, "partition": "dirichlet", "dirichlet-alpha": 1.0}, "none"),
    ("Dirichlet α=1, 20 clients", {**SUITE, "partition": "dirichlet", "dirichlet-alpha": 1.0}, "none"),
    ("Dirichlet α=0.1, 20 clients", {**SUITE, "partition": "dirichlet", "dirichlet-alpha": 0.1}, "label skew"),
    ("shards q=2, 20 clients", {**SUITE, "partition": "shards", "shards-per-client": 2}, "label skew"),
    ("shards q=2, 50 clients", {**TABLES, "partition": "shards", "shards-per-client": 2}, "label skew"),
    ("label-clusters 5×2, 20 clients", {**SUITE, **CLUSTERS}, "groups"),
    ("label-clusters 5×2, 50 clients", {**TABLES, **CLUSTERS}, "groups"),
    ("label-clusters 3×3, 30 clients", {**SUITE, "num-clients": 30, "partition": "label-clusters",
                                         "num-clusters": 3, "labels-per-cluster": 3}, "groups"),
    ("domains, 4 rotations, 20 clients", {**SUITE, "partition": "domains"}, "groups"),
    ("domains, 2 rotations (0°, 180°), 20 clients", {**SUITE, "partition": "domains",
                                                    "domain-rotations": "0,180"}, "groups"),
    ("label-clusters 10×1, 50 clients", {**TABLES, "partition": "label-clusters", "num-clusters": 10,
                                          "labels-per-cluster": 1}, "groups"),
    ("domains, 4 rotations, 40 clients", {**SUITE, "num-clients": 40, "partition": "domains"}, "groups"),
]


def measure(overrides: dict[str, Any], seed: int, workdir: Path) -> dict[str, Any]:
    from server_app.harness.simulate import simulate
    from strategies.methods.flt.relatedness import structure_contrast
    from strategies.shared.graph import structure_share
    from strategies.shared.priors import structure_truth
    from strategies.shared.run_config import RunConfig, default_run_config

    config = {**overrides, "method": "flt", "num-rounds": 1, "finetune-epochs": 0, "seed": seed,
              "flt.no-structure": "keep", "checkpoint-every": 0, "output-dir": str(workdir),
              "run-name": "flt"}
    simulate(config)
    summary = json.loads((workdir / "flt" / "summary.json").read_text())
    graph = np.load(workdir / "flt" / "graph.npy")
    truth, _ = structure_truth(RunConfig.from_flower({**default_run_config(), **config}))
    edges = float(graph.sum() - len(graph)) / len(graph)
    flt = summary["flt"]
    return {"seed": seed, "edges-per-client": edges,
            "share-inside": structure_share(graph, truth) if edges else None,
            "contrast": flt.get("structure-contrast")}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.flt_structure", __doc__)
    parser.add_argument("--name", default="flt-structure")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="*", default=None, help="settings whose name starts so")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)

    set_threads(1)
    started = datetime.now(timezone.utc)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides, structure) in enumerate(SETTINGS):
            if args.only and not any(name.startswith(o) for o in args.only):
                continue
            seeds = [measure(overrides, seed, Path(tmp) / f"{i}-{seed}") for seed in args.seeds]
            rows.append({"setting": name, "overrides": overrides, "structure": structure,
                         "seeds": seeds})
            print(name, [(r["contrast"], r["share-inside"]) for r in seeds], flush=True)
    meta = {"name": args.name, "command": "python -m benchmarks.studies.flt_structure " + shlex.join(argv),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
            "code": code_version(), "min-contrast": 0.3}
    write_study(args.results_dir, args.name, {**meta, "rows": rows}, markdown(meta, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
