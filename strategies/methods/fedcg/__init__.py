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
           privacy_refused=("its clients send, besides the model and the student, statistics of their data that no "
                            "noised aggregate covers: per-domain sample counts in every train reply and, for the "
                            "domain balancing, sums of the teacher's domain logits and a random sample of single "
                            "examples' logits (query.fedcg_balance)"),
           summary="FedCG: teacher/student domain clustering + GCN-connected domain-specific residual branches"),)
