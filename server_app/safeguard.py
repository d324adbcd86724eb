"""The server half of the per-client safeguard (client_app/safeguard.py), as one run callback.

For a method that declares it (`Method.safeguard`) with the run config's `safeguard` on, every train
and evaluate request carries a `safeguard` record (`SafeguardInstructions`: `holdout`, `grid`).
While the strategy hands every client the federation's consensus (`HandsOutConsensus`) and
`safeguard-margin` > 0, the record also carries the `margin`, the federation's pooled `weight` (from
the gains the clients reported at the last evaluation, `federation_weight`), `train-consensus` while
sampled clients train from the consensus (`StartEvidence`, run config `safeguard-start`) and, with
`safeguard-send-slice`, what the consensus averaged (`consensus_mass`), and with
`safeguard-finetune = "federation"` `finetune`: whether the clients' fine-tuned answers have
scored better than their mixes on their slices, pooled since the start (`PooledGains`). Round
records get the clients' choices (`safeguard-own`, `safeguard-mixed`, `safeguard-finetuned`), the
pooled `safeguard-weight`, where the start is decided `safeguard-start` /
`safeguard-start-evidence`, and where the answer is `safeguard-finetune-evidence` (the pooled
fine-tuning gains in standard errors). The pooled weight, the start evidence and the fine-tuning
evidence are this component's checkpointed state.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
from flwr.app import ConfigRecord

from server_app.callbacks import Replies, RunCallback
from strategies.shared.evidence import (SAFEGUARD, PooledGains, SafeguardEvaluateReply,
                                        SafeguardInstructions, SafeguardTrainReply, StartEvidence,
                                        federation_weight, grid)
from strategies.shared.registry import METHODS
from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")


@runtime_checkable
class HandsOutConsensus(Protocol):
    """A strategy that may hand every client the same model, the federation's consensus."""

    def hands_out_consensus(self) -> bool:
        """Whether every client now receives the consensus (False: each its own aggregate)."""

    def consensus_mass(self) -> tuple[int, float, list[int]] | None:
        """(round, Σ n_j, the clients j) where the consensus is the n-weighted mean of the models
        those clients trained in that round, so each of them can take its own update out of it;
        None otherwise."""


