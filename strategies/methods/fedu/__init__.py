"""`fedu`: federated multi-task learning with Laplacian regularisation over a client graph;
settings `settings.py`, server step `server.py`; clients run the generic `train.local` step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method
from strategies.methods.fedu.settings import FedUSection

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
    from strategies.methods.fedu.server import build_fedu
    return build_fedu(cfg, storage)


METHODS = (Method("fedu", build, "fedu", FedUSection,
           summary="FedU: local models + a Laplacian-regularisation step over a given client graph",
           client_step="client_app/methods/local.py", safeguard=True, privacy=("sample",)),)
