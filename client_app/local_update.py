"""The local update most methods share: E epochs of SGD from a received model (plus a method's
penalty), replied as one named model record with `num-examples` and `train-loss`. With the safeguard
on (`client_app.safeguard`) it trains outside the held-out slice and keeps the result as the client's
own model (where it trained from the federation's consensus, only if that scores at least as well on
the slice as its own model, `safeguard.keep_trained`); where the federation hands out its consensus,
the model it sends is then trained on the slice too (`safeguard.train_on_slice`)."""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict
from torch import nn

from client_app import safeguard
from client_app.runtime import ClientRuntime, model_record
from client_app.training import Penalty, seeded_generator, train_epochs
from strategies.shared.messages import METRICS, TrainInstructions, TrainReply


def train_and_reply(
    message: Message, rt: ClientRuntime, ins: TrainInstructions, model: nn.Module, record: str,
    penalty: Penalty | None = None, context: Context | None = None,
) -> Message:
    """Train `model` on the client's train split as `ins` says; reply it under `record` (and, given
    the node's `context`, keep it as the client's own model for the safeguard)."""
    x, y = safeguard.training_tensors(rt, ins)
    loss = train_epochs(
        model, x, y, epochs=ins.local_epochs, batch_size=ins.batch_size, lr=ins.lr,
        momentum=ins.momentum, generator=seeded_generator(ins.seed, rt.client_id, ins.server_round),
        penalty=penalty,
    )
    examples, fields = len(y), {}
    if context is not None:
        fields = safeguard.keep_trained(rt, context, model, ins)
        examples += safeguard.train_on_slice(rt, context, model, ins)
    reply = TrainReply(num_examples=examples, train_loss=loss, cuda=rt.on_cuda, **fields)
    return Message(RecordDict({record: model_record(model), METRICS: reply.metrics()}),
                   reply_to=message)
