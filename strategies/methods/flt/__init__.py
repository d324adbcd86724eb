"""`flt`: Federated Learning with Taskonomy; settings and messages `settings.py`, server step
`server.py`, its relatedness (`relatedness`, `set_distance`) and neighbourhood averaging
(`neighbourhood`, `neighbourhood_sums`); client step `client_app/methods/flt.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method
from strategies.methods.flt.settings import FLTSection

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
    from strategies.methods.flt.server import build_flt
    return build_flt(cfg, storage)


METHODS = (Method("flt", build, "flt", FLTSection, {"train.flt_ae": "client_app.methods.flt:train_autoencoder",
                                                     "query.flt_embed": "client_app.methods.flt:embed"},
                  limits={"clusters": "clients"}, safeguard=True, privacy=("client",),
           summary="FLT: one-shot client relatedness (autoencoder codes → k-means centroids → UMAP → threshold graph) + graph-weighted averaging of per-client models"),)
