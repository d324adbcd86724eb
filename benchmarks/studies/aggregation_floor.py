"""What is the least any per-client aggregation can cost against FedAvg's plain mean (the memory-traffic floor)?

The least any per-client aggregation can cost, against the plain mean: a memory-traffic floor.

    python -m benchmarks.studies.aggregation_floor --shapes 1000x1000000,2400x159010 --name aggregation-floor

FedAvg's server step reads V [N, P] once and writes one row. A method that gives every client its own
model (SFL's U = Â^L·V, FLT's neighbourhood averages over a threshold graph) must at least read V and
write U [N, P]: this script times, in one process on the same V, (1) `V.mean(0)`, (2) `U.copy_(V)`
into a preallocated U (one read + one write of N·P floats: the floor of any per-client aggregation),
(3) `V.clone()` (the same, allocating U), (4) `torch.add(V, V)` (two reads + one write, allocating),
and (5) one kNN hop Â·V with k = 10 into the preallocated U (SFL's sparse plan, the compiled kernel
of `strategies.methods.sfl.spmm`). Ratios are to (1). Writes `benchmarks/results/<name>.{md,json}`.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import torch

from benchmarks.common import (
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    machine_facts,
    set_threads,
    write_study,
)
from docs.results.studies import aggregation_floor as markdown
from benchmarks.studies.sfl_scale import graphs
from strategies.methods.sfl.gcn import GCNPropagation


def timed(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm-up: page faults of the output, kernel selection
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(n: int, p: int, reps: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    v = torch.randn(n, p, generator=generator)
    hop = GCNPropagation(graphs(n, 10, seed=0)["knn-10"], hops=1, alpha=1.0,
                         order="rows-first", sparse=True)
    u = torch.empty_like(v)
    out = {
        "mean": timed(lambda: v.mean(0), reps),
        "copy": timed(lambda: u.copy_(v), reps),
        "clone": timed(lambda: v.clone(), reps),
        "add": timed(lambda: torch.add(v, v), reps),
        "knn-hop": timed(lambda: hop.apply(v, out=u), reps),
    }
    del v, u
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark_parser("studies.aggregation_floor", __doc__)
    parser.add_argument("--shapes", default="1000x1000000,2400x159010",
                        help="comma-separated NxP shapes of V")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--name", default="aggregation-floor")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    rows = []
    for shape in args.shapes.split(","):
        n, p = (int(float(x)) for x in shape.lower().split("x"))
        rows.append({"n": n, "p": p, **measure(n, p, args.reps)})
        print(json.dumps(rows[-1]), flush=True)
    meta = {
        "name": args.name, "reps": args.reps,
        "command": "python -m benchmarks.studies.aggregation_floor " + shlex.join(sys.argv[1:]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_facts(), "code": code_version(),
    }
    write_study(RESULTS_DIR, args.name, {**meta, "rows": rows}, markdown(meta, rows), indent=2, echo=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
