"""IFCA: its settings (`ifca.*` run-config keys)."""

from __future__ import annotations

from pydantic import Field

from strategies.contracts.base import MethodSettings


class IFCASection(MethodSettings):
    """IFCA: number C of cluster models (every sampled client receives all C each round)."""

    clusters: int = Field(5, ge=1)
