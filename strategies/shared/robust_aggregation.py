"""The robust rules a personalized strategy's global part may aggregate with instead of the weighted
mean (run config `aggregation`): `median`, the coordinate-wise median (FedMedian, Yin et al. 2018),
and `trimmed-mean`, the coordinate-wise mean after cutting the `trim-fraction` smallest and largest
values (Flower's `trim_mean`, FedTrimmedAvg). Both are unweighted, as Flower's."""

from __future__ import annotations

import numpy as np
import torch
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean

# every rule of the global part: `mean` is the weighted mean (strategies.shared.personalized)
AGGREGATIONS = ("mean", "median", "trimmed-mean")


def robust_mean(rows: torch.Tensor, rule: str, trim_fraction: float = 0.2) -> torch.Tensor:
    """The robust aggregate `rule` (`median` or `trimmed-mean`) of [n, P] client rows."""
    values = rows.numpy()
    if rule == "median":
        return torch.from_numpy(np.median(values, axis=0).astype(values.dtype))
    if rule == "trimmed-mean":
        return torch.from_numpy(np.asarray(trim_mean(values, trim_fraction), dtype=values.dtype))
    raise ValueError(f"unknown robust aggregation {rule!r}; allowed: median, trimmed-mean")
