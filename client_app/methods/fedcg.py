"""Client half of `fedcg` (messages `train.fedcg`, `evaluate.fedcg`; docs/methods/fedcg.md).

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

`query.fedcg_balance` (fedcg.balance = sinkhorn | centering; strategies.methods.fedcg.domain_balance): per-domain
sums over the client's training images of the teacher's logits (`moments`: Σ z, Σ z²) or of the
softmax of the balanced scores under the labelling sent along (`marginals`), D floats each; or
(`sample`, the default schedule's one exchange per teacher) the moments and a seeded random sample of
the client's teacher logit rows. The
labelling (`teacher_labelling`) travels with the teacher: d̂(x) = argmax_d (λ·(z_d − μ_d)/σ_d + b_d).
Under clustering=oracle the pseudo-domain is each image's true domain (a control).
Where the data know each image's true domain (the `domains` partition), replies also split their
domain counts by true domain (reporting only: a per-image NMI).

Under DP (docs/privacy.md): a `train.fedcg` request with a `privacy` record (`dp = 'sample'`) trains
both the model and the student by DP-SGD (FedCG layers' per-example gradients:
`client_app.methods.fedcg_privacy`); with it or with `withhold-statistics` (`dp = 'client'`) the reply
carries no count or agreement statistic. A `query.fedcg_balance` request with a `dp-upload` record is
answered with the statistics per example in the ArrayRecord `balance-statistics`, which the
`dp-upload` layer clips and noises.

The teacher is frozen for T rounds and its logits depend only on (its weights, the image), so a client
keeps them in its node's `context.state`, keyed by the teacher record's content hash, and computes
them once per teacher (spec §6.4 recomputes the pseudo-domains at every local training: the cached
ones are the same numbers).
"""

from __future__ import annotations

import hashlib
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch import nn

from client_app.evaluation import result_fields
from client_app.runtime import ClientRuntime, client_runtime, model_record
from client_app.training import evaluate as test_model
from client_app.training import seeded_generator, train_epochs
from models import build_model
from models.fedcg import DomainClassifier, FedCGModel
from strategies.methods.fedcg.settings import (
    ADJACENCY,
    BALANCE_STATISTICS,
    FEDCG_METRICS,
    GRAPH,
    QUERY_FEDCG_BALANCE,
    STUDENT,
    TEACHER,
    TEACHER_LABELLING,
    TRAIN_FEDCG,
    FedCGBalanceReply,
    FedCGBalanceRequest,
    FedCGEvaluateCounts,
    FedCGSection,
    FedCGTrain,
    FedCGTrainReply,
)
from strategies.methods.fedcg.domain_balance import Labelling, logit_moments, logit_sample, soft_marginals
from strategies.shared.messages import (
    CONFIG,
    METRICS,
    MODEL,
    EvaluateInstructions,
    EvaluateReply,
)
from strategies.shared.privacy import DP_UPLOAD, PRIVACY

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig

STUDENT_STREAM = 11  # seeded_generator purpose of the student's batches (the model's uses none)
SAMPLE_STREAM = 12  # seeded_generator purpose of the balancing's logit sample
# images per eval-mode forward pass of a domain classifier: on a CPU a small batch keeps the 64×H×W
# activations in cache (16 images: 3.2 MB at 28×28; 256 took 2.3× longer per image), a GPU takes many
INFERENCE_BATCH = {"cpu": 16, "cuda": 256}
STATE_PREFIX = "fedcg.teacher"  # context.state records of the cached teacher logits


@dataclass(frozen=True)
class FedCGClientSettings:
    """What FedCG's client step reads from the run config, taken once per message: its `fedcg`
    section and the named common settings it uses (`model`, and the number of true domain groups of
    the partition, for the NMI counts)."""

    section: FedCGSection
    model: str
    domain_groups: int


