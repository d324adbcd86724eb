"""The method registry: every method name and its `Method` entry (how to build its strategy, which
run-config section holds its settings, which client handlers answer its messages).

The registry finds the methods in their packages: each package under `strategies/methods/` holds
`METHODS = (Method(...), ...)` in its `__init__` (declared beside its settings), and importing the
registry imports every such package (`discover`). Adding a method = adding its package (and its client
module), nothing here. `RunConfig` reads its sections from here and validates `method` against the
registered names. A package's declaration imports only its settings and message contract; its builder
and client handlers are named as `module:function` and imported when first used, so
importing the registry (as every client does to validate its run config) stays cheap and pulls in no
server-side dependency (scipy, scikit-learn, numba, umap).

The run config's defaults in pyproject.toml and the methods table of `docs/methods.md` are generated
from the registered methods and their settings models by `python -m strategies.shared.generate`
(`--check`: exit 1 naming what differs).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from strategies import methods as method_packages
from strategies.shared.method import ClientHandler, Method, StrategyBuilder
from strategies.shared.settings import MethodSettings

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig

__all__ = ["METHODS", "ClientHandler", "Method", "StrategyBuilder", "build_strategy", "default_method",
           "discover", "method_names", "register", "robust_methods", "sections"]


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add (or replace) a method; its settings section becomes part of every `RunConfig`."""
    if (method.section is None) != (method.settings is None):
        raise ValueError(f"method {method.name!r}: give both section and settings, or neither")
    for other in METHODS.values():
        if method.default and other.default and other.name != method.name:
            raise ValueError(f"method {method.name!r}: {other.name!r} is already the default method")
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


def default_method() -> str:
    """The method a run config that names none runs (the one registered with `default=True`)."""
    for name, method in METHODS.items():
        if method.default:
            return name
    raise LookupError("no registered method is the default (Method(..., default=True))")


def robust_methods() -> tuple[str, ...]:
    """Methods whose global part can be aggregated robustly (`aggregation`); the others aggregate
    over a graph or clusters, where a coordinate-wise median of all clients has no meaning."""
    return tuple(name for name, m in METHODS.items() if m.robust)


def build_strategy(cfg: RunConfig, storage: ClientMatrixStorage | None = None) -> Strategy:
    """The strategy of `cfg.method`, built by its package (a robust method's builder passes on the
    `aggregation` rule; `RunConfig` allows a robust rule only for those). `storage` allocates its
    per-client matrices; default: `client-matrix-mmap-bytes` of `cfg`, files (above that size) in the
    system's temporary directory. The ServerApp passes one that puts the files in the run directory.
    Under `dp = 'client'` the strategy comes wrapped (strategies/shared/private_aggregation.py), and
    under `secure-aggregation` (strategies/shared/secure_sum.py)."""
    from strategies.shared.client_matrix import ClientMatrixStorage

    from strategies.shared.secure_sum import wrap as secure

    if storage is None:
        storage = ClientMatrixStorage(cfg.client_matrix_mmap_bytes)
    strategy = METHODS[cfg.method].strategy(cfg, storage)
    if cfg.dp == "client":  # client-level DP's aggregation: its module is loaded only then
        from strategies.shared.private_aggregation import wrap

        strategy = wrap(cfg, strategy)
    # secure aggregation (the run config allows it or client-level DP, not both)
    return secure(cfg, strategy)


def discover() -> list[Method]:
    """Register the `METHODS` every package under `strategies/methods/` declares (packages in name
    order, entries in declaration order); a package without `METHODS` is an error naming it."""
    found: list[Method] = []
    for info in sorted(pkgutil.iter_modules(method_packages.__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"{method_packages.__name__}.{info.name}")
        declared = getattr(module, "METHODS", None)
        if not declared or not all(isinstance(m, Method) for m in declared):
            raise TypeError(f"{module.__name__} must declare METHODS = (Method(...), ...) in its "
                            "__init__")
        found.extend(register(m) for m in declared)
    return found


discover()
