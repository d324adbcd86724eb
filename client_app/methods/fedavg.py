"""Client half of `fedavg` and `fedprox` (message type `train`): start from the global model, run the
local epochs (FedProx adds (μ/2)·||θ − θ_global||²), send the trained model back."""

from __future__ import annotations

from flwr.app import Context, Message

from client_app.local_update import train_and_reply
from client_app.runtime import client_runtime
from client_app.training import proximal_penalty
from strategies.methods.fedprox.settings import FedProxTrain
from strategies.shared.messages import CONFIG, GLOBAL, MODEL


def train(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = FedProxTrain.read(message.content[CONFIG])
    model = rt.model(message.content[GLOBAL])
    penalty = proximal_penalty(model, ins.proximal_mu) if ins.proximal_mu > 0 else None
    return train_and_reply(message, rt, ins, model, MODEL, penalty)