def client_settings(cfg: RunConfig) -> FedCGClientSettings:
    """FedCG's client settings from the node's run config."""
    return FedCGClientSettings(section=cfg.fedcg, model=cfg.model,
                               domain_groups=len(cfg.data_spec.partition.domain_names))


class DomainInput(nn.Module):
    """Adapts a FedCG model to the generic loops: forward(indices) = model(x[indices], w[indices])."""

    def __init__(self, model: FedCGModel, images: torch.Tensor, domains: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.images = images
        self.domains = domains

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.model(self.images[index], self.domains[index])


def fedcg_model(rt: ClientRuntime, settings: FedCGClientSettings, arrays: ArrayRecord,
                graph: ArrayRecord) -> FedCGModel:
    """The received FedCG model (built on the meta device, given the received tensors) with A set."""
    with torch.device("meta"):
        backbone = build_model(settings.model, rt.data.input_shape, rt.data.num_classes)
        model = FedCGModel(backbone, settings.section.spec)
    model.load_state_dict(arrays.to_torch_state_dict(), assign=True)
    if ADJACENCY not in graph:
        raise ValueError(f"the '{GRAPH}' record needs the array '{ADJACENCY}'")
    model.set_adjacency(torch.from_numpy(graph[ADJACENCY].numpy()))
    return model.to(rt.device)


def domain_classifier(rt: ClientRuntime, s: FedCGSection, arrays: ArrayRecord) -> DomainClassifier:
    """The received domain classifier (teacher or student) on the client's device."""
    with torch.device("meta"):
        classifier = DomainClassifier(rt.data.input_shape, s.domains, s.domain_stride, s.classifier_pool)
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


def teacher_logits(rt: ClientRuntime, s: FedCGSection, context: Context, record: ArrayRecord,
                   x: torch.Tensor, split: str) -> torch.Tensor:
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
    logits = domain_logits(domain_classifier(rt, s, record), x)
    state[key] = ArrayRecord({"logits": logits.detach().cpu()})
    state[f"{key}.id"] = ConfigRecord({"teacher": fingerprint})
    return logits


def teacher_labelling(content: RecordDict, num_domains: int) -> Labelling | None:
    """The labelling sent with the teacher (fedcg.balance = sinkhorn | centering), or None."""
    if TEACHER_LABELLING not in content:
        return None
    return Labelling.from_record(content[TEACHER_LABELLING], num_domains)


def pseudo_domains(logits: torch.Tensor, labelling: Labelling | None) -> torch.Tensor:
    """d̂(x) = argmax_d g_φ(x)_d (eq. 3), or the balanced argmax of a labelling."""
    return logits.argmax(dim=1) if labelling is None else labelling.pseudo_domains(logits).to(logits.device)


def _counts(domains: torch.Tensor, num_domains: int) -> list[int]:
    return torch.bincount(domains.cpu(), minlength=num_domains).tolist()


def truth_counts(rt: ClientRuntime, settings: FedCGClientSettings, split: str, domains: torch.Tensor
                 ) -> list[int] | None:
    """Counts of (true domain g, discovered domain d) over the split's images, flattened [G, D]; None
    where the data do not know each image's true domain."""
    truth = rt.data.train_domains if split == "train" else rt.data.test_domains
    if truth is None or len(truth) != len(domains):
        return None
    groups, num_domains = settings.domain_groups, settings.section.domains
    joint = truth.cpu() * num_domains + domains.cpu()
    return torch.bincount(joint, minlength=groups * num_domains).tolist()


def oracle_domains(rt: ClientRuntime, num_domains: int) -> torch.Tensor:
    """clustering=oracle: each training image's true domain."""
    truth = rt.data.train_domains
    if truth is None:
        raise ValueError("fedcg.clustering='oracle' needs each image's true domain: partition 'domains'")
    if len(truth) and int(truth.max()) >= num_domains:
        raise ValueError(f"true domain {int(truth.max())} does not fit fedcg.domains = {num_domains}")
    return truth.to(rt.device)


def _received_models(rt: ClientRuntime, content: RecordDict, split: str):
    """What a train or evaluate message starts from: the settings, the FedCG model and the domain
    classifier it carries, and the client's `split` tensors."""
    settings = client_settings(rt.cfg)
    model = fedcg_model(rt, settings, content[MODEL], content[GRAPH])
    student = domain_classifier(rt, settings.section, content[STUDENT])
    return settings, model, student, *rt.tensors(split)


def _dp_recording(model: FedCGModel, private: bool):
    """Under DP-SGD, the context in which Opacus can take the FedCG layers' per-example gradients
    (`client_app.methods.fedcg_privacy`, imported only then); otherwise nothing."""
    if not private:
        return nullcontext(model)
    from client_app.methods.fedcg_privacy import recording

    return recording(model)


def train(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = FedCGTrain.read(message.content[CONFIG])
    content = message.content
    settings, model, student, x, y = _received_models(rt, content, "train")
    s = settings.section
    d = s.domains
    teacher = None
    if ins.client_domain is not None:  # clustering=kmeans: one domain per client
        pseudo = torch.full((len(y),), ins.client_domain, dtype=torch.long, device=x.device)
    elif ins.true_domains:  # clustering=oracle: each image's true domain
        pseudo = oracle_domains(rt, d)
    elif TEACHER in content:  # (a) d̂ = argmax_d g_φ^d(x), teacher frozen (balanced: §6.9)
        teacher = teacher_logits(rt, s, context, content[TEACHER], x, "train")
        pseudo = pseudo_domains(teacher, teacher_labelling(content, d))
    else:
        raise ValueError(f"{TRAIN_FEDCG} needs the '{TEACHER}' record, 'client-domain' or 'true-domains' "
                         "in its config")
    # dp='sample': both trainings run DP-SGD (client_app.privacy); under either DP mode the reply
    # carries the models and no statistic of the data
    private = PRIVACY in content or bool(ins.withhold_statistics)
    if not private:  # under DP no statistic of the data besides what DP-SGD trained is sent
        same = teacher is not None and record_fingerprint(content[STUDENT]) == record_fingerprint(
            content[TEACHER])  # the round after φ ← ϕ: the received student is the teacher
        received = (teacher if same else domain_logits(student, x)).argmax(dim=1)  # the received ϕ
        agreement = float((received == pseudo).float().mean()) if len(y) else 0.0
    index = torch.arange(len(y), device=x.device)
    with _dp_recording(model, PRIVACY in content):
        loss = train_epochs(  # (b) eq. 4 with w = onehot(d̂); V̂ recomputed at every step
            DomainInput(model, x, pseudo), index, y, epochs=ins.local_epochs,
            batch_size=ins.batch_size, lr=ins.lr, momentum=ins.momentum,
            generator=seeded_generator(ins.seed, rt.client_id, ins.server_round),
        )
    student_loss = train_epochs(  # (c) eq. 3: the student learns d̂
        student, x, pseudo, epochs=ins.local_epochs, batch_size=ins.batch_size, lr=ins.domain_lr,
        momentum=0.0, generator=seeded_generator(ins.seed, rt.client_id, ins.server_round, STUDENT_STREAM),
    )
    if private:
        reply = FedCGTrainReply(num_examples=len(y), train_loss=loss, student_loss=student_loss,
                                cuda=rt.on_cuda)
    else:
        reply = FedCGTrainReply(
            num_examples=len(y), train_loss=loss, student_loss=student_loss,
            student_agreement=agreement, domain_counts=_counts(pseudo, d),
            student_counts=_counts(received, d),
            truth_counts=truth_counts(rt, settings, "train", pseudo),
            student_truth_counts=truth_counts(rt, settings, "train", received), cuda=rt.on_cuda,
        )
    return Message(RecordDict({MODEL: model_record(model), STUDENT: model_record(student),
                               METRICS: reply.metrics()}), reply_to=message)


def evaluate(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = EvaluateInstructions.read(message.content[CONFIG])
    content = message.content
    settings, model, student, x, y = _received_models(rt, content, "test")
    s = settings.section
    d = s.domains
    probabilities = domain_probabilities(student, x)
    student_domains = probabilities.argmax(dim=1)
    soft = s.soft
    model.precompute_branches()  # V̂ once for inference
    index = torch.arange(len(y), device=x.device)
    results = {assignment: test_model(DomainInput(model, x, weights), index, y, ins.batch_size)
               for assignment, weights in (("soft", probabilities), ("hard", student_domains))}
    result = results["soft" if soft else "hard"]
    teacher_domains = (pseudo_domains(teacher_logits(rt, s, context, content[TEACHER], x, "test"),
                                      teacher_labelling(content, d))
                       if TEACHER in content else student_domains.new_zeros(0))
    reply = EvaluateReply(num_examples=result.num_examples, loss=result.loss,
                          **result_fields(result), **result_fields(result, "global_"))
    counts = FedCGEvaluateCounts(student_counts=_counts(student_domains, d),
                                 teacher_counts=_counts(teacher_domains, d),
                                 soft_correct=results["soft"].correct,
                                 hard_correct=results["hard"].correct,
                                 truth_counts=truth_counts(rt, settings, "test", student_domains))
    return Message(RecordDict({METRICS: reply.metrics(), FEDCG_METRICS: counts.metrics()}),
                   reply_to=message)


def balance_statistics(message: Message, context: Context) -> Message:
    """`query.fedcg_balance`: per-domain sums of the teacher's logits over the training images —
    `moments` (n, Σ z, Σ z²), `marginals` (n, Σ softmax(λ·ẑ + b), hard counts) under the labelling
    sent along, or `sample` (the moments and up to `sample-size` logit rows drawn at random;
    strategies.methods.fedcg.domain_balance)."""
    rt = client_runtime(message, context)
    s = client_settings(rt.cfg).section
    content = message.content
    request = FedCGBalanceRequest.read(content[CONFIG])
    if TEACHER not in content:
        raise ValueError(f"{QUERY_FEDCG_BALANCE} needs the '{TEACHER}' record")
    x, _ = rt.tensors("train")
    logits = teacher_logits(rt, s, context, content[TEACHER], x, "train")
    if request.statistic in ("moments", "sample"):
        n, sums, squares = logit_moments(logits)
        rows = None
        if request.statistic == "sample":
            if request.sample_size is None or request.seed is None or request.teacher_version is None:
                raise ValueError(f"{QUERY_FEDCG_BALANCE} 'sample' needs 'sample-size', 'seed' and "
                                 "'teacher-version' in its config")
            generator = seeded_generator(request.seed, rt.client_id, request.teacher_version, SAMPLE_STREAM)
            rows = logit_sample(logits.cpu(), request.sample_size, generator).reshape(-1).tolist()
        reply = FedCGBalanceReply(num_examples=n, logit_sum=sums, logit_square_sum=squares,
                                  logit_sample=rows)
    else:
        labelling = teacher_labelling(content, s.domains)
        if labelling is None:
            raise ValueError(f"{QUERY_FEDCG_BALANCE} 'marginals' needs the '{TEACHER_LABELLING}' record")
        n, soft, hard = soft_marginals(logits, labelling)
        reply = FedCGBalanceReply(num_examples=n, soft_sum=soft, hard_counts=hard)
    if DP_UPLOAD in content:  # dp='sample': the statistics leave clipped and noised (its layer)
        return Message(RecordDict({METRICS: FedCGBalanceReply(num_examples=n).metrics(),
                                   BALANCE_STATISTICS: reply.statistics_record()}),
                       reply_to=message)
    return Message(RecordDict({METRICS: reply.metrics()}), reply_to=message)
