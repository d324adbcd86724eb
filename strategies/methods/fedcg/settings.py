"""FedCG: its settings (`fedcg.*` run-config keys) and the messages only it sends."""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import Field, model_validator

from strategies.shared.method import Method
from strategies.shared.settings import MethodSettings, Record
from strategies.shared.messages import TrainInstructions

log = logging.getLogger("flwr.bouquet")
_WARNED: set[str] = set()  # warnings already logged by this process (server and clients validate)


class FedCGSection(MethodSettings):
    """FedCG (docs/methods/fedcg.md): domain clustering (teacher/student), FedCG layers, GCN and adjacency."""

    domains: int = Field(4, ge=1)  # D
    teacher_period: int = Field(10, ge=1)  # T: the teacher is replaced by the student every T rounds
    beta: float = Field(0.5, ge=0.0, le=1.0)  # A_ii = β (eq. 7)
    adj_warmup: int = Field(10, ge=0)  # A = I before this round (spec: = T)
    adjacency: Literal["distance", "identity", "uniform", "random"] = "distance"
    layers: Literal["last", "all"] = "last"  # which conv layers become FedCG layers
    gcn_layers: Literal[1, 2] = 2  # 1: full W [q, q]; 2: bottleneck W1 [q, b], W2 [b, q]
    bottleneck: int = Field(16, ge=1)  # b (spec CPU row: 64; why 16: docs/research/fedcg.md)
    use_w: bool = True  # false: a weight-free GCN
    relu: bool = True  # σ = ReLU on the GCN outputs (false: identity)
    residual: bool = True  # false: branch only (no agnostic layer)
    lambda_init: float = 0.1  # initial λ of every FedCG layer
    # GCN weights: Glorot (spec), variance-preserving, or the last weight at 0 (needs relu=false;
    # models.fedcg.FedCGSpec checks it when the run is FedCG's)
    gcn_init: Literal["glorot", "scaled", "zero"] = "glorot"
    # clf: teacher/student; kmeans: K-means of client models; oracle: each image's true domain
    # (a control: the student still assigns domains at test time)
    clustering: Literal["clf", "kmeans", "oracle"] = "clf"
    kmeans_epochs: int = Field(1, ge=1)  # clustering='kmeans': local epochs of each client's model
    # SGD of the student (no momentum, no weight decay); 0.2 measured best (the spec's CPU row: 0.01)
    domain_lr: float = Field(0.2, gt=0.0)
    domain_stride: int = Field(1, ge=1)  # stride of both convs of the domain classifiers
    classifier_pool: Literal["global", "avg2", "flatten"] = "global"  # domain classifier pooling (§6.10)
    soft: bool = True  # test assignment: student probabilities (false: one-hot argmax)
    # pseudo-domains from the teacher's logits (§6.9): sinkhorn = federated standardisation + Sinkhorn
    # column scaling (balanced hard labels); centering = minus the federated mean logit; none = argmax
    balance: Literal["sinkhorn", "centering", "none"] = "sinkhorn"
    sinkhorn_iters: int = Field(30, ge=1)  # column-scaling exchanges (D floats each) per teacher
    sinkhorn_temperature: float = Field(100.0, ge=1.0)  # final λ (raised geometrically from 1)
    # sinkhorn's schedule: `sampled` = one exchange per teacher (moments and `balance-sample` of each
    # client's teacher logits; the server runs the column scalings on the pooled sample); `exchange` =
    # one federated exchange per column scaling (sinkhorn-iters + 1 per teacher; the spec's §6.9)
    balance_schedule: Literal["sampled", "exchange"] = "sampled"
    balance_sample: int = Field(32, ge=1)  # sampled: teacher logit rows a client sends per teacher
    # the earlier spelling of balance='centering': true selects it (false changes nothing)
    teacher_centering: bool = False

    @model_validator(mode="after")
    def _centering_is_a_balance(self) -> "FedCGSection":
        if self.teacher_centering:
            if self.clustering != "clf":
                raise ValueError("fedcg.teacher-centering centres the teacher's logits: it needs "
                                 f"fedcg.clustering='clf' (got '{self.clustering}'); set one of them back")
            if self.balance == "none":
                raise ValueError("fedcg.teacher-centering = true is fedcg.balance = 'centering', but "
                                 "fedcg.balance = 'none' is set; keep one of them")
            object.__setattr__(self, "balance", "centering")
        return self

    def check(self, cfg) -> None:
        """FedCG needs an image model with conv layers, the 1-layer GCN a small enough layer, and the
        oracle control the true domains of a `domains` partition."""
        from datasets.federated import dataset_info
        from models.fedcg import (
            fedcg_layer_sizes,  # torch models: imported only when needed
        )

        convs = ("cnn", "leaf-cnn", "resnet9", "celeba-cnn")
        if cfg.model not in convs:
            raise ValueError(f"method 'fedcg' needs a model with convolutional layers: one of "
                             f"{', '.join(convs)} (got model '{cfg.model}')")
        input_shape, num_classes = dataset_info(cfg.dataset, cfg.data_root)
        fedcg_layer_sizes(cfg.model, input_shape, num_classes, self.spec)  # raises if too big
        if self.clustering == "oracle":
            seen = cfg.data_spec.partition.num_seen_domains
            if cfg.partition != "domains" or self.domains < seen:
                raise ValueError(f"fedcg.clustering='oracle' trains with each image's true domain: it "
                                 f"needs partition 'domains' and fedcg.domains >= its {seen} seen "
                                 f"domains (got partition '{cfg.partition}', fedcg.domains = "
                                 f"{self.domains})")
        if cfg.dp != "off" and self.clustering == "kmeans":
            raise ValueError(f"dp = '{cfg.dp}' with fedcg.clustering = 'kmeans': the K-means phase "
                             "sends each client's fine-tuned model to the server outside any DP "
                             "mechanism; set fedcg.clustering='clf' or 'oracle', or dp='off'")
        self._warn_if_late(cfg.num_rounds)

    def _warn_if_late(self, num_rounds: int) -> None:
        """One log line (once per process) when a warm-up or period is at least num-rounds: the run
        ends before the distance adjacency replaces A = I, or before the student first replaces the
        teacher, so that part of FedCG never acts on training."""
        keys, effects = [], []
        if self.adjacency == "distance" and self.adj_warmup >= num_rounds:
            keys.append(f"fedcg.adj-warmup = {self.adj_warmup}")
            effects.append("the domain graph stays A = I")
        if self.clustering == "clf" and self.teacher_period >= num_rounds:
            keys.append(f"fedcg.teacher-period = {self.teacher_period}")
            effects.append("the random teacher is never replaced by the student")
        if not keys:
            return
        many = len(keys) > 1
        message = (f"run config: {' and '.join(keys)} {'are' if many else 'is'} at least "
                   f"num-rounds = {num_rounds}, so {' and '.join(effects)} while FedCG trains; "
                   f"lower {'them' if many else 'it'} below num-rounds or raise num-rounds")
        if message not in _WARNED:
            _WARNED.add(message)
            log.warning("%s", message)

    @property
    def balanced(self) -> bool:
        """Whether pseudo-domains come from a teacher whose logits are balanced (clf, not none, D > 1)."""
        return self.clustering == "clf" and self.balance != "none" and self.domains > 1

    @property
    def spec(self):  # -> models.fedcg.FedCGSpec (torch models: imported only when needed)
        """The settings that shape the FedCG model."""
        from models.fedcg import FedCGSpec

        return FedCGSpec(num_domains=self.domains, layers=self.layers, gcn_layers=self.gcn_layers,
                         bottleneck=self.bottleneck, use_w=self.use_w, relu=self.relu,
                         residual=self.residual, lambda_init=self.lambda_init,
                         gcn_init=self.gcn_init)


