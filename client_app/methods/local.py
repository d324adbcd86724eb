"""Client half of `local` (message type `train.local`): train the received model (for `local`, the
client's own; FLT and FedU send their graph aggregate here; a layer the request turns on, such as the
safeguard, may choose another start, `client_app.layers`)."""

from __future__ import annotations

from flwr.app import Context, Message

from client_app.layers import active
from client_app.local_update import train_and_reply
from client_app.runtime import client_runtime
from strategies.shared.messages import CONFIG, PERSONAL, TrainInstructions


def train(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = TrainInstructions.read(message.content[CONFIG])
    start = active().start(rt, ins, {PERSONAL: message.content[PERSONAL]})
    return train_and_reply(message, rt, ins, rt.model(start), PERSONAL)
