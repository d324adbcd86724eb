"""SCAFFOLD: its settings (`scaffold.*` run-config keys) and the message only it sends."""

from __future__ import annotations

from pydantic import Field

from strategies.shared.messages import TrainInstructions
from strategies.shared.method import Method
from strategies.shared.settings import MethodSettings


class ScaffoldSection(MethodSettings):
    """SCAFFOLD (Karimireddy et al., 2020): the server's step size η_g on the mean client update."""

    server_lr: float = Field(1.0, gt=0.0)  # global step size η_g: x ← x + η_g·mean(Δy)


# --- messages -------------------------------------------------------------------------------
TRAIN_SCAFFOLD = "train.scaffold"
# ArrayRecords of `train.scaffold`, in the model's layout: the server control variate c (down) and the
# client's own control variate c_i (down; its update c_i⁺ comes back up under the same name)
CONTROL = "control"
CLIENT_CONTROL = "client-control"


class ScaffoldTrain(TrainInstructions):
    """`train.scaffold`: the common training fields; c and c_i travel as ArrayRecords beside the
    global model (`CONTROL`, `CLIENT_CONTROL`)."""


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
METHODS = (Method("scaffold", "strategies.methods.scaffold.server:build", "scaffold", ScaffoldSection,
                  {TRAIN_SCAFFOLD: "client_app.methods.scaffold:train"},
                  summary="global model + control variates against client drift", privacy=("sample",)),)