# --- messages -------------------------------------------------------------------------------
STUDENT = "student"  # FedCG: the student domain classifier ϕ, down and up
TEACHER = "teacher"  # FedCG: the frozen teacher domain classifier φ, sent down
GRAPH = "graph"  # FedCG: the domain graph, sent down with the model
ADJACENCY = "adjacency"  # the one array of GRAPH: float32 [D, D], rows sum to 1
FEDCG_METRICS = "fedcg-metrics"  # FedCG: an evaluation reply's domain counts (MetricRecord)
TEACHER_LABELLING = "teacher_labelling"  # FedCG: how the teacher's logits become pseudo-domains
# (float64 `mean`, `scale`, `offset` [D] and `temperature` [1]; strategies.methods.fedcg.domain_balance.Labelling)
TRAIN_FEDCG = "train.fedcg"  # FedCG: pseudo-domains by the teacher, train model and student
EVALUATE_FEDCG = "evaluate.fedcg"  # FedCG: test with the student's (soft) domain weights
QUERY_FEDCG_BALANCE = "query.fedcg_balance"  # FedCG: per-domain sums of a client's teacher logits
BALANCE_STATISTICS = "balance-statistics"  # FedCG, dp='sample': a balance reply's statistics, noised


class FedCGTrainReply(Record):
    """Metrics of a `train.fedcg` reply: the main model's and the student's mean losses, the share of
    local samples where the received student agrees with the teacher, and per-domain sample counts
    of the pseudo-domains used for training (`domain-counts`) and of the received student's argmax.
    `truth-counts` / `student-truth-counts` (flattened [G, D], where the client knows each image's
    true domain g: reporting only) split those counts by true domain for a per-image NMI. Under
    `dp = 'sample'` or `'client'` the counts and the agreement (statistics of the client's data that
    no noise covers, used for the report only) are not sent: None."""

    num_examples: int = Field(ge=0)
    train_loss: float
    student_loss: float
    student_agreement: float | None = Field(None, ge=0.0, le=1.0)
    domain_counts: list[int] | None = None
    student_counts: list[int] | None = None
    truth_counts: list[int] | None = None
    student_truth_counts: list[int] | None = None
    cuda: int | None = Field(None, ge=0, le=1)  # the device it trained on: 1 a CUDA GPU, 0 the CPU


