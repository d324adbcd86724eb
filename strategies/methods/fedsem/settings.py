"""FedSEM: its settings (`fedsem.*` run-config keys)."""

from __future__ import annotations

from pydantic import Field

from strategies.shared.settings import MethodSettings


class FedSEMSection(MethodSettings):
    """FedSEM (FeSEM): number C of K-means centres over the client models."""

    clusters: int = Field(5, ge=1)
