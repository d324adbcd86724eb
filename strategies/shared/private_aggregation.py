"""Client-level differential privacy's aggregation (`dp = 'client'`, strategies/shared/privacy.py).
Only the server imports it.

- `ClientLevelDP`: a wrapper of a FedAvg-type strategy (one average of the sampled clients' models)
  that clips each client's update and noises the aggregate.
- `AggregateNoise` and its layer `PrivateAggregates`: for the methods whose server forms one
  aggregate per client (or per group) as a weighted sum of the clients' models and that opt in
  (`private_aggregates = True` on the strategy class). Under `dp = 'client'` `wrap` puts such a
  strategy under the layer (its class becomes the method's class with `PrivateAggregates` first);
  with dp off nothing here is imported. Each update is clipped against the model the client started
  from (`AggregateNoise.clip`) and every aggregate gets Gaussian noise of std σ·C·(the largest
  weight one client has in it), its sensitivity (`AggregateNoise.noised`). A method hands the layer
  what it needs through narrow hooks that say nothing of DP (`PrivateAggregates` doc), or, where it
  has none yet, calls `private` itself. Its clients' non-model uploads are clipped and noised on the
  client (`upload_instructions`, the client layer `client_app/private_upload.py`). The layer
  accounts every release per client (module `AggregateNoise` doc)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flwr.serverapp.strategy import Strategy

from strategies.shared.privacy import Entry, UploadInstructions, clip_scale, epsilon

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
    from flwr.serverapp import Grid

    from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")


def wrap(cfg: RunConfig, strategy: Strategy) -> Strategy:
    """`strategy`, wrapped for client-level DP when the run config asks for it (`ClientLevelDP`);
    a strategy that forms per-client aggregates gets its `AggregateNoise` layer instead, and one that
    keeps a model per client without opting into it is refused."""
    if cfg.dp != "client":
        return strategy
    if getattr(strategy, "private_aggregates", False):
        return use_private(strategy, AggregateNoise.of(cfg))
    from strategies.shared.personalized import PersonalizedStrategy

    if isinstance(strategy, PersonalizedStrategy):  # one model per client: not one average
        from strategies.shared.settings import ConfigError

        raise ConfigError(f"run config: dp = 'client' with method '{cfg.method}': its strategy keeps "
                          "one model per client and does not opt into per-client aggregate noise "
                          "(private_aggregates); set dp='off'")
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
            scale = clip_scale(norm, self.clip_norm)
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

    # --- what the run records (server_app/privacy.py) ------------------------------------------
    def round_fields(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon(), "delta": self.delta, "aggregates": self.releases}

    def summary_fields(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon(), "aggregates": self.releases,
                "stopped-round": self.stopped_at}


# --- per-client aggregates ----------------------------------------------------------------------
AGGREGATE_STREAM, UPLOAD_STREAM = 31, 37  # keep the layer's noise seeds apart
ROW_BLOCK = 256  # rows of an aggregate matrix noised per draw (no second [N, P] buffer)


class AggregateNoise:
    """Client-level DP of per-client aggregates, and its accountant.

    Clipping: a client's trained model v becomes s + clip(v − s, C), s the model it started from
    (a released aggregate), C = `dp-clip-norm`. Aggregates: an aggregate a_r = Σ_k W_rk·v_k (any
    weights a method forms: a GCN's propagation, a neighbourhood mean, FedAvg's n-weighted mean)
    changes by at most C·W_rk when client k's data go (its update is then 0, as under DP-FedAvg), so
    a_r gets N(0, (σ·C·m_r)² I), m_r = max_k W_rk over the clients whose rows carry their data
    (`sensitive`), σ = `dp-noise-multiplier`. Uploads: each noised upload record (clipped to
    `dp-upload-clip-norm` C_u on the client, std σ_u·C_u, σ_u = `dp-upload-noise-multiplier`) is one
    Gaussian mechanism of noise multiplier σ_u on that client's data.

    Accounting: every release is a Gaussian mechanism counted without subsampling (stale rows enter
    every round's aggregates, and no method draws its clients by Poisson sampling), and Gaussian
    mechanisms at sampling rate 1 compose exactly into one Gaussian: Rényi DP of order α adds up to
    α·ρ_k/2 with ρ_k = Σ_mechanisms (sensitivity to k / std)² = Σ_r (W_rk/m_r)²/σ² + (its other
    releases, e.g. a learner's noised copy)/σ² + (its uploads)/σ_u². The
    client's ε at δ is Opacus' RDP accountant's for one Gaussian step of noise multiplier 1/√ρ_k
    (`epsilon`), and the run's ε is the largest client's: it bounds what everything the server sends
    out, together, reveals about any one client. With a target ε a round starts only if a round
    costing what the last did keeps ε within it, and a round's aggregates are withheld (the models
    stay as they are) when they would take ε past it; training then stops."""

    def __init__(self, *, noise_multiplier: float, clip_norm: float, upload_noise_multiplier: float,
                 upload_clip_norm: float, delta: float, target_epsilon: float, num_clients: int,
                 seed: int) -> None:
        import torch

        self.noise_multiplier = noise_multiplier
        self.clip_norm = clip_norm
        self.upload_noise_multiplier = upload_noise_multiplier
        self.upload_clip_norm = upload_clip_norm
        self.delta = delta
        self.target_epsilon = target_epsilon
        self.seed = seed
        self.rho = torch.zeros(num_clients, dtype=torch.float64)  # Σ (sensitivity / std)² per client
        self.rho_uploads = torch.zeros_like(self.rho)  # the part of ρ from noised uploads
        self.aggregates = 0  # noised aggregates released
        self.uploads = 0  # noised upload records received
        self.stopped_at: int | None = None  # the first round the budget stopped
        self.draws = 0  # noise draws so far (each gets its own seed)
        self._round_start = self.rho.clone()
        self._last = torch.zeros_like(self.rho)  # the last round's ρ increment per client
        self._started = False  # a round has started
        self.round = 0  # the last round that started training

    @classmethod
    def of(cls, cfg: RunConfig) -> AggregateNoise:
        return cls(noise_multiplier=cfg.dp_noise_multiplier, clip_norm=cfg.dp_clip_norm,
                   upload_noise_multiplier=cfg.dp_upload_noise_multiplier,
                   upload_clip_norm=cfg.dp_upload_clip_norm, delta=cfg.dp_delta,
                   target_epsilon=cfg.dp_target_epsilon, num_clients=cfg.num_clients,
                   seed=cfg.seed)

    # --- accounting -----------------------------------------------------------------------------
    def epsilon_of(self, rho: float) -> float:
        """ε at δ of Gaussian mechanisms (rate 1) whose (sensitivity / std)² sum to `rho`."""
        return epsilon([(1.0 / math.sqrt(rho), 1.0, 1)], self.delta) if rho > 0 else 0.0

    def epsilon(self) -> float:
        """The largest client's ε so far."""
        return self.epsilon_of(float(self.rho.max()))

    def epsilons(self) -> list[float]:
        """Every client's ε so far (the accountant asked once per distinct ρ)."""
        values = [float(r) for r in self.rho]
        known = {rho: self.epsilon_of(rho) for rho in set(values)}
        return [known[rho] for rho in values]

    def affordable(self, extra: Any) -> bool:
        """Whether ρ + `extra` keeps every client within the target (always, without one)."""
        return self.target_epsilon <= 0 or self.epsilon_of(
            float((self.rho + extra).max())) <= self.target_epsilon

    def begin_round(self, server_round: int) -> bool:
        """A round starts (True) unless one costing what the last did (all its phases, from one
        start to the next) would take ε past the target."""
        if self._started:
            self._last = self.rho - self._round_start
        if self.stopped_at is None and not self.affordable(self._last):
            self.stop(server_round)
        if self.stopped_at is not None:
            return False
        self._round_start, self._started, self.round = self.rho.clone(), True, server_round
        return True

    def stop(self, server_round: int) -> None:
        if self.stopped_at is None:
            self.stopped_at = server_round
            log.info("round %d: client-level DP budget spent (ε = %.3f of dp-target-epsilon = %g); "
                     "no more training", server_round, self.epsilon(), self.target_epsilon)

    def charge_uploads(self, clients: Iterable[int], records: int = 1) -> None:
        """Charge `records` noised upload records received from each of `clients`."""
        for client in clients:
            self.rho[client] += records / self.upload_noise_multiplier ** 2
            self.rho_uploads[client] += records / self.upload_noise_multiplier ** 2
            self.uploads += records

    # --- clipping and noise -----------------------------------------------------------------------
    def clip(self, row: Any, start: Any) -> Any:
        """start + clip(row − start, C), in `row`'s dtype (float64 arithmetic)."""
        import torch

        update = row.to(torch.float64) - start.to(torch.float64)
        scale = clip_scale(float(update.norm()), self.clip_norm)
        return (start.to(torch.float64) + update * scale).to(row.dtype)

    def cost(self, weights: Any, sensitive: Any) -> tuple[Any, Any]:
        """(std [R] of each aggregate's noise, ρ increment [N] per client) of aggregates with
        `weights` [R, N] over the clients, `sensitive` [N] the clients whose rows carry their data
        (the others' rows are earlier releases or the initial model: no sensitivity)."""
        import torch

        w = torch.as_tensor(weights, dtype=torch.float64).abs()
        w = w * torch.as_tensor(sensitive, dtype=torch.bool).to(torch.float64)[None, :]
        largest = w.max(dim=1).values if w.numel() else torch.zeros(w.shape[0], dtype=torch.float64)
        ratio = torch.where(largest[:, None] > 0, w / largest.clamp_min(1e-300)[:, None],
                            torch.zeros_like(w))
        return (self.noise_multiplier * self.clip_norm * largest,
                (ratio ** 2).sum(dim=0) / self.noise_multiplier ** 2)

    def noised(self, server_round: int, rows: Any, weights: Any, sensitive: Any,
               charge: bool = True) -> bool:
        """Add each aggregate's noise to `rows` [R, P] in place (`cost`) and charge it; False (rows
        untouched, training stopped) when the target does not allow it. `charge=False`: the cost
        was charged with `afford` already."""
        import torch

        std, extra = self.cost(weights, sensitive)
        if charge and not self.afford(server_round, extra):
            return False
        generator = torch.Generator().manual_seed(self.next_seed(AGGREGATE_STREAM))
        for first in range(0, rows.shape[0], ROW_BLOCK):
            block = rows[first:first + ROW_BLOCK]
            noise = torch.randn(block.shape, generator=generator, dtype=torch.float64)
            block += (noise * std[first:first + ROW_BLOCK, None]).to(block.dtype)
        self.aggregates += int((std > 0).sum())
        return True

    def afford(self, server_round: int, extra: Any) -> bool:
        """Charge `extra` [N] if the target allows it (True); else stop training (False)."""
        if not self.affordable(extra):
            self.stop(server_round)
            return False
        self.rho += extra
        return True

    def next_seed(self, stream: int) -> int:
        self.draws += 1
        return _seed(self.seed, stream, self.draws)

    def upload_instructions(self, records: list[str]) -> Any:
        """The `dp-upload` record of a request whose reply carries the non-model `records`."""
        return UploadInstructions(noise_multiplier=self.upload_noise_multiplier,
                                  clip_norm=self.upload_clip_norm, records=records,
                                  seed=self.next_seed(UPLOAD_STREAM)).config()

    # --- what the run records (server_app/privacy.py) ------------------------------------------
    def epsilon_uploads(self) -> float:
        """The largest client's ε of its noised uploads alone (noised on the client, so this much
        holds for them against the server too)."""
        return self.epsilon_of(float(self.rho_uploads.max()))

    def round_fields(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon(), "delta": self.delta, "aggregates": self.aggregates,
                "uploads": self.uploads, "epsilon-uploads": self.epsilon_uploads(),
                "epsilon-per-client": self.epsilons()}

    def summary_fields(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon(), "aggregates": self.aggregates, "uploads": self.uploads,
                "epsilon-uploads": self.epsilon_uploads(),
                "upload-noise-multiplier": self.upload_noise_multiplier,
                "stopped-round": self.stopped_at}

    def client_epsilons(self) -> dict[int, float]:
        return dict(enumerate(self.epsilons()))


FEATURE_STREAM = 41  # the seeds of the noised rows a learned graph measures


class Withheld(Exception):
    """The target does not allow a release of this round: the method's step stops where it is
    (its aggregates and models stay as they were)."""


class PrivateAggregates:
    """The per-client aggregate layer: `use_private` gives a strategy the class `layered_class`,
    its method class with these methods over it (each calls the method class's own). `private` is
    its `AggregateNoise`. A round starts only when the
    layer allows it (`begin_round`). The method's hooks it takes, where the method has them:

    - `start_of(client)`: the model the client started from; each trained model is clipped against
      it before the method absorbs it.
    - `aggregates(server_round)`: the round's per-client aggregates, an object whose `apply(rows,
      out=)` forms them and whose `operator` [R, N] holds their weights over the rows; each
      aggregate gets its noise before the method reads it (the rows of clients that have trained
      are the sensitive ones).
    - `measured()` and `learner_features(rows)`: the rows a learned graph measures distances between;
      each client's row is released once, noised with N(0, (σ·C)²), when it trains (its sensitivity
      is C: a clipped row or update), one Gaussian mechanism charged to it; rows of earlier rounds
      are kept (released already), so the graph depends on released values only.

    When a release would take ε past the target, the method's `after_train` stops there
    (`Withheld`)."""

    private: AggregateNoise
    method_class: type  # the method's own strategy class (set on the layered class)

    def __reduce_ex__(self, protocol: Any) -> Any:  # checkpoints: rebuilt as the layered class
        return _layered_instance, (self.method_class,), self.__getstate__()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if not self.private.begin_round(server_round):
            return []
        return self.method_class.configure_train(self, server_round, arrays, config, grid)

    def absorb(self, client: int, content: Any) -> None:
        start_of = getattr(self, "start_of", None)
        if start_of is not None:  # the model it started from + clip(its update, C)
            from flwr.app import RecordDict

            from strategies.shared.messages import MODEL

            layout = self.layout  # type: ignore[attr-defined]
            row = self.private.clip(layout.row(content[MODEL]), start_of(client))
            content = RecordDict({**dict(content.items()), MODEL: layout.arrays(row)})
            self.private_trained.append(client)
        self.method_class.absorb(self, client, content)

    def after_train(self, server_round: int) -> Any:
        self.private_round, self.private_released = server_round, self.private_trained
        self.private_trained = []
        try:
            return self.method_class.after_train(self, server_round)
        except Withheld:  # the budget is spent: the aggregates stay as they are
            return None

    def aggregates(self, server_round: int) -> Any:
        return NoisedAggregates(self.method_class.aggregates(self, server_round),
                                self.private, server_round,
                                self.last_trained >= 0)  # type: ignore[attr-defined]

    def learner_features(self, rows: Any = None) -> Any:
        import torch

        private, source = self.private, self.measured()  # type: ignore[attr-defined]
        if self.private_rows is None:
            self.private_rows = self.matrix_storage.copy(source)  # type: ignore[attr-defined]
        clients = sorted(set(self.private_released))
        extra = torch.zeros(self.num_clients, dtype=torch.float64)  # type: ignore[attr-defined]
        extra[clients] = 1.0 / private.noise_multiplier ** 2
        if not private.afford(self.private_round, extra):
            raise Withheld
        generator = torch.Generator().manual_seed(private.next_seed(FEATURE_STREAM))
        std = private.noise_multiplier * private.clip_norm
        for client in clients:
            noise = torch.randn(source.shape[1], generator=generator, dtype=torch.float64)
            self.private_rows[client] = (source[client].to(torch.float64)
                                         + std * noise).to(source.dtype)
        return self.method_class.learner_features(self, self.private_rows)


class NoisedAggregates:
    """A method's per-client aggregates (`apply`, `operator`) with each aggregate's noise added
    (`AggregateNoise.noised`), charged before they are formed; `Withheld` when the target does not
    allow them."""

    def __init__(self, plain: Any, private: AggregateNoise, server_round: int,
                 sensitive: Any) -> None:
        self.plain, self.private, self.round, self.sensitive = plain, private, server_round, sensitive

    @property
    def operator(self) -> Any:
        return self.plain.operator

    def apply(self, rows: Any, out: Any = None) -> Any:
        private, weights = self.private, self.plain.operator
        if not private.afford(self.round, private.cost(weights, self.sensitive)[1]):
            raise Withheld
        aggregated = self.plain.apply(rows, out=out)
        private.noised(self.round, aggregated, weights, self.sensitive, charge=False)
        return aggregated


_LAYERED: dict[type, type] = {}


def layered_class(method_class: type) -> type:
    """`method_class` under the layer: a subclass (of the same layout, so an instance's class can be
    swapped) holding `PrivateAggregates`' methods; one per method class."""
    if method_class not in _LAYERED:
        methods = {name: value for name, value in vars(PrivateAggregates).items()
                   if callable(value) and (not name.startswith("__") or name == "__reduce_ex__")}
        _LAYERED[method_class] = type(f"Private{method_class.__name__}", (method_class,),
                                      {**methods, "method_class": method_class,
                                       "__module__": __name__})
    return _LAYERED[method_class]


def _layered_instance(method_class: type) -> Any:
    return object.__new__(layered_class(method_class))


def use_private(strategy: Any, layer: AggregateNoise) -> Any:
    """`strategy` (of a class that sets `private_aggregates`) under the per-client aggregate layer
    `layer`: its class becomes the layered one; returns it."""
    if "method_class" not in vars(type(strategy)):
        strategy.__class__ = layered_class(type(strategy))
    strategy.private = layer
    strategy.private_trained, strategy.private_released, strategy.private_round = [], [], 0
    strategy.private_rows = None
    return strategy


def accountant(strategy: Any) -> ClientLevelDP | AggregateNoise | None:
    """The client-level accountant of a run's strategy (None: it runs without one)."""
    if isinstance(strategy, ClientLevelDP):
        return strategy
    return getattr(strategy, "private", None)
