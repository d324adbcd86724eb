"""`ditto`: a global model plus personal models pulled toward it; settings `settings.py`, server
step `server.py`, client step `client_app/methods/ditto.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method
from strategies.methods.ditto.settings import DittoSection

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
    from strategies.methods.ditto.server import Ditto
    return Ditto(cfg.num_clients, cfg.fraction_train, cfg.ditto, cfg.aggregation, cfg.trim_fraction,
                 matrix_storage=storage)


METHODS = (Method("ditto", build, "ditto", DittoSection, {"train.ditto": "client_app.methods.ditto:train"},
                  robust=True,
           summary="global model + personal models pulled toward it", privacy=("sample",)),)
