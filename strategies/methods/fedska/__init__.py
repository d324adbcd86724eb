"""`fedska`: client-graph structure learning with a split-learning GNN encoder; settings and
messages `settings.py`, server step `server.py`, graph learning `structure_learning.py`; client step
`client_app/methods/fedska.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method
from strategies.methods.fedska.settings import FedSKASection

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
    from strategies.methods.fedska.server import build_fedska
    return build_fedska(cfg, storage)


METHODS = (Method("fedska", build, "fedska", FedSKASection, {
    "train.fedska": "client_app.methods.fedska:train", "query.ska_embed": "client_app.methods.fedska:embed",
    "query.ska_grad": "client_app.methods.fedska:slot_gradient"}, limits={"k": "other-clients"}, safeguard=True, privacy=("client",),
           summary="FedSKA: unsupervised client-graph learning (denoising structure learner), split-learning GNN encoder whose features regularise local training"),)
