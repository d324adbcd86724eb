"""`fedsem`: multi-centre FL (FeSEM); settings `settings.py`, server step `server.py`; clients run
the generic `train.local` step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method
from strategies.methods.fedsem.settings import FedSEMSection

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
    from strategies.methods.fedsem.server import FedSEM
    return FedSEM(cfg.num_clients, cfg.fraction_train, cfg.fedsem.clusters, cfg.seed,
                  matrix_storage=storage)


METHODS = (Method("fedsem", build, "fedsem", FedSEMSection, limits={"clusters": "clients"},
           summary="FedSEM (FeSEM): K-means of the client models into C centre models, every round",
           client_step="client_app/methods/local.py", privacy=("sample",)),)
