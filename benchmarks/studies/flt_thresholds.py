"""Which threshold rule gives FLT a client graph whose edges stay inside the true groups?

FLT's client graph under different threshold rules, on one Form Client Relatedness per setting.

    python -m benchmarks.studies.flt_thresholds

Each setting runs FLT for one round (the autoencoder round and FCR come before it), and the distance
matrix A that FCR formed is cut by each rule: the paper's γ = 1 in UMAP units (`flt.threshold=absolute`),
a fraction of the median client-pair distance (`flt.threshold=relative`, `strategies.methods.flt.relatedness.
relative_threshold`), and a cut at the largest ratio gap between consecutive sorted pair distances below
the median (tried, not shipped). Per rule: edges per client and their share inside the true structure
(`strategies.shared.graph.structure_share`: same true cluster where the partition has clusters, else the
label-histogram cosine of the linked clients). Also the largest distance inside a true cluster and the
smallest across, as fractions of the median. Writes `benchmarks/results/<name>.{md,json}`.
"""

from __future__ import annotations

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
from docs.results.studies import flt_thresholds as markdown
from benchmarks.suite import data_budget

SUITE = data_budget()  # the robustness suite's clients and training
SETTINGS: dict[str, dict[str, Any]] = {
    "shards (20 clients)": {**SUITE, "partition": "shards", "shards-per-client": 2},
    "dirichlet α=0.1 (20)": {**SUITE, "partition": "dirichlet", "dirichlet-alpha": 0.1},
    "label-clusters 5×2 (20)": {**SUITE, "partition": "label-clusters", "num-clusters": 5,
                                "labels-per-cluster": 2},
    "domains, 4 rotations (20)": {**SUITE, "partition": "domains"},
    "iid (20)": {**SUITE, "partition": "iid"},
    "default job (10 clients, 5 groups of 2)": {},
    "digits label-clusters 3×2 (9)": {"dataset": "digits", "model": "mclr", "num-clients": 9,
                                      "partition": "label-clusters", "num-clusters": 3,
                                      "labels-per-cluster": 2, "max-samples-per-client": 200},
}
FRACTIONS = (0.1, 0.05, 0.03)


def largest_gap_threshold(distance: np.ndarray) -> float:
    """The geometric midpoint of the largest ratio gap d_(i+1) / d_(i) among the sorted pair
    distances, with at most half of the pairs below the cut."""
    upper = distance[np.triu_indices(len(distance), 1)]
    pairs = np.sort(upper[np.isfinite(upper)])
    half = len(pairs) // 2
    ratios = pairs[1:half + 1] / np.maximum(pairs[:half], 1e-12)
    i = int(np.argmax(ratios))
    return float(np.sqrt(pairs[i] * pairs[i + 1]))


def measure(name: str, overrides: dict[str, Any], workdir: Path) -> dict[str, Any]:
    from server_app.harness.simulate import simulate
    from strategies.shared.run_config import RunConfig, default_run_config
    from strategies.shared.graph import structure_share
    from strategies.shared.priors import structure_truth
    from strategies.methods.flt.relatedness import relative_threshold, threshold_adjacency

    config = {**overrides, "method": "flt", "num-rounds": 1, "finetune-epochs": 0,
              "checkpoint-every": 0, "output-dir": str(workdir), "run-name": "flt"}
    simulate(config)
    distance = np.load(workdir / "flt" / "distance.npy")
    truth, kind = structure_truth(RunConfig.from_flower({**default_run_config(), **config}))
    median = relative_threshold(distance, 1.0)
    rules = {"γ = 1": 1.0, **{f"{f:g} × median": f * median for f in FRACTIONS},
             "largest gap": largest_gap_threshold(distance)}
    row: dict[str, Any] = {"setting": name, "overrides": overrides, "truth": kind,
                           "median": median, "rules": {}}
    for rule, gamma in rules.items():
        graph = threshold_adjacency(distance, gamma)
        edges = float(graph.sum() - len(graph)) / len(graph)
        row["rules"][rule] = {"gamma": gamma, "edges-per-client": edges,
                              "share-inside": structure_share(graph, truth) if edges else None}
    if kind == "true-clusters":
        off = ~np.eye(len(distance), dtype=bool)
        row["inside-max"] = float(distance[(truth > 0) & off].max() / median)
        row["across-min"] = float(distance[truth == 0].min() / median)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.flt_thresholds", __doc__)
    parser.add_argument("--name", default="flt-thresholds")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    set_threads(1)
    started = datetime.now(timezone.utc)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides) in enumerate(SETTINGS.items()):
            rows.append(measure(name, overrides, Path(tmp) / str(i)))
    meta = {"name": args.name, "command": "python -m benchmarks.studies.flt_thresholds " + shlex.join(argv),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
            "code": code_version()}
    write_study(args.results_dir, args.name, {**meta, "rows": rows}, markdown(meta, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
