"""`fedcg`: cluster-driven graph FL; settings and messages `settings.py`, server step `server.py`,
domain balancing `domain_balance.py`, its domain graph `domain_graph.py`, its report `report.py`;
client step `client_app/methods/fedcg.py` (its model: `models/fedcg.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method
from strategies.methods.fedcg.settings import FedCGSection

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:  # keeps no client matrix
    from strategies.methods.fedcg.server import build_fedcg
    return build_fedcg(cfg)


METHODS = (Method("fedcg", build, "fedcg", FedCGSection, {
    "train.fedcg": "client_app.methods.fedcg:train", "evaluate.fedcg": "client_app.methods.fedcg:evaluate",
    "query.fedcg_balance": "client_app.methods.fedcg:balance_statistics"},
           summary="FedCG: teacher/student domain clustering + GCN-connected domain-specific residual branches"),)