class Safeguard(RunCallback):
    """Instructions, pooled evidence and round fields of the safeguard (module doc)."""

    state_name = "safeguard"

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.on = cfg.safeguard != "off" and METHODS[cfg.method].safeguard
        # the federation's weight, pooled from the last evaluation's reported gains (None: no client
        # reported any)
        self.weight: float | None = None
        # where sampled clients train from, and the held-out gains of their own models over the
        # models they trained from the consensus, pooled since the start, with their squares
        self.start = StartEvidence(cfg.safeguard_start)
        # the held-out gains of the clients' fine-tuned answers over their mixes, pooled since the
        # start (with `safeguard-finetune` = "federation")
        self.tuned = PooledGains()

    def consensus(self) -> bool:
        """Whether the strategy hands every client the federation's consensus, with a margin: the
        case of the federation's weight and start."""
        strategy = self.run.strategy
        return (self.on and self.cfg.safeguard_margin > 0.0
                and isinstance(strategy, HandsOutConsensus) and strategy.hands_out_consensus())

    def instructions(self) -> SafeguardInstructions | None:
        """The `safeguard` record of the next requests (None: the safeguard is off)."""
        cfg = self.cfg
        if not self.on:
            return None
        fields: dict[str, Any] = {"holdout": cfg.safeguard_holdout, "grid": cfg.safeguard_grid}
        if cfg.safeguard_batches == "slice-free":
            fields["batches"] = cfg.safeguard_batches
        if self.consensus():
            fields["margin"] = cfg.safeguard_margin
            if self.weight is not None:
                fields["weight"] = self.weight
            if self.start.from_consensus:
                fields["train_consensus"] = True
            if cfg.safeguard_finetune == "federation":
                fields["finetune"] = self.finetune()
            if cfg.safeguard_send_slice:
                fields["send_slice"] = True
                mass = self.run.strategy.consensus_mass()
                if mass is not None:
                    (fields["consensus_round"], fields["consensus_examples"],
                     fields["consensus_clients"]) = mass
        # where a sampled client trains from its chosen mix: from its own model unless that mix is
        # clearly better on its slice
        if cfg.safeguard_own_start and cfg.safeguard_margin > 0 and "train_consensus" not in fields:
            fields["own_start"] = cfg.safeguard_margin
        return SafeguardInstructions(**fields)

    def finetune(self) -> bool:
        """Whether the clients' fine-tuned answers have scored better than their mixes on their
        held-out slices, pooled over every report since the start (with `safeguard-finetune` =
        "federation"). The federation takes whichever of the two answers its evidence favours, as
        neither is the federation's own model (FedAvg answers with the one, FedAvg + fine-tuning
        with the other); a client leaves that answer only on clear evidence of its own
        (`safeguard-margin`, client_app/safeguard.py's `prefers_finetuned`)."""
        return self.tuned.gain > 0.0

    def request_records(self, kind: str, server_round: int) -> Mapping[str, ConfigRecord]:
        instructions = self.instructions()
        return {} if instructions is None else {SAFEGUARD: instructions.config()}

    def train_replies(self, server_round: int, replies: Replies) -> dict[str, Any]:
        """Pool the train replies' held-out gains of the clients' own models over the models they
        trained from the consensus (`StartEvidence`); `safeguard-start` (1: this round's sampled
        clients trained from the consensus, 0: from their mixes) and `safeguard-start-evidence` (the
        pooled gains since the start in standard errors), where the case applies."""
        if not self.consensus():
            return {}
        reports = [(r.start_gain, r.start_square) for _, reply in replies
                   if SAFEGUARD in reply.content
                   for r in (SafeguardTrainReply.read(reply.content[SAFEGUARD]),)]
        start = self.start
        from_consensus, switched = start.from_consensus, start.switched  # this round's instructions
        start.pool(server_round, reports, self.cfg.safeguard_margin)
        if start.switched is not None and switched is None:
            log.info("round %d: the clients' own models are clearly better on their held-out slices "
                     "than the models they trained from the consensus (%.2f standard errors); "
                     "sampled clients train from their mixes from round %d on",
                     server_round, start.pooled.statistic, server_round + 1)
        return {"safeguard-start": 1.0 if from_consensus else 0.0,
                "safeguard-start-evidence": start.pooled.statistic}

    def evaluate_replies(self, server_round: int, replies: Replies) -> dict[str, Any]:
        """The clients' choices (mean weight of their own models and how many mixed; how many
        answered with their fine-tuned model) and the federation's weight pooled from the gains
        they reported, for the next instructions."""
        rows = [SafeguardEvaluateReply.read(reply.content[SAFEGUARD]) for _, reply in replies
                if SAFEGUARD in reply.content]
        fields: dict[str, Any] = {}
        if rows:
            own = [r.own for r in rows]
            fields["safeguard-own"] = float(np.mean(own))
            fields["safeguard-mixed"] = sum(0.0 < w for w in own)
        tuned = [r.finetuned for r in rows if r.finetuned is not None]
        if tuned:
            fields["safeguard-finetuned"] = int(sum(tuned))
        if self.pool(rows):
            fields["safeguard-weight"] = self.weight
        reports = [(r.tuned_gain, r.tuned_square) for r in rows
                   if r.tuned_gain is not None and r.tuned_square is not None]
        if reports and self.cfg.safeguard_finetune == "federation":
            self.tuned.add(reports)
            fields["safeguard-finetune-evidence"] = self.tuned.statistic
        return fields

    def pool(self, rows: list[SafeguardEvaluateReply]) -> bool:
        """Pool the held-out gains that clients reported (with a margin) into the federation's
        weight for the next instructions; False when none reported any."""
        size = self.cfg.safeguard_grid - 1
        reports = [(r.gains, r.squares) for r in rows
                   if r.gains is not None and r.squares is not None
                   and len(r.gains) == len(r.squares) == size]
        if not reports:
            return False
        self.weight = federation_weight(reports, grid(self.cfg.safeguard_grid)[:-1],
                                        self.cfg.safeguard_margin)
        return True

    def state(self) -> dict[str, Any]:
        return {"weight": self.weight, "start": self.start, "tuned": self.tuned}

    def restore(self, state: dict[str, Any]) -> None:
        self.weight, self.start = state["weight"], state["start"]
        # (a checkpoint written before the fine-tuning evidence was pooled has none)
        self.tuned = state.get("tuned") or PooledGains()
