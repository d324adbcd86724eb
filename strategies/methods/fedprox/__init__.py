"""`fedprox`: FedAvg whose clients add a proximal term (settings `fedprox.*` in `settings.py`,
server step `server.py`); the client step is FedAvg's (`client_app/methods/fedavg.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method
from strategies.methods.fedprox.settings import FedProxSection

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:  # keeps no client matrix
    from strategies.methods.fedprox.server import build_fedprox
    return build_fedprox(cfg.fraction_train, cfg.fedprox.mu, cfg.aggregation, cfg.trim_fraction)


METHODS = (Method("fedprox", build, "fedprox", FedProxSection, robust=True,
           secure_aggregation=True,
           summary="global model (Flower's `FedProx`)",
           client_step="client_app/methods/fedavg.py", privacy=("sample", "client")),)
