"""Client half of `local` (message type `train.local`): train the received model (for `local`, the
client's own; FLT and FedU send their graph aggregate here, mixed with the client's own model when
the safeguard is on, `client_app.safeguard`; where the federation hands out its consensus and says
so, the consensus itself)."""

from __future__ import annotations

from flwr.app import Context, Message

from client_app import safeguard
from client_app.local_update import train_and_reply
from client_app.runtime import client_runtime
from strategies.shared.messages import CONFIG, PERSONAL, TrainInstructions


def train(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = TrainInstructions.read(message.content[CONFIG])
    received = message.content[PERSONAL]
    if safeguard.trains_from_consensus(context, rt.client_id, ins):
        start = received  # FedAvg's start; the client keeps the better of its own and the trained
    else:
        start, _ = safeguard.choose(rt, context, ins, {PERSONAL: received})
    return train_and_reply(message, rt, ins, rt.model(start), PERSONAL, context=context)
