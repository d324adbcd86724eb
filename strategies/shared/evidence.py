"""The safeguard's evidence, shared by clients and server: is a mix of a client's own model with the
model it received better than a reference, beyond the noise of a small held-out slice?

A client scores each mixing weight a of its grid on its held-out slice and sums, per a, the
per-sample gains over the reference mix (+1 / −1 where only one of the two is right; regression: the
error reduction) and their squares. `clearly_better` tests one such sum; `federation_weight` pools
the sums that the clients of a federation report and picks the weight that is clearly better for the
federation as a whole, which a single client's few dozen samples cannot show.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist


def grid(points: int) -> list[float]:
    """The weights a of the received model: `points` evenly spaced in [0, 1]."""
    return [i / (points - 1) for i in range(points)]


def clearly_better(total: float, squares: float, margin: float) -> bool:
    """Whether gains summing to `total`, with squares summing to `squares`, are more than `margin`
    standard errors above zero: total > margin·√squares (McNemar's statistic (b − c) / √(b + c)
    for ±1 gains)."""
    return total > 0.0 and total > margin * math.sqrt(squares)


def family_margin(margin: float, tests: int) -> float:
    """The threshold, in standard errors, at which the best of `tests` one-sided tests passes on
    noise as often as one test does at `margin` (Bonferroni: each test's false-pass chance divided
    by `tests`); `margin` itself for one test or margin 0."""
    if tests <= 1 or margin <= 0.0:
        return margin
    normal = NormalDist()
    return normal.inv_cdf(1.0 - (1.0 - normal.cdf(margin)) / tests)


def federation_weight(reports: Sequence[tuple[Sequence[float], Sequence[float]]],
                      weights: Sequence[float], margin: float) -> float:
    """The mixing weight a (of `weights`, the grid below 1) whose gains over the received model
    (a = 1), summed over the clients' `reports` of (gains per a, squared gains per a), are largest
    among those clearly above zero, each tested at the family's threshold (`family_margin`: the
    best of several weights must not pass on noise more often than one would); 1 (the received
    model) if none is."""
    margin = family_margin(margin, len(weights))
    best, best_total = 1.0, 0.0
    for i, a in enumerate(weights):
        total = sum(float(gains[i]) for gains, _ in reports)
        squares = sum(float(sq[i]) for _, sq in reports)
        if clearly_better(total, squares, margin) and total > best_total:
            best, best_total = float(a), total
    return best
