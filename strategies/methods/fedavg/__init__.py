"""`fedavg`: Flower's FedAvg (or FedMedian / FedTrimmedAvg with `aggregation`); server step
in `server.py`, client step `client_app/methods/fedavg.py` (the generic `train`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:  # keeps no client matrix
    from strategies.methods.fedavg.server import build_fedavg
    return build_fedavg(cfg.fraction_train, cfg.aggregation, cfg.trim_fraction)


METHODS = (Method("fedavg", build, robust=True, secure_aggregation=True,
           summary="global model (Flower's `FedAvg`)",
           client_step="client_app/methods/fedavg.py", privacy=("sample", "client")),)
