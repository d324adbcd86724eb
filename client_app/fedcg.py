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

`query.fedcg_centre` (fedcg.teacher-centering): the mean teacher logit over the client's training
images, from which the server forms the centre c of d̂(x) = argmax_d (g_φ(x)_d − c_d).

The teacher is frozen for T rounds and its logits depend only on (its weights, the image), so a client
keeps them in its node's `context.state`, keyed by the teacher record's content hash, and computes
them once per teacher (spec §6.4 recomputes the pseudo-domains at every local training: the cached
ones are the same numbers).
"""

from __future__ import annotations

import hashlib

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch import nn

from client_app.evaluation import result_fields
from client_app.runtime import ClientRuntime, client_runtime, model_record
from client_app.training import evaluate as test_model
from client_app.training import seeded_generator, train_epochs
from models import build_model
from models.fedcg import DomainClassifier, FedCGModel
from strategies.messages import (
    ADJACENCY, CENTRE_C, CONFIG, FEDCG_METRICS, GRAPH, METRICS, MODEL, STUDENT, TEACHER, TEACHER_CENTRE,
    TRAIN_FEDCG, EvaluateInstructions, EvaluateReply, FedCGCentreReply, FedCGEvaluateCounts,
    FedCGTrainReply, TrainInstructions,
)

STUDENT_STREAM = 11  # seeded_generator purpose of the student's batches (the model's uses none)
# images per eval-mode forward pass of a domain classifier: on a CPU a small batch keeps the 64×H×W
# activations in cache (16 images: 3.2 MB at 28×28; 256 took 2.3× longer per image), a GPU takes many
INFERENCE_BATCH = {"cpu": 16, "cuda": 256}
STATE_PREFIX = "fedcg.teacher"  # context.state records of the cached teacher logits


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
def domain_logits(classifier: nn.Module, x: torch.Tensor, batch: int | None = None) -> torch.Tensor:
    """g(x) before the softmax: domain logits [n, D] (eval mode)."""
    classifier.eval()
    batch = batch or INFERENCE_BATCH.get(x.device.type, 64)
    parts = [classifier(x[i : i + batch]) for i in range(0, len(x), batch)]
    return torch.cat(parts) if parts else torch.zeros(0, classifier[-1].out_features, device=x.device)


def domain_probabilities(classifier: nn.Module, x: torch.Tensor, batch: int | None = None
                         ) -> torch.Tensor:
    """g(x): softmax domain probabilities [n, D] (eval mode)."""
    return torch.softmax(domain_logits(classifier, x, batch), dim=1)


def record_fingerprint(record: ArrayRecord) -> str:
    """SHA-256 of an ArrayRecord's contents (names, dtypes, shapes, bytes): equal for equal weights."""
    digest = hashlib.sha256()
    for name, array in record.items():
        digest.update(f"{name}|{array.dtype}|{tuple(array.shape)}|".encode())
        digest.update(array.data)
    return digest.hexdigest()


def teacher_logits(rt: ClientRuntime, context: Context, record: ArrayRecord, x: torch.Tensor,
                   split: str) -> torch.Tensor:
    """g_φ(x) [n, D] of the frozen teacher `record` on this client's `split` images, computed once per
    teacher: kept in `context.state` (one entry per client and split) under the record's content
    hash (`record_fingerprint`); a different teacher replaces the entry."""
    key = f"{STATE_PREFIX}.{split}.{rt.client_id}"
    fingerprint = record_fingerprint(record)
    state = context.state
    known = state.get(f"{key}.id")
    if isinstance(known, ConfigRecord) and known.get("teacher") == fingerprint and key in state:
        logits = torch.from_numpy(state[key]["logits"].numpy())
        if len(logits) == len(x):
            return logits.to(x.device)
    logits = domain_logits(domain_classifier(rt, record), x)
    state[key] = ArrayRecord({"logits": logits.detach().cpu()})
    state[f"{key}.id"] = ConfigRecord({"teacher": fingerprint})
    return logits


def teacher_centre(content: RecordDict, num_domains: int) -> torch.Tensor | None:
    """The centre c [D] sent with the teacher (fedcg.teacher-centering), or None."""
    if TEACHER_CENTRE not in content:
        return None
    record = content[TEACHER_CENTRE]
    if CENTRE_C not in record:
        raise ValueError(f"the '{TEACHER_CENTRE}' record needs the array '{CENTRE_C}'")
    c = torch.from_numpy(record[CENTRE_C].numpy()).to(torch.float32).reshape(-1)
    if len(c) != num_domains:
        raise ValueError(f"'{TEACHER_CENTRE}/{CENTRE_C}' has {len(c)} values; fedcg.domains = {num_domains}")
    return c


def pseudo_domains(logits: torch.Tensor, centre: torch.Tensor | None) -> torch.Tensor:
    """d̂(x) = argmax_d g_φ(x)_d (eq. 3), or argmax_d (g_φ(x)_d − c_d) with a centre c."""
    return (logits if centre is None else logits - centre.to(logits.device)).argmax(dim=1)


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
    teacher = None
    if ins.client_domain is not None:  # clustering=kmeans: one domain per client
        pseudo = torch.full((len(y),), ins.client_domain, dtype=torch.long, device=x.device)
    elif TEACHER in content:  # (a) d̂ = argmax_d g_φ^d(x), teacher frozen
        teacher = teacher_logits(rt, context, content[TEACHER], x, "train")
        pseudo = pseudo_domains(teacher, teacher_centre(content, d))
    else:
        raise ValueError(f"{TRAIN_FEDCG} needs the '{TEACHER}' record or 'client-domain' in its config")
    same = teacher is not None and record_fingerprint(content[STUDENT]) == record_fingerprint(
        content[TEACHER])  # the round after φ ← ϕ: the received student is the teacher
    received = (teacher if same else domain_logits(student, x)).argmax(dim=1)  # the received ϕ
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
    teacher_domains = (pseudo_domains(teacher_logits(rt, context, content[TEACHER], x, "test"),
                                      teacher_centre(content, d))
                       if TEACHER in content else student_domains.new_zeros(0))
    reply = EvaluateReply(num_examples=result.num_examples, loss=result.loss,
                          **result_fields(result), **result_fields(result, "global_"))
    counts = FedCGEvaluateCounts(student_counts=_counts(student_domains, d),
                                 teacher_counts=_counts(teacher_domains, d),
                                 soft_correct=results["soft"].correct,
                                 hard_correct=results["hard"].correct)
    return Message(RecordDict({METRICS: reply.metrics(), FEDCG_METRICS: counts.metrics()}),
                   reply_to=message)


def teacher_mean(message: Message, context: Context) -> Message:
    """`query.fedcg_centre`: the mean teacher logit (1/n) Σ_x g_φ(x) over the training images."""
    rt = client_runtime(message, context)
    if TEACHER not in message.content:
        raise ValueError(f"query.fedcg_centre needs the '{TEACHER}' record")
    x, _ = rt.tensors("train")
    logits = teacher_logits(rt, context, message.content[TEACHER], x, "train")
    mean = logits.mean(dim=0) if len(logits) else logits.new_zeros(logits.shape[1])
    reply = FedCGCentreReply(num_examples=len(logits), logit_mean=[float(v) for v in mean])
    return Message(RecordDict({METRICS: reply.metrics()}), reply_to=message)
