"""GCN propagation of client parameter rows (SFL, docs/methods/sfl.md): U = α·Â^L·V + (1−α)·V with
Â row-normalised, planned graph-first or rows-first, dense or sparse (`strategies.methods.sfl.spmm`) by cost."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from scipy.sparse import csr_matrix


# SFL (docs/methods/sfl.md): U = α·Â^L·V + (1−α)·V with Â = D_A⁻¹A the row-normalised client graph.
# The propagation is one linear operator W = α·Â^L + (1−α)·I applied to the parameter rows V; it is
# applied either "graph-first" (W formed on the N×N graph, then ONE product W·V) or "rows-first" (L
# products Â·X), each with a dense or a sparse kernel, whichever the cost model says is cheaper.
PropagationOrder = Literal["auto", "graph-first", "rows-first"]
PROPAGATION_ORDERS: tuple[str, ...] = ("auto", "graph-first", "rows-first")

SPARSE_COST_PER_NONZERO = 2.0  # a sparse multiply-add costs this many dense ones (sfl_scale.py: 2.0)
DENSE_COLUMN_BLOCK = 16_384  # columns of V per block of the dense rows-first kernel


def gcn_operator(adj_hat: torch.Tensor | np.ndarray, hops: int, alpha: float) -> torch.Tensor:
    """W = α·Â^L + (1−α)·I (dense N×N, float32), so that U = W·V (spec §2 (3)); Â^L by repeated
    squaring on the N×N graph (float64, then rounded once)."""
    a = torch.as_tensor(np.asarray(adj_hat), dtype=torch.float64)
    eye = torch.eye(a.shape[0], dtype=torch.float64)
    power = torch.linalg.matrix_power(a, hops) if hops > 0 else eye
    return (alpha * power + (1.0 - alpha) * eye).to(torch.float32)


class GCNPropagation:
    """The weight-free GCN of SFL (spec §2 (3)): `apply(V)` = α·Â^L·V + (1−α)·V for a fixed Â.

    Plans: graph-first = W = α·Â^L + (1−α)·I formed on the N×N graph, then ONE product W·V;
    rows-first = L products Â·X, then the α mix. Each with a dense (BLAS) or a sparse
    (`strategies.methods.sfl.spmm`, CSR) kernel. `auto` takes the plan of least modelled cost, in dense
    multiply-adds per column of V: dense N² per product, sparse `SPARSE_COST_PER_NONZERO`·nnz
    (measured by benchmarks/studies/sfl_scale.py).
    So a dense graph goes graph-first/dense (one GEMM instead of L), a kNN graph rows-first/sparse
    (L·nnz(Â) < nnz(Â^L) once neighbourhoods overlap), and a graph whose Â^L stays sparse
    graph-first/sparse. V is processed in blocks of columns, all hops of a block at once, so a block
    stays in cache across hops and no N×P intermediate is kept (memory: V and U). The sparse kernel
    runs every hop of a cache-sized column block in compiled code, the columns split among torch's
    thread count of threads. No loop over clients.
    """

    def __init__(self, adj_hat: torch.Tensor | np.ndarray, hops: int, alpha: float,
                 order: PropagationOrder = "auto", sparse: bool | None = None) -> None:
        if hops < 0:
            raise ValueError(f"hops must be >= 0, got {hops}")
        if order not in PROPAGATION_ORDERS:
            raise ValueError(f"unknown order {order!r}; allowed: {', '.join(PROPAGATION_ORDERS)}")
        a = torch.as_tensor(np.asarray(adj_hat), dtype=torch.float32)
        self.num_clients = n = a.shape[0]
        self.hops, self.alpha = hops, alpha
        self.adj_hat = a
        self.operator = gcn_operator(a, hops, alpha)  # W (dense; N×N is small next to N×P)
        self.nnz_adjacency = nnz_a = int(torch.count_nonzero(a))
        self.nnz_operator = nnz_w = int(torch.count_nonzero(self.operator))
        mix = n if alpha != 1.0 else 0
        costs = {
            ("graph-first", False): float(n * n),
            ("graph-first", True): SPARSE_COST_PER_NONZERO * nnz_w,
            ("rows-first", False): float(hops * n * n + mix),
            ("rows-first", True): SPARSE_COST_PER_NONZERO * hops * nnz_a + mix,
        }
        self.costs = {f"{o}/{'sparse' if s else 'dense'}": c for (o, s), c in costs.items()}
        allowed = [key for key in costs
                   if (order == "auto" or key[0] == order) and (sparse is None or key[1] == sparse)]
        self.order, self.sparse = min(allowed, key=lambda key: (costs[key], key))
        if self.order == "graph-first":
            self._step, self._steps = self.operator, 1
        else:
            self._step, self._steps = a, hops
        if self.sparse:
            step = csr_matrix(self._step.numpy())
            self._csr = (step.indptr.astype(np.int64), step.indices.astype(np.int64),
                         step.data.astype(np.float32))

    def describe(self) -> str:
        return f"{self.order}/{'sparse' if self.sparse else 'dense'}"

    def apply(self, rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """U = α·Â^L·V + (1−α)·V for parameter rows V [N, P] (float32) → U [N, P].

        `out`: a matrix of V's shape and dtype (not V itself) to write U into. Reusing one across
        rounds matters at scale: a fresh N×P result costs more in first-touch page faults than the
        sparse products themselves (`benchmarks/results/aggregation-floor.md`)."""
        if rows.shape[0] != self.num_clients:
            raise ValueError(f"rows must have {self.num_clients} rows (one per client), got "
                             f"{rows.shape[0]}")
        if out is None or out.shape != rows.shape or out.dtype != rows.dtype:
            out = torch.empty_like(rows)
        if out.data_ptr() == rows.data_ptr():
            raise ValueError("out must not share memory with the rows")
        if self.hops == 0 or self.alpha == 0.0:
            return out.copy_(rows)
        if self.order == "graph-first" and not self.sparse:
            return torch.mm(self._step, rows, out=out)  # one GEMM; BLAS blocks it itself
        if not self.sparse:
            self._columns(rows, out, 0, rows.shape[1])
            return out
        return self._sparse_apply(rows, out)

    def _sparse_apply(self, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The sparse plans: `strategies.methods.sfl.spmm`'s column-blocked kernel, the columns split among
        torch's thread count of threads (the kernel releases the GIL)."""
        from concurrent.futures import ThreadPoolExecutor

        import strategies.methods.sfl.spmm as spmm  # lazy: numba only for sparse propagations

        if rows.dtype != torch.float32 or rows.device.type != "cpu":
            raise ValueError(f"the sparse propagation takes float32 rows on the CPU, got {rows.dtype} "
                             f"on {rows.device}")
        source = rows.detach().contiguous().numpy()
        target = out if out.is_contiguous() else torch.empty_like(rows)
        result = target.numpy()
        alpha = self.alpha if self.order == "rows-first" else 1.0  # graph-first: α is inside W
        columns = rows.shape[1]
        workers = max(1, min(torch.get_num_threads(), columns // spmm.block_columns(rows.shape[0])))
        bounds = [columns * i // workers for i in range(workers + 1)]

        def run(i: int) -> None:
            spmm.propagate_columns(self._csr, self._steps, alpha, source, result, bounds[i],
                                   bounds[i + 1])

        if workers == 1:
            run(0)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(run, range(workers)))
        return target if target is out else out.copy_(target)

    def _columns(self, rows: torch.Tensor, out: torch.Tensor, first: int, last: int) -> None:
        """out[:, first:last] = the propagation of rows[:, first:last], block by block, every hop
        of a block at once."""
        width = DENSE_COLUMN_BLOCK
        mix = self.order == "rows-first" and self.alpha != 1.0
        for start in range(first, last, width):
            stop = min(start + width, last)
            block = rows[:, start:stop].contiguous()
            x = block
            for _ in range(self._steps):
                x = self._step @ x
            if mix:
                x = self.alpha * x + (1.0 - self.alpha) * block
            out[:, start:stop] = x
