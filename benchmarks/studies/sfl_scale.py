"""How long does SFL's server aggregation take at scale, as a multiple of the plain mean of the same matrix?

Server aggregation time of SFL at scale, as a ratio to the plain mean of the same matrix.

    python -m benchmarks.studies.sfl_scale --clients 100,1000 --params 1e5,1e6 --name sfl-scale

For N clients × P parameters (float32 V [N, P], one process, medians of `--reps`): the plain mean
V.mean(0) (FedAvg's server step, unweighted) against SFL's propagation U = α·Â^L·V + (1−α)·V
(U = α·Â^L·V + (1−α)·V of docs/methods/sfl.md, `strategies.methods.sfl.gcn.GCNPropagation`) on two graphs:
- dense: every pair linked with a uniform random weight (a dense similarity graph);
- knn: each client linked to its k nearest neighbours among random points in the plane (plus itself),
  the shape of a road / proximity graph, propagated with torch.sparse.
Each graph is run under the four plans (graph-first = Â^L formed on the N×N graph, then one product;
rows-first = L products; dense or sparse kernel) and the one `auto` chooses. A plan whose modelled cost
is over `--skip-above` times the cheapest is skipped (it would take minutes), and a run slower than
`--slow` seconds is not repeated. "step" adds the read-out w = mean(U) that completes SFL's server step.
Writes `benchmarks/results/<name>.md` and `.json`.
"""

from __future__ import annotations

import gc
import itertools
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import benchmark_parser, log_progress, progress, write_study
from docs.results.studies import sfl_scale as markdown
from strategies.methods.sfl.gcn import GCNPropagation
from strategies.shared.graph import row_normalize

REPO = Path(__file__).resolve().parent.parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
PLANS: tuple[tuple[str, bool], ...] = (
    ("graph-first", False), ("graph-first", True), ("rows-first", False), ("rows-first", True))


def timed(fn: Callable[[], Any], reps: int, slow: float) -> tuple[float, int]:
    """Median wall seconds of `reps` calls (a single call when the first one exceeds `slow`)."""
    times: list[float] = []
    for _ in range(reps):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
        del result
        if times[0] > slow:
            break
    return statistics.median(times), len(times)


def knn_graph(points: torch.Tensor | np.ndarray, k: int, self_loops: bool = True) -> torch.Tensor:
    """Binary kNN graph [N, N] of points [N, d]: row i links i to its k nearest other points."""
    x = torch.as_tensor(np.asarray(points), dtype=torch.float64)
    distances = torch.cdist(x, x)
    distances.fill_diagonal_(float("inf"))
    k = max(0, min(int(k), len(x) - 1))
    graph = torch.zeros(len(x), len(x), dtype=torch.float32)
    if k:
        graph.scatter_(1, distances.topk(k, dim=1, largest=False).indices, 1.0)
    if self_loops:
        graph.fill_diagonal_(1.0)
    return graph


def graphs(n: int, k: int, seed: int) -> dict[str, torch.Tensor]:
    """The two benchmark graphs, row-normalised: dense random weights, and kNN of points in 2-D."""
    rng = np.random.default_rng(seed)
    dense = rng.random((n, n)).astype(np.float32)
    points = rng.random((n, 2))
    return {"dense": row_normalize(dense), f"knn-{k}": row_normalize(knn_graph(points, k))}


