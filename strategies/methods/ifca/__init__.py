"""`ifca`: iterative federated clustering; settings `settings.py`, server step `server.py`, client
step `client_app/methods/ifca.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method
from strategies.methods.ifca.settings import IFCASection, cluster_model

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
    from strategies.methods.ifca.server import IFCA
    from strategies.shared.clustered import seeded_models
    return IFCA(cfg.num_clients, cfg.fraction_train, cfg.ifca.clusters,
                seeded_models(cfg.model, cfg.dataset, cfg.seed), matrix_storage=storage)


METHODS = (Method("ifca", build, "ifca", IFCASection, {"train.ifca": "client_app.methods.ifca:train",
                                                        "evaluate.ifca": "client_app.methods.ifca:evaluate"},
                  limits={"clusters": "clients"}, model_records=(cluster_model("*"),),
           summary="IFCA: C cluster models; each client trains the one with the lowest loss on its data"),)
