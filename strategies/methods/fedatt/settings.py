"""FedAtt: its settings (`fedatt.*` run-config keys); its clients answer the generic `train`."""

from __future__ import annotations

from pydantic import Field

from strategies.shared.method import Method
from strategies.shared.settings import MethodSettings


class FedAttSection(MethodSettings):
    """FedAtt (Ji et al., 2019): layer-wise attentive aggregation on the server."""

    # step size ε of w ← w − ε·Σ_k α_k·(w − w_k) (the authors' code: 1.2)
    epsilon: float = Field(1.2, gt=0.0)
    # standard deviation of the Gaussian noise added to each entry of the new global model (0 = off;
    # the authors' code: 0.001)
    noise: float = Field(0.0, ge=0.0)


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
METHODS = (Method("fedatt", "strategies.methods.fedatt.server:build", "fedatt", FedAttSection,
                  summary="global model, layer-wise attentive aggregation",
                  client_step="client_app/methods/fedavg.py", privacy=("sample",)),)
