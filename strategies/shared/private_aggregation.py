"""Client-level differential privacy's aggregation (`dp = 'client'`, strategies/shared/privacy.py):
a wrapper of a FedAvg-type strategy that clips each client's update and noises each aggregate. Only
the server imports it."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flwr.serverapp.strategy import Strategy

from strategies.shared.privacy import Entry, epsilon

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
    from flwr.serverapp import Grid

    from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")


def wrap(cfg: RunConfig, strategy: Strategy) -> Strategy:
    """`strategy`, wrapped for client-level DP when the run config asks for it."""
    if cfg.dp != "client":
        return strategy
    from strategies.shared.personalized import PersonalizedStrategy

    if isinstance(strategy, PersonalizedStrategy):
        from strategies.shared.settings import ConfigError

        raise ConfigError(f"run config: dp = 'client' with method '{cfg.method}': its per-client "
                          "aggregates are not noised yet; set dp='off'")
    sampled = max(int(cfg.fraction_train * cfg.num_clients), 1)
    return ClientLevelDP(strategy, noise_multiplier=cfg.dp_noise_multiplier,
                         clip_norm=cfg.dp_clip_norm, delta=cfg.dp_delta,
                         target_epsilon=cfg.dp_target_epsilon, num_clients=cfg.num_clients,
                         num_sampled=sampled, seed=cfg.seed)


NOISE_STREAM = 29  # keeps the aggregate noise's seeds apart from other seeded draws


def _seed(*parts: int) -> int:
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + int(part)) % (2**63 - 1)
    return seed


class ClientLevelDP(Strategy):
    """DP-FedAvg (McMahan et al., 2018) around a FedAvg-type strategy: θ ← θ + (Σ_k clip(θ_k − θ, C)
    + N(0, σ²C² I)) / m, with m the clients sampled per round (equal weights; a missing reply counts
    as a zero update), C = `clip_norm`, σ = `noise_multiplier`. Each aggregate is one step of the
    accountant at sampling rate m / num_clients. With a target ε, a round whose aggregate would take
    ε above it sends no training (the model stays as it is). The noise is drawn from a generator
    seeded by (seed, round)."""

    def __init__(self, strategy: Strategy, *, noise_multiplier: float, clip_norm: float,
                 delta: float, target_epsilon: float, num_clients: int, num_sampled: int,
                 seed: int) -> None:
        super().__init__()
        self.strategy = strategy
        self.noise_multiplier = noise_multiplier
        self.clip_norm = clip_norm
        self.delta = delta
        self.target_epsilon = target_epsilon
        self.num_sampled = num_sampled
        self.sample_rate = num_sampled / num_clients
        self.seed = seed
        self.releases = 0  # aggregates released so far (accountant steps)
        self.stopped_at: int | None = None  # the first round the budget stopped
        self.sent: Any = None  # the arrays of the current round's training

    def __getattr__(self, name: str) -> Any:  # the wrapped strategy's other attributes
        if name.startswith("__") or name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def history(self, releases: int | None = None) -> list[Entry]:
        count = self.releases if releases is None else releases
        return [(self.noise_multiplier, self.sample_rate, count)] if count else []

    def epsilon(self) -> float:
        return epsilon(self.history(), self.delta)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if self.target_epsilon > 0 and epsilon(self.history(self.releases + 1),
                                               self.delta) > self.target_epsilon:
            if self.stopped_at is None:
                self.stopped_at = server_round
                log.info("round %d: client-level DP budget spent (ε = %.3f of dp-target-epsilon = "
                         "%g); no more training", server_round, self.epsilon(), self.target_epsilon)
            return []
        self.sent = arrays
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        import numpy as np
        import torch
        from flwr.app import Array, ArrayRecord

        replies = [r for r in replies if not r.has_error()]
        if not replies or self.sent is None:
            return None, None
        _, metrics = self.strategy.aggregate_train(server_round, replies)
        names = list(self.sent.keys())
        sent = {name: self.sent[name].numpy() for name in names}
        floating = [n for n in names if np.issubdtype(sent[n].dtype, np.floating)]
        total = {n: np.zeros(sent[n].shape, dtype=np.float64) for n in floating}
        for reply in replies:
            record = next(iter(reply.content.array_records.values()))
            update = {n: record[n].numpy().astype(np.float64) - sent[n] for n in floating}
            norm = math.sqrt(sum(float(np.square(u).sum()) for u in update.values()))
            scale = min(1.0, self.clip_norm / (norm + 1e-12))
            for n in floating:
                total[n] += update[n] * scale
        generator = torch.Generator().manual_seed(_seed(self.seed, server_round, NOISE_STREAM))
        std = self.noise_multiplier * self.clip_norm
        out = {}
        for n in names:
            if n not in total:
                out[n] = Array(np.array(sent[n], copy=True))
                continue
            noise = torch.normal(0.0, std, size=sent[n].shape, generator=generator,
                                 dtype=torch.float64).numpy() if sent[n].size else 0.0
            value = sent[n] + (total[n] + noise) / self.num_sampled
            out[n] = Array(value.astype(sent[n].dtype))
        self.releases += 1
        return ArrayRecord(out), metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Any:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.strategy.summary()
