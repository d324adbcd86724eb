"""FedSEM: its settings (`fedsem.*` run-config keys)."""

from __future__ import annotations

from pydantic import Field

from strategies.shared.method import Method
from strategies.shared.settings import MethodSettings


class FedSEMSection(MethodSettings):
    """FedSEM (FeSEM): number C of K-means centres over the client models."""

    clusters: int = Field(5, ge=1)


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
METHODS = (Method("fedsem", "strategies.methods.fedsem.server:build", "fedsem", FedSEMSection, limits={"clusters": "clients"},
           summary="FedSEM (FeSEM): K-means of the client models into C centre models, every round",
           client_step="client_app/methods/local.py", privacy=("sample",)),)
