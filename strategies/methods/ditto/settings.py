"""Ditto: its settings (`ditto.*` run-config keys) and the messages only it sends."""

from __future__ import annotations

from pydantic import Field

from strategies.shared.method import Method
from strategies.shared.settings import MethodSettings
from strategies.shared.messages import TrainInstructions


class DittoSection(MethodSettings):
    """Ditto: weight λ of the pull (λ/2)·||v − w_global||² and local epochs of the personal model."""

    lambda_: float = Field(0.1, ge=0.0)
    personal_epochs: int = Field(1, ge=1)


# --- messages -------------------------------------------------------------------------------
TRAIN_DITTO = "train.ditto"


class DittoTrain(TrainInstructions):
    """`train.ditto`: λ of the personal model's pull (λ/2)·||v − w||² and its local epochs."""

    ditto_lambda: float = Field(ge=0.0)
    personal_epochs: int = Field(ge=1)


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
METHODS = (Method("ditto", "strategies.methods.ditto.server:build", "ditto", DittoSection, {"train.ditto": "client_app.methods.ditto:train"},
                  robust=True,
           summary="global model + personal models pulled toward it", privacy=("sample",)),)