def measure(clients: Sequence[int], params: Sequence[int], *, hops: Sequence[int] = (3,),
            alpha: float = 1.0, k: int = 10, reps: int = 3, slow: float = 20.0,
            skip_above: float = 10.0, seed: int = 0,
            log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """One row per (N, P, L, graph, plan): seconds and ratios to the plain mean of the same V.

    Every propagation writes into one preallocated U, as SFL's server does across rounds, and the
    sparse kernel is compiled before anything is timed."""
    GCNPropagation(row_normalize(np.ones((2, 2))), 2, 0.5, "rows-first", True).apply(
        torch.zeros(2, 64))  # compile the sparse kernel (numba) outside the timings
    rows: list[dict[str, Any]] = []
    for n, p, steps in progress(list(itertools.product(clients, params, hops)), "sfl_scale"):
        rows += _measure_case(n, p, steps, alpha=alpha, k=k, reps=reps, slow=slow,
                              skip_above=skip_above, seed=seed, log=log)
    return rows


def _measure_case(n: int, p: int, hops: int, *, alpha: float, k: int, reps: int, slow: float,
                  skip_above: float, seed: int,
                  log: Callable[[str], None]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    generator = torch.Generator().manual_seed(seed)
    v = torch.randn(n, p, generator=generator)
    u = torch.empty_like(v)
    u.zero_()  # touch every page once, outside the timings
    mean_s, _ = timed(lambda: v.mean(dim=0), reps, slow)
    weights = torch.rand(n, generator=generator)
    wmean_s, _ = timed(lambda: (weights / weights.sum()) @ v, reps, slow)
    log(f"N={n} P={p} L={hops}: mean {mean_s:.3f} s, weighted mean {wmean_s:.3f} s")
    for name, adj_hat in graphs(n, k, seed).items():
        started = time.perf_counter()
        auto = GCNPropagation(adj_hat, hops, alpha)
        auto_build = time.perf_counter() - started
        cheapest = min(auto.costs.values())
        for order, sparse in PLANS:
            plan = f"{order}/{'sparse' if sparse else 'dense'}"
            row: dict[str, Any] = {
                "clients": n, "params": p, "hops": hops, "graph": name, "plan": plan,
                "auto": plan == auto.describe(), "mean-seconds": mean_s,
                "weighted-mean-seconds": wmean_s,
                "nnz-per-row": auto.nnz_adjacency / n,
                "nnz-operator-per-row": auto.nnz_operator / n,
                "modelled-cost": auto.costs[plan] / cheapest,
            }
            if auto.costs[plan] > skip_above * cheapest:
                row["skipped"] = True
                rows.append(row)
                continue
            started = time.perf_counter()
            prop = GCNPropagation(adj_hat, hops, alpha, order, sparse)
            row["build-seconds"] = auto_build if row["auto"] else time.perf_counter() - started
            seconds, runs = timed(lambda: prop.apply(v, out=u), reps, slow)
            readout, _ = timed(lambda: v.mean(dim=0), 1, slow)
            row.update({"seconds": seconds, "runs": runs, "ratio": seconds / mean_s,
                        "step-ratio": (seconds + readout) / mean_s})
            rows.append(row)
            log(f"  {name:>7} {plan:<18} {seconds:8.3f} s  {seconds / mean_s:7.1f}× mean"
                f"{'  (auto)' if row['auto'] else ''}")
            del prop
            gc.collect()
    del v, u
    gc.collect()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.sfl_scale", __doc__)
    parser.add_argument("--clients", default="100,1000")
    parser.add_argument("--params", default="1e5,1e6")
    parser.add_argument("--hops", default="3", help="comma-separated numbers of hops L")
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--slow", type=float, default=20.0)
    parser.add_argument("--skip-above", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--name", default="sfl-scale")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    log_progress()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from benchmarks.common import code_version, machine_facts

    started = datetime.now(timezone.utc)
    clients = [int(float(c)) for c in args.clients.split(",")]
    params = [int(float(p)) for p in args.params.split(",")]
    hops = [int(h) for h in args.hops.split(",")]
    rows = measure(clients, params, hops=hops, alpha=args.alpha, k=args.k, reps=args.reps,
                   slow=args.slow, skip_above=args.skip_above)
    meta = {
        "name": args.name, "command": "python -m benchmarks.studies.sfl_scale " + shlex.join(argv),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
        "code": code_version(), "hops": args.hops, "alpha": args.alpha, "k": args.k,
        "reps": args.reps, "slow": args.slow, "threads": torch.get_num_threads(),
    }
    write_study(args.results_dir, args.name, {**meta, "rows": rows}, markdown(meta, rows), indent=2,
                echo="paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
