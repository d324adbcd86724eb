"""`Method`: what a method package declares about itself (its name, how its strategy is built, its
settings section and the client handlers of its own message types). Each package under
`strategies/methods/` declares its entries as `METHODS = (Method(...), ...)` beside its settings (its
`settings.py`; a package without settings, in its `__init__`), and its `__init__` holds them (a
docstring and that one import); the registry (`strategies.shared.registry`) finds them there. The
builder is named as `"module:function"`, so declaring a method imports none of its server code."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from strategies.shared.settings import MethodSettings

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig

# A strategy builder: (run config, where the strategy keeps its per-client matrices) -> the strategy;
# in a declaration, a callable or "module:function" imported when the strategy is first built.
StrategyBuilder = Callable[["RunConfig", "ClientMatrixStorage"], "Strategy"] | str
# A client handler: a callable (message, context) -> message, or "module:function" imported on use.
ClientHandler = Callable[..., Any] | str


@dataclass(frozen=True)
class Method:
    """One registered method.

    `build(cfg, storage)`: its strategy, its per-client matrices (if it keeps any) allocated by
    `storage` (`strategies.shared.client_matrix.ClientMatrixStorage`); a callable, or its name as
    `"module:function"` (the package's server step, imported by `strategy` when first called). `section`: the run-config
    section of its settings (`<section>.<key>`; several methods may share one, e.g. a method and its
    variant) with `settings` its model. `client`: the handlers of the message types only this method
    sends (`train.<action>`, `query.<action>`, `evaluate.<action>`); the generic `train` / `evaluate`
    handlers serve every method. `limits`: fields of the section that count clients, each with what
    it counts: `"clients"` (at most num-clients, e.g. clusters) or `"other-clients"` (at most
    num-clients − 1, e.g. a client's neighbours). `robust`: its global part may use `aggregation` =
    median / trimmed-mean. `summary`: one line for the methods table (`docs/methods.md`);
    `client_step`: the client module its clients run when it declares no handler of its own (e.g.
    the generic `train`). `model_records`: name patterns (`fnmatch`, e.g. `cluster-*`) of the model
    ArrayRecords it sends besides the shared `global` / `personal` / `model`; reply validation
    accepts and checks them as models. `safeguard`: its clients honour the run config's `safeguard`
    (a graph method: each client may mix the received model with its own, `client_app/safeguard.py`).
    `secure_aggregation`: its server needs only the (weighted) sum of the sampled clients' models,
    so it may run under the run config's `secure-aggregation` (strategies/shared/secure_aggregation.py).
    `privacy`: the differential-privacy modes (`dp`) it supports: `sample` where its clients upload
    only what the generic local loop trained (DP-SGD then covers every upload), `client` where its
    server forms one average of the sampled clients' models or its per-client aggregates are linear in
    the clients' models and it opts into the graph layer (strategies/shared/private_aggregation.py).
    `privacy_refused`: why it supports no more modes, named in the error of a run that asks for one.
    `sample_releases`: under `sample`, what one client releases over a whole run besides the generic
    rounds' DP-SGD steps (`num-rounds` × `local-epochs` epochs), as accounting entries (noise
    multiplier, sampling rate, steps): a callable `(cfg, n, noise, upload_noise) -> list[Entry]`
    (n the client's train samples, `noise` the DP-SGD σ, `upload_noise` σ_u of its noised uploads)
    or its `"module:function"`; None: it releases nothing more. A benchmark's noise calibration
    composes them with the DP-SGD steps (benchmarks/compare.py `calibrated_noise`).
    `default`: the run config's `method` when it names none (one registered method says so).
    """

    name: str
    build: StrategyBuilder
    section: str | None = None
    settings: type[MethodSettings] | None = None
    client: Mapping[str, ClientHandler] = field(default_factory=dict)
    limits: Mapping[str, Literal["clients", "other-clients"]] = field(default_factory=dict)
    robust: bool = False
    summary: str = ""
    client_step: str | None = None
    model_records: tuple[str, ...] = ()
    safeguard: bool = False
    secure_aggregation: bool = False
    privacy: tuple[str, ...] = ()
    privacy_refused: str = ""
    sample_releases: Callable[..., Any] | str | None = None
    default: bool = False

    @property
    def package(self) -> str:
        """The module path of the method package that declares it (`strategies.methods.<package>`):
        its builder's module up to the package."""
        module = self.build.partition(":")[0] if isinstance(self.build, str) else self.build.__module__
        parts = module.split(".")
        return ".".join(parts[:3]) if parts[:2] == ["strategies", "methods"] else module

    def strategy(self, cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
        """Its strategy for the run `cfg`: `build` called (a `"module:function"` imported first)."""
        return builder(self.name, self.build)(cfg, storage)


def builder(name: str, build: StrategyBuilder) -> Callable[[RunConfig, ClientMatrixStorage], Strategy]:
    """The callable of a builder given as a callable or as `"module:function"`; ImportError naming
    the method and the string when it does not resolve."""
    if not isinstance(build, str):
        return build
    module, sep, function = build.partition(":")
    if not sep or not module or not function:
        raise ImportError(f"method {name!r}: build={build!r} must be a callable or 'module:function'")
    found = getattr(importlib.import_module(module), function, None)
    if not callable(found):
        raise ImportError(f"method {name!r}: build={build!r}: {module} has no function {function!r}")
    return found
