"""FedProx: its settings (`fedprox.*` run-config keys)."""

from __future__ import annotations

from pydantic import Field

from strategies.shared.settings import MethodSettings


class FedProxSection(MethodSettings):
    """FedProx: weight μ of the proximal term (μ/2)·||w − w_global||²."""

    mu: float = Field(0.01, ge=0.0)
