"""The method registry: method name → a builder of its strategy from the run config.

Adding a method = one entry here (plus its server and client modules); `RunConfig` validates the
`method` key against `METHOD_NAMES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flwr.serverapp.strategy import Strategy

from strategies.ditto import Ditto
from strategies.fedavg import build_fedavg, build_fedprox, train_clients_only
from strategies.fedcg import build_fedcg
from strategies.fedsem import FedSEM
from strategies.fedska import build_fedska
from strategies.fedu import build_fedu
from strategies.flt import build_flt
from strategies.clustered import seeded_models
from strategies.ifca import IFCA
from strategies.local import Local
from strategies.partial import FedPer, LGFedAvg
from strategies.sfl import build_sfl

if TYPE_CHECKING:
    from server_app.config import RunConfig

StrategyBuilder = Callable[["RunConfig"], Strategy]

BUILDERS: dict[str, StrategyBuilder] = {
    "fedavg": lambda cfg: train_clients_only(
        build_fedavg(cfg.fraction_train, cfg.aggregation, cfg.trim_fraction), cfg.data_spec.partition),
    "fedprox": lambda cfg: train_clients_only(
        build_fedprox(cfg.fraction_train, cfg.fedprox.mu, cfg.aggregation, cfg.trim_fraction),
        cfg.data_spec.partition),
    "local": lambda cfg: Local(cfg.num_clients, cfg.fraction_train),
    "ditto": lambda cfg: Ditto(
        cfg.num_clients, cfg.fraction_train, cfg.ditto.lambda_, cfg.ditto.personal_epochs
    ),
    "ifca": lambda cfg: IFCA(
        cfg.num_clients, cfg.fraction_train, cfg.ifca.clusters,
        seeded_models(cfg.model, cfg.dataset, cfg.seed),
    ),
    "fedsem": lambda cfg: FedSEM(
        cfg.num_clients, cfg.fraction_train, cfg.fedsem.clusters, cfg.seed
    ),
    "flt": build_flt,
    "fedper": lambda cfg: FedPer(cfg.num_clients, cfg.fraction_train),
    "lg-fedavg": lambda cfg: LGFedAvg(cfg.num_clients, cfg.fraction_train),
    "sfl": lambda cfg: build_sfl(cfg, learn=False),
    "sfl-star": lambda cfg: build_sfl(cfg, learn=True),  # SFL*
    "fedcg": build_fedcg,
    "fedska": build_fedska,
    "fedu": build_fedu,
}
METHOD_NAMES: tuple[str, ...] = tuple(BUILDERS)


# Methods whose global part can be aggregated robustly (`aggregation`); the others aggregate over a
# graph or clusters, where a coordinate-wise median of all clients has no meaning.
ROBUST_METHODS: tuple[str, ...] = ("fedavg", "fedprox", "ditto", "fedper", "lg-fedavg")


def build_strategy(cfg: RunConfig) -> Strategy:
    strategy = BUILDERS[cfg.method](cfg)
    if cfg.method in ROBUST_METHODS and hasattr(strategy, "global_mean"):
        strategy.aggregation = cfg.aggregation
        strategy.trim_fraction = cfg.trim_fraction
    return strategy
