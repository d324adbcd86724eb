"""Client half of `ifca` (message types `train.ifca`, `evaluate.ifca`).

IFCA Algorithm 2, client step: receive all C cluster models, estimate the cluster identity
ĵ = argmin_j F_i(θ_j) (mean cross-entropy on the client's training data), then train θ_ĵ with the
shared local SGD loop and return it with ĵ. `evaluate.ifca` (a client that has never trained)
makes the same choice and tests the chosen model on the client's test split.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, RecordDict

from client_app.evaluation import result_fields
from client_app.runtime import ClientRuntime, client_runtime, model_record
from client_app.training import evaluate as test_model
from client_app.training import seeded_generator, train_epochs
from models import Backbone
from strategies.methods.ifca.settings import IFCATrainReply, cluster_model
from strategies.shared.messages import (
    CONFIG, METRICS, MODEL, EvaluateInstructions, EvaluateReply, TrainInstructions
)


def cluster_models(content: RecordDict) -> list[ArrayRecord]:
    """The ArrayRecords `cluster-0`, `cluster-1`, … of a message, in cluster order."""
    models: list[ArrayRecord] = []
    while cluster_model(len(models)) in content:
        models.append(content[cluster_model(len(models))])
    if not models:
        raise ValueError(f"an IFCA message needs ArrayRecords '{cluster_model(0)}', …")
    return models


def choose_cluster(rt: ClientRuntime, content: RecordDict, batch_size: int) -> tuple[int, Backbone]:
    """ĵ = argmin_j F_i(θ_j) on the training split (ties: lowest j) and the model θ_ĵ."""
    x, y = rt.tensors("train")
    best: tuple[float, int, Backbone] | None = None
    for index, arrays in enumerate(cluster_models(content)):
        model = rt.model(arrays)
        loss = test_model(model, x, y, batch_size).loss
        if best is None or loss < best[0]:
            best = (loss, index, model)
    return best[1], best[2]


def train(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = TrainInstructions.read(message.content[CONFIG])
    cluster, model = choose_cluster(rt, message.content, ins.batch_size)
    x, y = rt.tensors("train")
    loss = train_epochs(
        model, x, y, epochs=ins.local_epochs, batch_size=ins.batch_size, lr=ins.lr,
        momentum=ins.momentum, generator=seeded_generator(ins.seed, rt.client_id, ins.server_round),
    )
    reply = IFCATrainReply(num_examples=len(y), train_loss=loss, cluster=cluster, cuda=rt.on_cuda)
    return Message(
        RecordDict({MODEL: model_record(model), METRICS: reply.metrics()}), reply_to=message
    )


def evaluate(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = EvaluateInstructions.read(message.content[CONFIG])
    _, model = choose_cluster(rt, message.content, ins.batch_size)
    result = test_model(model, *rt.tensors("test"), ins.batch_size, rt.data.target_scale)
    reply = EvaluateReply(num_examples=result.num_examples, loss=result.loss,
                          **result_fields(result))
    return Message(RecordDict({METRICS: reply.metrics()}), reply_to=message)
