"""The method registry: method name → a builder of its strategy from the run config.

Adding a method = one entry here (plus its server and client modules); `RunConfig` validates the
`method` key against `METHOD_NAMES`. Each builder imports its strategy module when called, so
importing the registry (as every client does to validate its run config) stays cheap and pulls in no
server-side dependency (scipy, scikit-learn, numba, umap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from server_app.config import RunConfig

StrategyBuilder = Callable[["RunConfig"], "Strategy"]


def _fedavg(cfg: RunConfig) -> Strategy:
    from strategies.fedavg import build_fedavg, train_clients_only
    return train_clients_only(build_fedavg(cfg.fraction_train, cfg.aggregation, cfg.trim_fraction),
                              cfg.data_spec.partition)


def _fedprox(cfg: RunConfig) -> Strategy:
    from strategies.fedavg import build_fedprox, train_clients_only
    return train_clients_only(
        build_fedprox(cfg.fraction_train, cfg.fedprox.mu, cfg.aggregation, cfg.trim_fraction),
        cfg.data_spec.partition)


def _local(cfg: RunConfig) -> Strategy:
    from strategies.local import Local
    return Local(cfg.num_clients, cfg.fraction_train)


def _ditto(cfg: RunConfig) -> Strategy:
    from strategies.ditto import Ditto
    return Ditto(cfg.num_clients, cfg.fraction_train, cfg.ditto.lambda_, cfg.ditto.personal_epochs)


def _ifca(cfg: RunConfig) -> Strategy:
    from strategies.clustered import seeded_models
    from strategies.ifca import IFCA
    return IFCA(cfg.num_clients, cfg.fraction_train, cfg.ifca.clusters,
                seeded_models(cfg.model, cfg.dataset, cfg.seed))


def _fedsem(cfg: RunConfig) -> Strategy:
    from strategies.fedsem import FedSEM
    return FedSEM(cfg.num_clients, cfg.fraction_train, cfg.fedsem.clusters, cfg.seed)


def _flt(cfg: RunConfig) -> Strategy:
    from strategies.flt import build_flt
    return build_flt(cfg)


def _fedper(cfg: RunConfig) -> Strategy:
    from strategies.partial import FedPer
    return FedPer(cfg.num_clients, cfg.fraction_train)


def _lg_fedavg(cfg: RunConfig) -> Strategy:
    from strategies.partial import LGFedAvg
    return LGFedAvg(cfg.num_clients, cfg.fraction_train)


def _sfl(cfg: RunConfig) -> Strategy:
    from strategies.sfl import build_sfl
    return build_sfl(cfg, learn=False)


def _sfl_star(cfg: RunConfig) -> Strategy:  # SFL*
    from strategies.sfl import build_sfl
    return build_sfl(cfg, learn=True)


def _fedcg(cfg: RunConfig) -> Strategy:
    from strategies.fedcg import build_fedcg
    return build_fedcg(cfg)


def _fedska(cfg: RunConfig) -> Strategy:
    from strategies.fedska import build_fedska
    return build_fedska(cfg)


def _fedu(cfg: RunConfig) -> Strategy:
    from strategies.fedu import build_fedu
    return build_fedu(cfg)


BUILDERS: dict[str, StrategyBuilder] = {
    "fedavg": _fedavg,
    "fedprox": _fedprox,
    "local": _local,
    "ditto": _ditto,
    "ifca": _ifca,
    "fedsem": _fedsem,
    "flt": _flt,
    "fedper": _fedper,
    "lg-fedavg": _lg_fedavg,
    "sfl": _sfl,
    "sfl-star": _sfl_star,
    "fedcg": _fedcg,
    "fedska": _fedska,
    "fedu": _fedu,
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
