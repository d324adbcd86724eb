"""`sfl` and `sfl-star`: Structured Federated Learning; settings and messages `settings.py`, server
step `server.py`, its GCN propagation (`gcn`, `spmm`) and SFL*'s graph learner (`graph_learner`);
client step `client_app/methods/sfl.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method
from strategies.methods.sfl.settings import SFLSection

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build_sfl(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
    from strategies.methods.sfl.server import build_sfl
    return build_sfl(cfg, learn=False, storage=storage)


def build_sfl_star(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:  # SFL*
    from strategies.methods.sfl.server import build_sfl
    return build_sfl(cfg, learn=True, storage=storage)


CLIENT = {"train.sfl": "client_app.methods.sfl:train"}
METHODS = (
    Method("sfl", build_sfl, "sfl", SFLSection, CLIENT, safeguard=True, privacy=("sample", "client"), default=True,
           summary="SFL: weight-free GCN aggregation of the client models over a given client graph (label-sharing, road or file)"),
    Method("sfl-star", build_sfl_star, "sfl", SFLSection, CLIENT, limits={"gl_k": "other-clients"}, safeguard=True, privacy=("sample", "client"),
           summary="SFL\\* (`sfl*`): SFL over a graph learned from the client models, blended into the prior"),
)
