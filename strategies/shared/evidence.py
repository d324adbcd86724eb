"""The safeguard's evidence, shared by clients and server: is a mix of a client's own model with the
model it received better than a reference, beyond the noise of a small held-out slice?

A client scores each mixing weight a of its grid on its held-out slice and sums, per a, the
per-sample gains over the reference mix (+1 / −1 where only one of the two is right; regression: the
error reduction) and their squares. `clearly_better` tests one such sum; `federation_weight` pools
the sums that the clients of a federation report and picks the weight that is clearly better for the
federation as a whole, which a single client's few dozen samples cannot show. `StartEvidence` pools,
in the same way, how much better the clients' own models are than the models they trained from the
federation's consensus, and decides where their training starts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass
class StartEvidence:
    """Where a federation hands every client its consensus, where a sampled client's training starts
    (run config `safeguard-start`): `consensus` (FedAvg's start), `mix` (the client's chosen mix) or
    `federation`: the consensus until the clients' own models are clearly better on their held-out
    slices than the models they trained from it, summed over every such report since the start
    (`pool`), then the mix for the rest of the run. Clients whose own model is much better than what
    one round of training from the consensus gives (the federation has structure the consensus
    misses) keep training their own models; where it is not, the consensus is trained as FedAvg
    trains it and every client's start stays close to it."""

    mode: str
    gain: float = 0.0  # Σ per-sample gains of the own models over the trained ones, since the start
    square: float = 0.0  # Σ of their squares
    switched: int | None = None  # the round whose reports made the federation switch to the mix

    @property
    def from_consensus(self) -> bool:
        """Whether sampled clients train from the consensus (in the next train instructions)."""
        return self.mode == "consensus" or (self.mode == "federation" and self.switched is None)

    @property
    def statistic(self) -> float | None:
        """The pooled gains in standard errors (None before any report)."""
        return self.gain / math.sqrt(self.square) if self.square > 0.0 else None

    def pool(self, server_round: int, reports: Sequence[tuple[float, float]], margin: float) -> None:
        """Add a round's reports (gain, square) and, in `federation` mode, switch to the mix once the
        sum is `margin` standard errors above zero (`clearly_better`); the switch is final."""
        for gain, square in reports:
            if math.isfinite(gain) and math.isfinite(square) and square >= 0.0:
                self.gain += float(gain)
                self.square += float(square)
        if (self.mode == "federation" and self.switched is None
                and clearly_better(self.gain, self.square, margin)):
            self.switched = server_round