class FedCGBalanceRequest(Record):
    """`query.fedcg_balance`: which statistic of the teacher's logits on the training images the
    server needs: `moments` (per-domain Σ z and Σ z²), `marginals` (Σ softmax of the scores under
    the `teacher_labelling` record sent along, and the hard counts of their argmax) or `sample` (the
    moments and `sample-size` logit rows of images drawn without replacement, seeded by
    (`seed`, client id, `teacher-version`))."""

    statistic: str = Field(pattern="^(moments|marginals|sample)$")
    sample_size: int | None = Field(None, ge=1)
    seed: int | None = None
    teacher_version: int | None = Field(None, ge=0)


class FedCGBalanceReply(Record):
    """Metrics of a `query.fedcg_balance` reply: n_k and D floats per requested sum. Under
    DP (the request carries a `dp-upload` record) the metrics hold n_k alone and the
    statistics travel as the ArrayRecord `balance-statistics` (`statistics_record`), per example
    (sums over n_k), which the client's `dp-upload` layer clips and noises (`from_statistics`)."""

    num_examples: int = Field(ge=0)
    logit_sum: list[float] | None = None
    logit_square_sum: list[float] | None = None
    soft_sum: list[float] | None = None
    hard_counts: list[int] | list[float] | None = None  # floats: noised (dp='sample')
    logit_sample: list[float] | None = None  # `sample`: m rows of D logits, flattened row by row

    def statistics_record(self) -> Any:
        """The reply's statistics as the ArrayRecord `balance-statistics` (float64): the sums
        divided by n_k (so their norm does not grow with the data, and one clipping norm fits every
        client), the logit rows as they are."""
        import numpy as np
        from flwr.app import Array, ArrayRecord

        n = max(self.num_examples, 1)
        arrays = {}
        for name in ("logit_sum", "logit_square_sum", "soft_sum", "hard_counts"):
            values = getattr(self, name)
            if values is not None:
                arrays[name] = Array(np.asarray(values, dtype=np.float64) / n)
        if self.logit_sample is not None:
            arrays["logit_sample"] = Array(np.asarray(self.logit_sample, dtype=np.float64))
        return ArrayRecord(arrays)

    @classmethod
    def from_statistics(cls, num_examples: int, record: Any) -> FedCGBalanceReply:
        """The reply whose statistics came as `balance-statistics` (noised): the sums back as n_k
        times the per-example values (the hard counts as floats)."""
        fields: dict[str, Any] = {"num_examples": num_examples}
        for name in record.keys():
            values = record[name].numpy().astype(float).reshape(-1)
            scale = 1.0 if name == "logit_sample" else float(num_examples)
            fields[name] = (values * scale).tolist()
        return cls(**fields)


class FedCGEvaluateCounts(Record):
    """`fedcg-metrics` of an `evaluate.fedcg` reply: per-domain counts of the test samples' student
    and teacher argmax (for the domain histogram and NMI against true domains), and the correct
    predictions under soft and under hard (argmax) domain weights (the reply's `correct` is the
    configured one's). `truth-counts`: the student's counts split by true domain (flattened [G, D])."""

    student_counts: list[int]
    teacher_counts: list[int]
    soft_correct: float = Field(ge=0)
    hard_correct: float = Field(ge=0)
    truth_counts: list[int] | None = None


class FedCGTrain(TrainInstructions):
    """`train.fedcg`: the student's learning rate, and which pseudo-domains the client trains with:
    the teacher's (default), its K-means cluster (`client-domain`, clustering=kmeans) or each image's
    true domain (`true-domains`, clustering=oracle); `withhold-statistics` (dp='client'): reply with
    the models and no count or agreement statistic."""

    domain_lr: float = Field(gt=0.0)
    client_domain: int | None = Field(None, ge=0)
    true_domains: bool = False
    # dp='client': reply with the models and no count or agreement statistic (dp='sample' says so
    # with its `privacy` record)
    withhold_statistics: bool | None = None


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
METHODS = (Method("fedcg", "strategies.methods.fedcg.server:build", "fedcg", FedCGSection, {
    "train.fedcg": "client_app.methods.fedcg:train", "evaluate.fedcg": "client_app.methods.fedcg:evaluate",
    "query.fedcg_balance": "client_app.methods.fedcg:balance_statistics"},
           privacy=("sample", "client"),
           summary="FedCG: teacher/student domain clustering + GCN-connected domain-specific residual branches"),)
