"""The method registry: one `Method` entry per method name: how to build its strategy, which run-config
section holds its settings, and which client handlers answer its messages.

Adding a method = its settings (a `MethodSettings` subclass, usually in `strategies/contracts/`), its
server module, its client module, and one `register(Method(...))` (see the README, "Add a method").
`RunConfig` reads its sections from here and validates `method` against the registered names. Builders
import their strategy module when called, and client handlers are named as `module:function` and
imported when first used, so importing the registry (as every client does to validate its run config)
stays cheap and pulls in no server-side dependency (scipy, scikit-learn, numba, umap).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from strategies.contracts.base import MethodSettings
from strategies.contracts.ditto import DittoSection
from strategies.contracts.fedcg import FedCGSection
from strategies.contracts.fedprox import FedProxSection
from strategies.contracts.fedsem import FedSEMSection
from strategies.contracts.fedska import FedSKASection
from strategies.contracts.fedu import FedUSection
from strategies.contracts.flt import FLTSection
from strategies.contracts.ifca import IFCASection
from strategies.contracts.sfl import SFLSection

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.contracts.run import RunConfig

StrategyBuilder = Callable[["RunConfig"], "Strategy"]
# A client handler: a callable (message, context) -> message, or "module:function" imported on use.
ClientHandler = Callable[..., Any] | str


@dataclass(frozen=True)
class Method:
    """One registered method.

    `section`: the run-config section of its settings (`<section>.<key>`; several methods may share
    one, e.g. `sfl` for sfl and sfl-star) with `settings` its model. `client`: the handlers of the
    message types only this method sends (`train.<action>`, `query.<action>`, `evaluate.<action>`);
    the generic `train` / `evaluate` handlers serve every method. `limits`: fields of the section that
    count clients, each with what it counts: `"clients"` (at most num-clients, e.g. clusters) or
    `"other-clients"` (at most num-clients − 1, e.g. a client's neighbours). `robust`: its global part may use
    `aggregation` = median / trimmed-mean.
    """

    name: str
    build: StrategyBuilder
    section: str | None = None
    settings: type[MethodSettings] | None = None
    client: Mapping[str, ClientHandler] = field(default_factory=dict)
    limits: Mapping[str, Literal["clients", "other-clients"]] = field(default_factory=dict)
    robust: bool = False


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add (or replace) a method; its settings section becomes part of every `RunConfig`."""
    if (method.section is None) != (method.settings is None):
        raise ValueError(f"method {method.name!r}: give both section and settings, or neither")
    for other in METHODS.values():
        if other.section == method.section and other.name != method.name and method.section and \
                other.settings is not method.settings:
            raise ValueError(f"section {method.section!r} already holds {other.settings.__name__} "
                             f"(method {other.name!r})")
    METHODS[method.name] = method
    return method


def sections() -> dict[str, type[MethodSettings]]:
    """Every registered settings section, by name."""
    return {m.section: m.settings for m in METHODS.values() if m.section and m.settings}


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def robust_methods() -> tuple[str, ...]:
    """Methods whose global part can be aggregated robustly (`aggregation`); the others aggregate
    over a graph or clusters, where a coordinate-wise median of all clients has no meaning."""
    return tuple(name for name, m in METHODS.items() if m.robust)


def known_record_names() -> frozenset[str]:
    """Every record name the contracts define: the shared messages' and each registered method's
    contract module's (the module of its settings), for reply validation."""
    from strategies import messages
    from strategies.validation import record_names

    modules = {messages, *(sys.modules[m.settings.__module__] for m in METHODS.values()
                           if m.settings is not None)}
    return frozenset(name for module in modules for name in record_names(module))


def build_strategy(cfg: RunConfig) -> Strategy:
    strategy = METHODS[cfg.method].build(cfg)
    if METHODS[cfg.method].robust and hasattr(strategy, "global_mean"):
        strategy.aggregation = cfg.aggregation
        strategy.trim_fraction = cfg.trim_fraction
    return strategy


# --- the built-in methods -------------------------------------------------------------------------

def _fedavg(cfg: RunConfig) -> Strategy:
    from strategies.fedavg import build_fedavg
    return build_fedavg(cfg.fraction_train, cfg.aggregation, cfg.trim_fraction)


def _fedprox(cfg: RunConfig) -> Strategy:
    from strategies.fedavg import build_fedprox
    return build_fedprox(cfg.fraction_train, cfg.fedprox.mu, cfg.aggregation, cfg.trim_fraction)


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


for _method in (
    Method("fedavg", _fedavg, robust=True),
    Method("fedprox", _fedprox, "fedprox", FedProxSection, robust=True),
    Method("local", _local, client={"train.local": "client_app.local:train"}),
    Method("ditto", _ditto, "ditto", DittoSection, {"train.ditto": "client_app.ditto:train"},
           robust=True),
    Method("ifca", _ifca, "ifca", IFCASection, {"train.ifca": "client_app.ifca:train",
                                                 "evaluate.ifca": "client_app.ifca:evaluate"},
           limits={"clusters": "clients"}),
    Method("fedsem", _fedsem, "fedsem", FedSEMSection, limits={"clusters": "clients"}),
    Method("flt", _flt, "flt", FLTSection, {"train.flt_ae": "client_app.flt:train_autoencoder",
                                            "query.flt_embed": "client_app.flt:embed"},
           limits={"clusters": "clients"}),
    Method("fedper", _fedper, robust=True),
    Method("lg-fedavg", _lg_fedavg, robust=True),
    Method("sfl", _sfl, "sfl", SFLSection, {"train.sfl": "client_app.sfl:train"}),
    Method("sfl-star", _sfl_star, "sfl", SFLSection, {"train.sfl": "client_app.sfl:train"},
           limits={"gl_k": "other-clients"}),
    Method("fedcg", _fedcg, "fedcg", FedCGSection, {
        "train.fedcg": "client_app.fedcg:train", "evaluate.fedcg": "client_app.fedcg:evaluate",
        "query.fedcg_balance": "client_app.fedcg:balance_statistics"}),
    Method("fedska", _fedska, "fedska", FedSKASection, {
        "train.fedska": "client_app.fedska:train", "query.ska_embed": "client_app.fedska:embed",
        "query.ska_grad": "client_app.fedska:slot_gradient"}, limits={"k": "other-clients"}),
    Method("fedu", _fedu, "fedu", FedUSection),
):
    register(_method)
