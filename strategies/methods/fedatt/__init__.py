"""`fedatt`: attentive aggregation of the clients' models, layer by layer (settings `fedatt.*` in
`settings.py`, server step `server.py`); the client step is FedAvg's (`client_app/methods/fedavg.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.methods.fedatt.settings import FedAttSection
from strategies.shared.method import Method

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:  # keeps no client matrix
    from strategies.methods.fedatt.server import FedAtt
    return FedAtt(cfg.num_clients, cfg.fraction_train, cfg.fedatt, cfg.seed, matrix_storage=storage)


METHODS = (Method("fedatt", build, "fedatt", FedAttSection,
                  summary="global model, layer-wise attentive aggregation",
                  client_step="client_app/methods/fedavg.py", privacy=("sample",)),)
