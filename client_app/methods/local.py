"""Client half of `local` (message type `train.local`): train the client's own model, nothing shared."""

from __future__ import annotations

from flwr.app import Context, Message

from client_app.local_update import train_and_reply
from client_app.runtime import client_runtime
from strategies.shared.messages import CONFIG, PERSONAL, TrainInstructions


def train(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = TrainInstructions.read(message.content[CONFIG])
    model = rt.model(message.content[PERSONAL])
    return train_and_reply(message, rt, ins, model, PERSONAL)
