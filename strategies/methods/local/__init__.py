"""`local`: every client trains its own model alone; server step `server.py`, client step
`client_app/methods/local.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
    from strategies.methods.local.server import Local
    return Local(cfg.num_clients, cfg.fraction_train, matrix_storage=storage)


METHODS = (Method("local", build, client={"train.local": "client_app.methods.local:train"},
           summary='one model per client, no sharing ("Separate")', privacy=("sample",)),)
