"""Flat parameter rows: a model's floating-point tensors as one float32 vector, and back.

Personalized strategies keep every client's model as a row of one matrix `V [num_clients, P]` so that
graph aggregation is a single matrix product. The row holds every floating-point state_dict entry in
key order (BatchNorm running statistics included); integer buffers such as `num_batches_tracked` are
not averaged and are taken from the template.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord


@dataclass(frozen=True)
class ParameterLayout:
    """Names, shapes and offsets of the floating-point entries of a model's state."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    template: dict[str, np.ndarray]  # every entry, integer buffers included

    @classmethod
    def of(cls, arrays: ArrayRecord) -> ParameterLayout:
        template = {key: array.numpy() for key, array in arrays.items()}
        keys = tuple(k for k, v in template.items() if np.issubdtype(v.dtype, np.floating))
        shapes = tuple(template[k].shape for k in keys)
        sizes = [int(np.prod(s)) for s in shapes]
        offsets = tuple(int(o) for o in np.concatenate([[0], np.cumsum(sizes)]))
        return cls(keys, shapes, offsets, template)

    @property
    def size(self) -> int:
        return self.offsets[-1]

    def row(self, arrays: ArrayRecord) -> torch.Tensor:
        """Flatten the floating-point entries of `arrays` into one float32 vector."""
        missing = [k for k in self.keys if k not in arrays]
        if missing:
            raise KeyError(f"model record lacks entries {missing[:3]}")
        parts = []
        for key, shape in zip(self.keys, self.shapes):
            value = arrays[key].numpy()
            if value.shape != shape:
                raise ValueError(f"entry '{key}' has shape {value.shape}, expected {shape}")
            parts.append(np.asarray(value, dtype=np.float32).reshape(-1))
        return torch.from_numpy(np.concatenate(parts))

    def arrays(self, row: torch.Tensor) -> ArrayRecord:
        """Rebuild a full ArrayRecord (template dtypes, integer buffers kept) from a row."""
        flat = row.detach().to("cpu", torch.float32).numpy()
        out = dict(self.template)
        for i, (key, shape) in enumerate(zip(self.keys, self.shapes)):
            chunk = flat[self.offsets[i] : self.offsets[i + 1]].reshape(shape)
            out[key] = chunk.astype(self.template[key].dtype, copy=True)
        return ArrayRecord({key: Array(np.ascontiguousarray(value)) for key, value in out.items()})

    def matrix(self, arrays: ArrayRecord, rows: int) -> torch.Tensor:
        """A `[rows, P]` float32 matrix with every row equal to `arrays` (the round-0 state)."""
        return self.row(arrays).unsqueeze(0).repeat(rows, 1)
