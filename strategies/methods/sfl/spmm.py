"""Column-blocked sparse × dense products: the kernel behind SFL's sparse GCN propagation.

`propagate_columns` computes, for the columns [first, last) of a float32 matrix V [N, P],

    out = α·S^steps·V + (1−α)·V          (S a CSR matrix [N, N])

one block of columns at a time: the block's every step runs while the block is in cache (two scratch
buffers of N × block floats), so V is read once and `out` written once whatever the number of steps,
and no N×P intermediate exists. The inner loop is a row axpy over the block's contiguous columns,
which the compiler vectorises. The kernel is compiled with numba on first call (a few seconds, cached
on disk where numba can write) and releases the GIL, so callers split the columns among threads.

`strategies.shared.graph` imports this module only when a sparse plan is chosen, so client processes and
dense graphs never pay numba's import or compilation.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

# Columns per block: sized so that the block of V, two scratch blocks and the output row stay in the
# per-core cache (2 MiB L2 on the reference machine) — see `block_columns`.
BLOCK_BYTES = 1 << 20


def block_columns(num_rows: int) -> int:
    """Columns per block for a matrix with `num_rows` rows: ~BLOCK_BYTES of float32 per block, a
    multiple of 32 (whole vector registers), between 32 and 4096."""
    columns = BLOCK_BYTES // (4 * max(1, num_rows))
    return int(min(4096, max(32, columns // 32 * 32)))


def _jit(function: Any) -> Any:
    """numba.njit without the GIL, cached on disk where numba finds a writable place (else per process)."""
    options = dict(nogil=True, fastmath=True, boundscheck=False)
    try:
        return numba.njit(cache=True, **options)(function)
    except RuntimeError:  # "no locator available": nowhere to write the cache
        return numba.njit(**options)(function)


@_jit
def _product(indptr, indices, data, src, src_col, dst, dst_col, width):  # pragma: no cover (jit)
    """dst[i, dst_col:dst_col+width] = Σ_p data[p]·src[indices[p], src_col:src_col+width] over the
    non-zeros p of row i of the CSR matrix (indptr, indices, data)."""
    for i in range(dst.shape[0]):
        row = dst[i, dst_col:dst_col + width]
        row[:] = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            weight = data[p]
            source = src[indices[p], src_col:src_col + width]
            for c in range(width):
                row[c] += weight * source[c]


@_jit
def _propagate(indptr, indices, data, steps, alpha, rows, out, first, last,
               block):  # pragma: no cover (jit)
    n = rows.shape[0]
    x = np.empty((n, block), np.float32)
    y = np.empty((n, block), np.float32)
    mix = alpha != 1.0
    for start in range(first, last, block):
        width = min(block, last - start)
        if steps == 1 and not mix:
            _product(indptr, indices, data, rows, start, out, start, width)
            continue
        _product(indptr, indices, data, rows, start, x, 0, width)
        for _ in range(1, steps):
            _product(indptr, indices, data, x, 0, y, 0, width)
            x, y = y, x
        for i in range(n):
            for c in range(width):
                out[i, start + c] = alpha * x[i, c] + (1.0 - alpha) * rows[i, start + c]


def propagate_columns(csr: tuple[np.ndarray, np.ndarray, np.ndarray], steps: int, alpha: float,
                      rows: np.ndarray, out: np.ndarray, first: int, last: int) -> None:
    """out[:, first:last] = α·S^steps·rows[:, first:last] + (1−α)·rows[:, first:last].

    `csr` = (indptr int64 [N+1], indices int64 [nnz], data float32 [nnz]) of S [N, N]; `rows` and
    `out` C-contiguous float32 [N, P], distinct; steps ≥ 1. Releases the GIL."""
    indptr, indices, data = csr
    _propagate(indptr, indices, data, steps, float(alpha), rows, out, first, last,
              block_columns(rows.shape[0]))
