"""The safeguard's evidence, shared by clients and server: is a mix of a client's own model with the
model it received better than a reference, beyond the noise of a small held-out slice?

A client scores each mixing weight a of its grid on its held-out slice and sums, per a, the
per-sample gains over the reference mix (+1 / −1 where only one of the two is right; regression: the
error reduction) and their squares. `clearly_better` tests one such sum; `federation_weight` pools
the sums that the clients of a federation report and picks the weight that is clearly better for the
federation as a whole, which a single client's few dozen samples cannot show. `PooledGains` sums such
reports since the start: `StartEvidence` pools how much better the clients' own models are than the
models they trained from the federation's consensus, and decides where their training starts; the
server pools, in the same way, how much better the clients' fine-tuned answers are than their mixes
(`finetune` in the instructions).

The safeguard's part of a message is one ConfigRecord, `safeguard` (`SAFEGUARD`), beside the
message's `config` / `metrics`: `SafeguardInstructions` in train and evaluate requests (present only
when the run turns the safeguard on for a method that declares it), `SafeguardTrainReply` /
`SafeguardEvaluateReply` in the replies. The shared message formats know nothing of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from pydantic import Field

from strategies.shared.settings import Record

SAFEGUARD = "safeguard"  # the ConfigRecord of a request / reply that holds the safeguard's part


class SafeguardInstructions(Record):
    """The `safeguard` record of train and evaluate requests (client_app/safeguard.py)."""

    # the held-out share of the train split and the grid of mixing weights
    holdout: float = Field(gt=0.0, lt=1.0)
    grid: int = Field(ge=2)
    # the margin a mix needs over a consensus model, in standard errors; absent: any gain; and the
    # federation's pooled weight to use unless a client's own evidence is clear (absent: 1)
    margin: float | None = Field(None, ge=0.0)
    weight: float | None = Field(None, ge=0.0, le=1.0)
    # "slice-free": a local update batches the part outside the slice (absent: it batches the whole
    # train split and leaves the held-out samples out of each batch)
    batches: str | None = Field(None, pattern="^slice-free$")
    # there, whether the model a client sends is trained on its held-out slice too, and which round's
    # aggregate the consensus is, the examples it averaged (Σ n_j) and whose models it holds, so that
    # a client whose update it holds can score with it less that update
    send_slice: bool | None = None
    # there, whether a sampled client trains from the consensus itself (FedAvg's start) rather than
    # from its chosen mix, keeping as its own model the better on its slice of the two, and reports
    # how much better its own model was than the trained one (`SafeguardTrainReply`)
    train_consensus: bool | None = None
    # on any path, where a sampled client trains from its chosen mix (not from the consensus): the
    # margin in standard errors by which that mix must beat the client's own model on its slice for
    # training to start from the mix rather than from the own model (absent: from the mix)
    own_start: float | None = Field(None, gt=0.0)
    # with a margin and run config `safeguard-finetune` = "federation": the federation's answer,
    # true where the clients' fine-tuned answers have scored better than their mixes on their
    # slices, pooled since the start; a client answers with it unless the other model is `margin`
    # standard errors better on its slice, and reports its fine-tuned model's gains over its mix.
    # Absent: each client answers with its mix unless the fine-tuned model is that much better
    finetune: bool | None = None
    consensus_round: int | None = Field(None, ge=1)
    consensus_examples: float | None = Field(None, gt=0.0)
    consensus_clients: list[int] | None = None


class SafeguardTrainReply(Record):
    """The `safeguard` record of a train reply, with `train-consensus`: the summed held-out gains of
    the client's own model over the model it trained from the consensus, and their squares."""

    start_gain: float
    start_square: float = Field(ge=0.0)


class SafeguardEvaluateReply(Record):
    """The `safeguard` record of an evaluate reply: the own model's weight in the mix used, whether
    the client answers with the fine-tuned mix (1: its held-out slice preferred it), and with a
    margin, per grid weight a < 1, the summed held-out gains of the mix over the received model and
    their squares, for the server to pool (`federation_weight`), and where the request carried the
    federation's `finetune`, the summed held-out gains of the fine-tuned mix over the mix and their
    squares (`tuned_gain`, `tuned_square`)."""

    own: float = Field(ge=0.0, le=1.0)
    finetuned: float | None = Field(None, ge=0.0, le=1.0)
    gains: list[float] | None = None
    squares: list[float] | None = None
    tuned_gain: float | None = None
    tuned_square: float | None = Field(None, ge=0.0)


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
class PooledGains:
    """Per-sample held-out gains of one model over another that clients report, summed since the
    start (`add`), with their squares."""

    gain: float = 0.0  # Σ per-sample gains since the start
    square: float = 0.0  # Σ of their squares

    @property
    def statistic(self) -> float | None:
        """The pooled gains in standard errors (None before any report)."""
        return self.gain / math.sqrt(self.square) if self.square > 0.0 else None

    def add(self, reports: Sequence[tuple[float, float]]) -> None:
        """Add reports (gain, square), skipping any that is not finite or has a negative square."""
        for gain, square in reports:
            if math.isfinite(gain) and math.isfinite(square) and square >= 0.0:
                self.gain += float(gain)
                self.square += float(square)

    def clearly_better(self, margin: float) -> bool:
        """Whether the pooled gains are `margin` standard errors above zero (`clearly_better`)."""
        return clearly_better(self.gain, self.square, margin)


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
    # the held-out gains of the own models over the trained ones, pooled since the start
    pooled: PooledGains = field(default_factory=PooledGains)
    switched: int | None = None  # the round whose reports made the federation switch to the mix

    def __setstate__(self, state: dict) -> None:
        """Unpickle, also a checkpoint written before the pooled gains were a `PooledGains`."""
        if "pooled" not in state:
            state = {"mode": state["mode"], "switched": state.get("switched"),
                     "pooled": PooledGains(state.get("gain", 0.0), state.get("square", 0.0))}
        self.__dict__.update(state)

    @property
    def from_consensus(self) -> bool:
        """Whether sampled clients train from the consensus (in the next train instructions)."""
        return self.mode == "consensus" or (self.mode == "federation" and self.switched is None)

    def pool(self, server_round: int, reports: Sequence[tuple[float, float]], margin: float) -> None:
        """Add a round's reports (gain, square) and, in `federation` mode, switch to the mix once the
        sum is `margin` standard errors above zero (`clearly_better`); the switch is final."""
        self.pooled.add(reports)
        if self.mode == "federation" and self.switched is None and self.pooled.clearly_better(margin):
            self.switched = server_round
