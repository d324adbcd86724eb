"""Where the server keeps a per-client matrix (`V [num_clients, P]`, or a method's own [N, P] matrix
such as a graph method's propagated models): in memory, or above a size in a memory-mapped file.

A personalised method's server holds one float32 row per client; with a real model and many clients
the matrices outgrow the server's memory (benchmarks/results/server-memory.md). Above
`client-matrix-mmap-bytes` a matrix is a NumPy memmap of a file in the run's output directory, seen
by torch as an ordinary tensor: every operation and every number is unchanged, and the operating
system pages rows in and out instead of the process holding them. The file is unlinked as soon as it
is mapped, so it is removed when the run ends, however it ends; its space is freed with the mapping.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("flwr.bouquet")

# Default of the run config's `client-matrix-mmap-bytes`: 4 GiB per matrix (a method may keep several).
DEFAULT_MMAP_BYTES = 4 * 1024**3


@dataclass(frozen=True)
class ClientMatrixStorage:
    """Allocates per-client matrices: in memory up to `mmap_bytes` bytes each, memory-mapped in
    `directory` (default: the system's temporary directory) above."""

    mmap_bytes: int = DEFAULT_MMAP_BYTES
    directory: Path | None = None

    def mapped(self, rows: int, cols: int) -> bool:
        """Whether a float32 [rows, cols] matrix goes to a file."""
        return rows * cols * 4 > self.mmap_bytes

    def empty(self, rows: int, cols: int) -> torch.Tensor:
        """An uninitialised float32 [rows, cols] matrix (zeros when file-backed)."""
        if not self.mapped(rows, cols):
            return torch.empty(rows, cols, dtype=torch.float32)
        directory = Path(self.directory) if self.directory is not None else Path(tempfile.gettempdir())
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix="client-matrix-", suffix=".f32") as f:
            array = np.memmap(f.name, dtype=np.float32, mode="w+", shape=(rows, cols))
        # the name is gone (NamedTemporaryFile unlinked it); the mapping keeps the data
        log.info("client matrix [%d, %d] (%.2f GiB) memory-mapped in %s", rows, cols,
                 rows * cols * 4 / 1024**3, directory)
        return torch.from_numpy(array)

    def filled(self, row: torch.Tensor, rows: int) -> torch.Tensor:
        """A [rows, P] matrix whose every row is `row` (the round-0 model)."""
        out = self.empty(rows, row.numel())
        out.copy_(row.to(torch.float32).reshape(1, -1).expand(rows, -1))
        return out

    def copy(self, matrix: torch.Tensor) -> torch.Tensor:
        """A copy of `matrix` with its own storage (`clone`)."""
        out = self.empty(*matrix.shape)
        out.copy_(matrix)
        return out

    def zeros_like(self, matrix: torch.Tensor) -> torch.Tensor:
        out = self.empty(*matrix.shape)
        out.zero_()
        return out
