"""The local update most methods share: E epochs of SGD from a received model (plus a method's
penalty), replied as one named model record with `num-examples` and `train-loss`. A cross-cutting
feature the request turns on (`client_app.layers`) chooses the train samples and acts on the trained
model before it is sent."""

from __future__ import annotations

from flwr.app import Message, RecordDict
from torch import nn

from client_app.layers import active, training_split
from client_app.runtime import ClientRuntime, model_record
from client_app.training import Penalty, seeded_generator, train_epochs
from strategies.shared.messages import METRICS, TrainInstructions, TrainReply


def train_and_reply(
    message: Message, rt: ClientRuntime, ins: TrainInstructions, model: nn.Module, record: str,
    penalty: Penalty | None = None,
) -> Message:
    """Train `model` on the client's train split as `ins` says; reply it under `record`."""
    x, y, keep = training_split(rt, ins)
    loss = train_epochs(
        model, x, y, epochs=ins.local_epochs, batch_size=ins.batch_size, lr=ins.lr,
        momentum=ins.momentum, generator=seeded_generator(ins.seed, rt.client_id, ins.server_round),
        penalty=penalty, keep=keep,
    )
    examples = (len(y) if keep is None else int(keep.sum())) + active().trained(rt, ins, model)
    reply = TrainReply(num_examples=examples, train_loss=loss, cuda=rt.on_cuda)
    return Message(RecordDict({record: model_record(model), METRICS: reply.metrics()}),
                   reply_to=message)
