"""FedProx: its settings (`fedprox.*` run-config keys)."""

from __future__ import annotations

from pydantic import Field

from strategies.shared.messages import TrainInstructions
from strategies.shared.method import Method
from strategies.shared.settings import MethodSettings


class FedProxSection(MethodSettings):
    """FedProx: weight μ of the proximal term (μ/2)·||w − w_global||²."""

    mu: float = Field(0.01, ge=0.0)


# --- messages -------------------------------------------------------------------------------
class FedProxTrain(TrainInstructions):
    """`train` for fedavg and fedprox: FedProx's Flower strategy adds `proximal-mu` (μ) to the
    generic training config; absent (FedAvg) it is 0 and no proximal term is added."""

    proximal_mu: float = Field(0.0, ge=0.0)


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
METHODS = (Method("fedprox", "strategies.methods.fedprox.server:build", "fedprox", FedProxSection, robust=True,
           secure_aggregation=True,
           summary="global model (Flower's `FedProx`)",
           client_step="client_app/methods/fedavg.py", privacy=("sample", "client")),)
