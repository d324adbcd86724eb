"""Run a whole Bouquet federation in this process (tests, benchmarks): `simulate({...})`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from client_app.app import app as client_app
from server_app.app import run
from server_app.callbacks import RunCallback
from server_app.harness.local_grid import LocalGrid
from strategies.shared.run_config import RunConfig, default_run_config


def simulate(overrides: dict[str, Any], num_nodes: int | None = None,
             callbacks: Sequence[RunCallback] = (),
             node_configs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Validate defaults + overrides, host the clients on `num_nodes` virtual nodes (or one node per
    `node_configs` entry, e.g. `{"data-dir": ...}`), run (with extra `callbacks`), summarise."""
    run_config = {**default_run_config(), **overrides}
    cfg = RunConfig.from_flower(run_config)
    grid = LocalGrid(client_app, num_nodes or cfg.num_clients, run_config, node_configs)
    return run(grid, cfg, connect_timeout=5.0, callbacks=callbacks)
