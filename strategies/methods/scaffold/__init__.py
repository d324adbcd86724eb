"""`scaffold`: SCAFFOLD's control variates correct the clients' drift; settings `settings.py`,
server step `server.py`, client step `client_app/methods/scaffold.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.methods.scaffold.settings import TRAIN_SCAFFOLD, ScaffoldSection
from strategies.shared.method import Method

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
    from strategies.methods.scaffold.server import Scaffold
    return Scaffold(cfg.num_clients, cfg.fraction_train, cfg.scaffold, matrix_storage=storage)


METHODS = (Method("scaffold", build, "scaffold", ScaffoldSection,
                  {TRAIN_SCAFFOLD: "client_app.methods.scaffold:train"},
                  summary="global model + control variates against client drift", privacy=("sample",)),)
