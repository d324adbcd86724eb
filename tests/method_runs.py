"""Short, fixed-seed runs of every method, recorded value for value in `method_runs.json`.

They pin down each method's numbers across refactoring: `tests/test_method_runs.py` re-runs every case
and compares round by round. After a deliberate change of a method's behaviour or defaults, re-record
with `python tests/method_runs.py [method ...]` and say in the commit why the numbers moved.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).with_name("method_runs.json")

BASE: dict[str, Any] = {
    "dataset": "digits", "model": "mclr", "partition": "label-clusters", "num-clusters": 2,
    "labels-per-cluster": 5, "num-clients": 6, "num-rounds": 3, "local-epochs": 1, "batch-size": 32,
    "lr": 0.05, "max-samples-per-client": 120, "finetune-epochs": 1, "fraction-train": 0.5,
    "checkpoint-every": 0, "seed": 3, "safeguard": "off",  # the paper's behaviour; the safeguard cases set "mix"
}

# Per case (a method, or a method's paper flags under another name with its own "method"): what a
# short run needs beyond BASE (small graph learners, a conv model for FedCG).
CASES: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "fedprox": {},
    "local": {},
    "ditto": {},
    "ifca": {"ifca.clusters": 2},
    "fedsem": {"fedsem.clusters": 2},
    "flt": {"flt.ae-epochs": 1, "flt.latent-dim": 16, "flt.umap-neighbors": 4,
            "flt.no-structure": "keep"},  # the paper's: the thresholded graph, whatever its contrast
    "flt-absolute": {"method": "flt", "flt.threshold": "absolute", "flt.ae-epochs": 1,
                     "flt.latent-dim": 16, "flt.umap-neighbors": 4,
                     "flt.no-structure": "keep"},  # the paper's threshold
    "scaffold": {},
    "fedatt": {},
    "fedper": {},
    "lg-fedavg": {},
    "sfl": {},
    "sfl-star": {"sfl.gl-k": 2, "sfl.gl-steps": 5},
    "fedcg": {"model": "cnn", "partition": "domains", "domain-family": "styles",
              "domains-per-client": 2, "domain-test-clients": 0.34, "max-samples-per-client": 40,
              "batch-size": 10, "fedcg.domains": 2, "fedcg.teacher-period": 2,
              "fedcg.adj-warmup": 1, "fedcg.bottleneck": 8, "fedcg.sinkhorn-iters": 3,
              "fedcg.balance-schedule": "exchange"},  # one exchange per Sinkhorn scaling (§6.9)
    "fedcg-sampled": {"method": "fedcg", "model": "cnn", "partition": "domains",  # the default schedule
                      "domain-family": "styles", "domains-per-client": 2, "domain-test-clients": 0.34,
                      "max-samples-per-client": 40, "batch-size": 10, "fedcg.domains": 2,
                      "fedcg.teacher-period": 2, "fedcg.adj-warmup": 1, "fedcg.bottleneck": 8,
                      "fedcg.sinkhorn-iters": 3, "fedcg.balance-sample": 8},
    "fedska": {"fedska.k": 2, "fedska.structure-steps": 2, "fedska.encoder-steps": 2,
               "fedska.schedule": "separate"},  # the paper's: embed and grad queries as phases
    "fedska-fused": {"method": "fedska", "fedska.k": 2, "fedska.structure-steps": 2,  # the schedule
                     "fedska.encoder-steps": 2},  # with 2 exchanges: 2 phases per round
    "fedu": {},
    "fedu-reference": {"method": "fedu", "fedu.untrained": "initial"},  # untrained rows keep w0
    # the safeguard (the default; BASE pins the paper's behaviour): the train.local, train.sfl and
    # train.fedska paths, 4 rounds so that clients mix with an own model
    "sfl-safeguard": {"method": "sfl", "safeguard": "mix", "num-rounds": 4},
    "fedska-safeguard": {"method": "fedska", "safeguard": "mix", "num-rounds": 4, "fedska.k": 2,
                         "fedska.structure-steps": 2, "fedska.encoder-steps": 2},
    "fedu-safeguard": {"method": "fedu", "safeguard": "mix", "num-rounds": 4},
    # FLT without groups hands every client the consensus: the margin and the federation's weight
    "flt-consensus": {"method": "flt", "partition": "iid", "safeguard": "mix", "num-rounds": 4,
                      "flt.ae-epochs": 1, "flt.latent-dim": 16, "flt.umap-neighbors": 4},
}

# What a round record keeps for the comparison: the results, not the time they took.
TIMING = ("seconds",)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items()
                if not any(k.endswith(t) for t in TIMING)}
    return value


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested round record as one level of `a/b` keys (compared key by key by `differences`)."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# Fields compared to a looser relative tolerance, by their last key: FedCG's balancing offsets come
# out of float64 numpy code whose last bits depend on the CPU (numpy picks vectorised routines by the
# instruction sets it finds), and the balancing iterations grow that to about 3e-5 relative
# (measured: [-0.30561, 0.340356] on an AVX-512 Intel Xeon against [-0.3056, 0.340346] on AMD EPYC).
# The labels they give and every result after them compare at the default tolerance.
LOOSE = {"offset": 1e-4}


def differences(got: dict[str, Any], want: dict[str, Any], rel: float = 1e-6,
                abs_tol: float = 1e-9) -> list[str]:
    """What differs between two round records: the same keys; floats (also inside lists, such as a
    per-step loss list) within `rel`/`abs_tol` (`LOOSE`'s fields within theirs); ints, strings,
    booleans and the length of a list (client ids, counts, names) exactly. Empty if equal.

    Written out instead of `pytest.approx` over the whole record, which newer pytest refuses for
    records holding lists, and which would also let integer counts and ids pass approximately."""
    got_flat, want_flat = flatten(got), flatten(want)
    problems = [f"{key}: missing" for key in sorted(set(want_flat) - set(got_flat))]
    problems += [f"{key}: not recorded" for key in sorted(set(got_flat) - set(want_flat))]
    for key in sorted(set(got_flat) & set(want_flat)):
        if not _same(got_flat[key], want_flat[key], LOOSE.get(key.rsplit("/", 1)[-1], rel), abs_tol):
            problems.append(f"{key}: {got_flat[key]!r} != {want_flat[key]!r}")
    return problems


def _same(a: Any, b: Any, rel: float, abs_tol: float) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, rel, abs_tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):  # JSON keeps a float's ".0": an int here is a change
        return isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)
    return type(a) is type(b) and a == b


def run_case(case: str, output_dir: Path) -> list[dict[str, Any]]:
    """The round records of one case's short run, without timings."""
    from server_app.harness.simulate import simulate
    simulate({**BASE, "method": case, **CASES[case], "output-dir": str(output_dir),
              "run-name": case}, num_nodes=2)
    lines = (output_dir / case / "rounds.jsonl").read_text().splitlines()
    return [_strip(json.loads(line)) for line in lines]


def main(methods: list[str]) -> None:
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in methods or list(CASES):
            golden[method] = run_case(method, Path(tmp))
            print(f"recorded {method}: {len(golden[method])} rounds")
    GOLDEN.write_text(json.dumps(dict(sorted(golden.items())), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch
    torch.set_num_threads(1)  # as in the tests (conftest.py): the thread count changes float sums
    main(sys.argv[1:])
