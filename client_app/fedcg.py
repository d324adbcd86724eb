"""Client half of `fedcg` (messages `train.fedcg`, `evaluate.fedcg`; specs/fedcg.md §3).

`train.fedcg`: (a) pseudo-domain d̂ of every local image from the frozen teacher (eval mode; or the
client's K-means cluster under `clustering=kmeans`); (b) `local-epochs` of SGD on the FedCG model with
one-hot w = d̂ — every step recomputes V̂ = GCN(A, V, W), so gradients reach θ_a, every row of V, W and
λ; (c) the same number of epochs of SGD (no momentum) on the student with targets d̂ (eq. 3). Reply:
`model`, `student`, and `FedCGTrainReply` metrics (losses, student–teacher agreement of the received
student, domain histograms).

`evaluate.fedcg`: V̂ precomputed once; per-sample w = softmax(g_ϕ(x)) (or one-hot argmax with soft
= false); reply the usual `EvaluateReply` (the FedCG model is the global model: `global-*` = the same
numbers) plus `fedcg-metrics`: the student's and teacher's domain histograms of the test images and
the correct predictions under both assignments (soft and hard, for the ablation).
Both loops are the generic ones of `client_app.training`: `DomainInput` feeds them sample indices.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict
from torch import nn

from client_app.evaluation import result_fields
from client_app.runtime import ClientRuntime, client_runtime, model_record
from client_app.training import evaluate as test_model
from client_app.training import seeded_generator, train_epochs
from models import build_model
from models.fedcg import DomainClassifier, FedCGModel
from strategies.messages import (
    ADJACENCY, CONFIG, FEDCG_METRICS, GRAPH, METRICS, MODEL, STUDENT, TEACHER, TRAIN_FEDCG,
    EvaluateInstructions, EvaluateReply, FedCGEvaluateCounts, FedCGTrainReply, TrainInstructions,
)

STUDENT_STREAM = 11  # seeded_generator purpose of the student's batches (the model's uses none)


class DomainInput(nn.Module):
    """Adapts a FedCG model to the generic loops: forward(indices) = model(x[indices], w[indices])."""

    def __init__(self, model: FedCGModel, images: torch.Tensor, domains: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.images = images
        self.domains = domains

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.model(self.images[index], self.domains[index])


def fedcg_model(rt: ClientRuntime, arrays: ArrayRecord, graph: ArrayRecord) -> FedCGModel:
    """The received FedCG model (built on the meta device, given the received tensors) with A set."""
    with torch.device("meta"):
        backbone = build_model(rt.cfg.model, rt.data.input_shape, rt.data.num_classes)
        model = FedCGModel(backbone, rt.cfg.fedcg.spec)
    model.load_state_dict(arrays.to_torch_state_dict(), assign=True)
    if ADJACENCY not in graph:
        raise ValueError(f"the '{GRAPH}' record needs the array '{ADJACENCY}'")
    model.set_adjacency(torch.from_numpy(graph[ADJACENCY].numpy()))
    return model.to(rt.device)


def domain_classifier(rt: ClientRuntime, arrays: ArrayRecord) -> DomainClassifier:
    s = rt.cfg.fedcg
    with torch.device("meta"):
        classifier = DomainClassifier(rt.data.input_shape[0], s.domains, s.domain_stride)
    classifier.load_state_dict(arrays.to_torch_state_dict(), assign=True)
    return classifier.to(rt.device)


@torch.no_grad()
def domain_probabilities(classifier: nn.Module, x: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """g(x): softmax domain probabilities [n, D] (eval mode)."""
    classifier.eval()
    parts = [torch.softmax(classifier(x[i : i + batch]), dim=1) for i in range(0, len(x), batch)]
    return torch.cat(parts) if parts else torch.zeros(0, classifier[-1].out_features, device=x.device)


def _counts(domains: torch.Tensor, num_domains: int) -> list[int]:
    return torch.bincount(domains.cpu(), minlength=num_domains).tolist()


def train(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = TrainInstructions.read(message.content[CONFIG])
    if ins.domain_lr is None or ins.num_domains is None:
        raise ValueError(f"{TRAIN_FEDCG} needs 'domain-lr' and 'num-domains' in its config")
    if ins.num_domains != rt.cfg.fedcg.domains:
        raise ValueError(f"the server sent num-domains={ins.num_domains} but this client's run config "
                         f"has fedcg.domains={rt.cfg.fedcg.domains}")
    content = message.content
    model = fedcg_model(rt, content[MODEL], content[GRAPH])
    student = domain_classifier(rt, content[STUDENT])
    x, y = rt.tensors("train")
    d = ins.num_domains
    if ins.client_domain is not None:  # clustering=kmeans: one domain per client
        pseudo = torch.full((len(y),), ins.client_domain, dtype=torch.long, device=x.device)
    elif TEACHER in content:  # (a) d̂ = argmax_d g_φ^d(x), teacher frozen
        pseudo = domain_probabilities(domain_classifier(rt, content[TEACHER]), x).argmax(dim=1)
    else:
        raise ValueError(f"{TRAIN_FEDCG} needs the '{TEACHER}' record or 'client-domain' in its config")
    received = domain_probabilities(student, x).argmax(dim=1)
    agreement = float((received == pseudo).float().mean()) if len(y) else 0.0
    index = torch.arange(len(y), device=x.device)
    loss = train_epochs(  # (b) eq. 4 with w = onehot(d̂); V̂ recomputed at every step
        DomainInput(model, x, pseudo), index, y, epochs=ins.local_epochs, batch_size=ins.batch_size,
        lr=ins.lr, momentum=ins.momentum,
        generator=seeded_generator(ins.seed, rt.client_id, ins.server_round),
    )
    student_loss = train_epochs(  # (c) eq. 3: the student learns d̂
        student, x, pseudo, epochs=ins.local_epochs, batch_size=ins.batch_size, lr=ins.domain_lr,
        momentum=0.0, generator=seeded_generator(ins.seed, rt.client_id, ins.server_round, STUDENT_STREAM),
    )
    reply = FedCGTrainReply(
        num_examples=len(y), train_loss=loss, student_loss=student_loss, student_agreement=agreement,
        domain_counts=_counts(pseudo, d), student_counts=_counts(received, d), cuda=rt.on_cuda,
    )
    return Message(RecordDict({MODEL: model_record(model), STUDENT: model_record(student),
                               METRICS: reply.metrics()}), reply_to=message)


def evaluate(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = EvaluateInstructions.read(message.content[CONFIG])
    content = message.content
    model = fedcg_model(rt, content[MODEL], content[GRAPH])
    student = domain_classifier(rt, content[STUDENT])
    x, y = rt.tensors("test")
    d = rt.cfg.fedcg.domains
    probabilities = domain_probabilities(student, x)
    student_domains = probabilities.argmax(dim=1)
    soft = rt.cfg.fedcg.soft if ins.soft is None else ins.soft
    model.precompute_branches()  # V̂ once for inference
    index = torch.arange(len(y), device=x.device)
    results = {assignment: test_model(DomainInput(model, x, weights), index, y, ins.batch_size)
               for assignment, weights in (("soft", probabilities), ("hard", student_domains))}
    result = results["soft" if soft else "hard"]
    teacher_domains = (domain_probabilities(domain_classifier(rt, content[TEACHER]), x).argmax(dim=1)
                       if TEACHER in content else student_domains.new_zeros(0))
    reply = EvaluateReply(num_examples=result.num_examples, loss=result.loss,
                          **result_fields(result), **result_fields(result, "global_"))
    counts = FedCGEvaluateCounts(student_counts=_counts(student_domains, d),
                                 teacher_counts=_counts(teacher_domains, d),
                                 soft_correct=results["soft"].correct,
                                 hard_correct=results["hard"].correct)
    return Message(RecordDict({METRICS: reply.metrics(), FEDCG_METRICS: counts.metrics()}),
                   reply_to=message)
