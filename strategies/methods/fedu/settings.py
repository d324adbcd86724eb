"""FedU: its settings (`fedu.*` run-config keys)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from strategies.shared.method import Method
from strategies.shared.settings import GraphFileRule


class FedUSection(GraphFileRule):
    """FedU: local training + a Laplacian step over a given client graph each round."""

    section: ClassVar[str] = "fedu"

    graph: Literal["label-sharing", "road", "file"] = "label-sharing"
    graph_file: str = Field("", validate_default=True)  # .npy / .csv adjacency for graph='file'
    lambda_: float = Field(0.1, ge=0.0)  # λ of w_k ← w_k − η·λ·Σ_l a_kl (w_k − w_l) ([C] L_K 0.1)
    # the row of a client that has never trained: `neighbours` = the graph-weighted mean of its
    # trained neighbours' rows (it starts training from there); `initial` = the initial model (reference)
    untrained: Literal["neighbours", "initial"] = "neighbours"


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
METHODS = (Method("fedu", "strategies.methods.fedu.server:build_fedu", "fedu", FedUSection,
           summary="FedU: local models + a Laplacian-regularisation step over a given client graph",
           client_step="client_app/methods/local.py", safeguard=True, privacy=("sample",)),)
