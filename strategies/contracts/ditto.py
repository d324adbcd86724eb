"""Ditto: its settings (`ditto.*` run-config keys)."""

from __future__ import annotations

from pydantic import Field

from strategies.contracts.base import MethodSettings


class DittoSection(MethodSettings):
    """Ditto: weight λ of the pull (λ/2)·||v − w_global||² and local epochs of the personal model."""

    lambda_: float = Field(0.1, ge=0.0)
    personal_epochs: int = Field(1, ge=1)
