"""Client half of `ditto` (message type `train.ditto`), Ditto Algorithm 1: the FedAvg local update
of the global model w, then `personal-epochs` epochs on v_i with F_i(v_i) + (λ/2)·||v_i − w||²."""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict

from client_app.runtime import client_runtime, model_record
from client_app.training import proximal_penalty, seeded_generator, train_epochs
from strategies.methods.ditto.settings import DittoTrain
from strategies.shared.messages import CONFIG, GLOBAL, METRICS, MODEL, PERSONAL, TrainReply


def train(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = DittoTrain.read(message.content[CONFIG])
    x, y = rt.tensors("train")
    shared = dict(batch_size=ins.batch_size, lr=ins.lr, momentum=ins.momentum)
    global_model = rt.model(message.content[GLOBAL])
    personal = rt.model(message.content[PERSONAL])
    pull = proximal_penalty(global_model, ins.ditto_lambda)  # anchored at the round's w
    loss = train_epochs(
        global_model, x, y, epochs=ins.local_epochs,
        generator=seeded_generator(ins.seed, rt.client_id, ins.server_round, 0), **shared,
    )
    train_epochs(
        personal, x, y, epochs=ins.personal_epochs, penalty=pull,
        generator=seeded_generator(ins.seed, rt.client_id, ins.server_round, 1), **shared,
    )
    reply = TrainReply(num_examples=len(y), train_loss=loss, cuda=rt.on_cuda)
    return Message(
        RecordDict({
            MODEL: model_record(global_model),
            PERSONAL: model_record(personal),
            METRICS: reply.metrics(),
        }),
        reply_to=message,
    )
