"""The message contract: record names and one pydantic model per ConfigRecord kind.

Both halves import these, so a renamed key breaks a test instead of a deployment. Keys are spelled in
kebab-case on the wire (Flower's convention, e.g. `server-round`, `num-examples`).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from flwr.app import ConfigRecord, MetricRecord, RecordDict
from pydantic import BaseModel, ConfigDict, Field, model_validator

# ArrayRecord names (what a record holds, as the method specs name them).
GLOBAL = "global"  # the server's global model, sent down
PERSONAL = "personal"  # a client's personalized model, sent down or up
MODEL = "model"  # the model a client trained, sent up
AUTOENCODER = "autoencoder"  # FLT: the convolutional autoencoder (encoder + decoder), down and up
ENCODER = "encoder"  # FLT: the encoder G alone, sent down for Form Client Relatedness
CENTROIDS = "centroids"  # FLT: a client's k-means centroids of its codes, sent up
CENTROIDS_MU = "mu"  # the one array of CENTROIDS: float32 [k, e]
GRAPH_TARGET = "graph_target"  # FedSKA: a client's structure-based features h^g, sent down in train
DESCRIPTOR = "descriptor"  # FedSKA: a client's mean feature h^c, sent up after training
SLOT_FEATURES = "slot_features"  # FedSKA: per-slot features of the global f^e, sent up
SLOT_ENCODING = "slot_encoding"  # FedSKA: GNN_E's encodings of a client's slots, sent down
GRAD = "grad"  # FedSKA: gradient of the client head's loss w.r.t. SLOT_ENCODING, sent up
HEAD = "head"  # FedSKA: the global model's head f^s (`head.*` without the prefix), sent down
H_G = "h_g"  # the one array of GRAPH_TARGET and SLOT_ENCODING: float32 [L, d]
H_C = "h_c"  # the one array of DESCRIPTOR: float32 [d]
SLOT_P = "p"  # the one array of SLOT_FEATURES: float32 [L, d]
GRAD_G = "g"  # the one array of GRAD: float32 [L, d]
STUDENT = "student"  # FedCG: the student domain classifier ϕ, down and up
TEACHER = "teacher"  # FedCG: the frozen teacher domain classifier φ, sent down
GRAPH = "graph"  # FedCG: the domain graph, sent down with the model
ADJACENCY = "adjacency"  # the one array of GRAPH: float32 [D, D], rows sum to 1
FEDCG_METRICS = "fedcg-metrics"  # FedCG: an evaluation reply's domain counts (MetricRecord)
TEACHER_LABELLING = "teacher_labelling"  # FedCG: how the teacher's logits become pseudo-domains
# (float64 `mean`, `scale`, `offset` [D] and `temperature` [1]; strategies.domain_balance.Labelling)
# ConfigRecord / MetricRecord names.
CONFIG = "config"
FUSED = "fused-evaluate"  # a train message that carries an evaluation too (FusedEvaluation)
EVALUATION_PREFIX = "evaluate:"  # record name prefix of the evaluation part of a fused message
CLIENT = "client"  # which logical client a message is for (added by ClientGrid)
METRICS = "metrics"

# Message types.
TRAIN = "train"
EVALUATE = "evaluate"
IDENTIFY = "query.identify"
TRAIN_LOCAL = "train.local"
TRAIN_DITTO = "train.ditto"
TRAIN_FLT_AE = "train.flt_ae"  # FLT phase 1: federated autoencoder round
QUERY_FLT_EMBED = "query.flt_embed"  # FLT phase 2: encode local data, reply k-means centroids
TRAIN_IFCA = "train.ifca"
EVALUATE_IFCA = "evaluate.ifca"
TRAIN_SFL = "train.sfl"  # SFL / SFL*: train from `global` with pulls toward `global` and `personal`
TRAIN_FEDSKA = "train.fedska"  # FedSKA: train from `global` with the cosine pull toward `graph_target`
QUERY_SKA_EMBED = "query.ska_embed"  # FedSKA: per-slot features of `global`'s feature extractor
QUERY_SKA_GRAD = "query.ska_grad"  # FedSKA: head loss gradient w.r.t. the received slot encodings
TRAIN_FEDCG = "train.fedcg"  # FedCG: pseudo-domains by the teacher, train model and student
EVALUATE_FEDCG = "evaluate.fedcg"  # FedCG: test with the student's (soft) domain weights
QUERY_FEDCG_BALANCE = "query.fedcg_balance"  # FedCG: per-domain sums of a client's teacher logits

Contract = TypeVar("Contract", bound="_Record")


def _kebab(name: str) -> str:
    return name.rstrip("_").replace("_", "-")


class _Record(BaseModel):
    """A ConfigRecord/MetricRecord schema: frozen, kebab-case keys, unknown keys rejected."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=_kebab, populate_by_name=True
    )

    @classmethod
    def read(cls: type[Contract], record: Any) -> Contract:
        """Parse a received ConfigRecord or MetricRecord."""
        return cls.model_validate(dict(record))

    def values(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)

    def config(self) -> ConfigRecord:
        return ConfigRecord(self.values())

    def metrics(self) -> MetricRecord:
        return MetricRecord(self.values())


class ClientAddress(_Record):
    """Which logical client a message is for; one SuperNode may host several."""

    client_id: int = Field(ge=0)


class IdentifyRequest(_Record):
    """`query.identify`: the server asks a node which clients it hosts."""

    code_fingerprint: str
    num_clients: int = Field(ge=1)


class IdentifyReply(_Record):
    """A node's answer: its partition slot and the code it runs."""

    partition_id: int = Field(ge=0)
    num_partitions: int = Field(ge=1)
    code_fingerprint: str
    device: str
    # train / test sample counts of the hosted clients, in client-id order (partition-id, + n, ...);
    # replies claiming more examples than declared are dropped (strategies.validation)
    train_sizes: list[int] = Field(default_factory=list)
    test_sizes: list[int] = Field(default_factory=list)


class TrainInstructions(_Record):
    """`train` / `train.<method>`: the local-training hyperparameters of one round."""

    server_round: int = Field(ge=1)
    lr: float = Field(gt=0.0)
    momentum: float = Field(ge=0.0, lt=1.0)
    local_epochs: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    seed: int = Field(ge=0)
    proximal_mu: float = Field(0.0, ge=0.0)  # FedProx (Flower's FedProx adds this key)
    ditto_lambda: float | None = Field(None, ge=0.0)
    personal_epochs: int | None = Field(None, ge=1)
    lambda_personal: float | None = Field(None, ge=0.0)  # SFL λ1: pull ||θ − u_i||_2
    lambda_global: float | None = Field(None, ge=0.0)  # SFL λ2: pull ||θ − w||_2
    reg_grad: bool | None = None  # SFL: pulls carry gradients (false = reference code)
    start: Literal["global", "personal"] = "global"  # SFL: θ starts from w (spec) or from u_i
    lambda_s: float | None = Field(None, ge=0.0)  # FedSKA λ_S: weight of the cosine pull L_S
    num_slots: int | None = Field(None, ge=1)  # FedSKA L: aligned slots of `graph_target`
    domain_lr: float | None = Field(None, gt=0.0)  # FedCG: SGD learning rate of the student
    num_domains: int | None = Field(None, ge=1)  # FedCG D
    client_domain: int | None = Field(None, ge=0)  # FedCG, clustering=kmeans: the client's cluster
    true_domains: bool | None = None  # FedCG, clustering=oracle: train with each image's true domain


class TrainReply(_Record):
    """Metrics of a training reply; `num-examples` weights aggregation."""

    num_examples: int = Field(ge=0)
    train_loss: float
    cluster: int | None = Field(None, ge=0)  # IFCA: index of the cluster model the client trained
    structure_loss: float | None = None  # FedSKA: mean L_S (1 − cos to h^g) of the local training
    cuda: int | None = Field(None, ge=0, le=1)  # the device it trained on: 1 a CUDA GPU, 0 the CPU


class EvaluateInstructions(_Record):
    """`evaluate`: evaluate the received model(s) on the client's own test split."""

    server_round: int = Field(ge=0)
    batch_size: int = Field(ge=1)
    seed: int = Field(ge=0)
    finetune_epochs: int = Field(0, ge=0)
    lr: float = Field(gt=0.0)
    momentum: float = Field(ge=0.0, lt=1.0)
    soft: bool | None = None  # FedCG: soft (student probabilities) or hard (argmax) test domains


class EvaluateReply(_Record):
    """Per-client test metrics of the model the client would use (personal if any): `accuracy` for
    classification, or `mae` / `mape` / `rmse` for regression (traffic; de-normalised speeds, MAPE a
    fraction, zeros/missing skipped, NaN when a client has no valid target; averaged over the 12 horizon
    steps, `*-h12` at the last step). `correct` is 0 for regression. `global-*` / `finetuned-*`: the
    global model, and the global model after local fine-tuning epochs."""

    num_examples: int = Field(ge=0)
    correct: float = Field(ge=0)
    loss: float
    accuracy: float | None = Field(None, ge=0.0, le=1.0)
    global_correct: float | None = Field(None, ge=0)
    global_accuracy: float | None = Field(None, ge=0.0, le=1.0)
    finetuned_correct: float | None = Field(None, ge=0)
    finetuned_accuracy: float | None = Field(None, ge=0.0, le=1.0)
    mae: float | None = None
    mape: float | None = None
    rmse: float | None = None
    mae_h12: float | None = None
    mape_h12: float | None = None
    rmse_h12: float | None = None
    global_mae: float | None = None
    global_mape: float | None = None
    global_rmse: float | None = None
    finetuned_mae: float | None = None
    finetuned_mape: float | None = None
    finetuned_rmse: float | None = None

    @model_validator(mode="after")
    def _one_task(self) -> EvaluateReply:
        if (self.accuracy is None) == (self.mae is None):
            raise ValueError("an evaluate reply carries exactly one of 'accuracy' (classification) "
                             "and 'mae' (regression)")
        return self


class FusedEvaluation(_Record):
    """`fused-evaluate` of a train message that also carries the previous round's evaluation
    (`strategies.fusion`): the client runs the evaluation first, then the training. The evaluation's
    records travel as `evaluate:<name>`, except `shared` ones, which are identical to the train
    record of the same name and travel once."""

    message_type: str = Field(pattern=r"^evaluate(\.[A-Za-z_][A-Za-z0-9_]*)?$")
    shared: list[str] = Field(default_factory=list)


class AutoencoderInstructions(_Record):
    """`train.flt_ae` (FLT phase 1): F epochs of reconstruction MSE with Adam on the local data."""

    ae_round: int = Field(ge=1)
    epochs: int = Field(ge=1)
    lr: float = Field(gt=0.0)
    batch_size: int = Field(ge=1)
    latent_dim: int = Field(ge=1)
    seed: int = Field(ge=0)


class AutoencoderReply(_Record):
    """Metrics of a `train.flt_ae` reply; `num-examples` weights the FedAvg of the autoencoders."""

    num_examples: int = Field(ge=0)
    recon_loss: float


class EmbedInstructions(_Record):
    """`query.flt_embed` (FLT phase 2): encode the local train split, reply k k-means centroids
    (k-mode `fixed`: k; `local-labels`: min(k, number of distinct local labels))."""

    k: int = Field(ge=1)
    k_mode: str = Field(pattern="^(fixed|local-labels)$")
    kmeans_seed: int = Field(ge=0)
    latent_dim: int = Field(ge=1)


class EmbedReply(_Record):
    """The only metric of a `query.flt_embed` reply (beside the `centroids` record)."""

    num_examples: int = Field(ge=0)


class SlotInstructions(_Record):
    """`query.ska_embed` / `query.ska_grad` (FedSKA): the number L of aligned slots; slot l is the
    client's train sample π(l mod N) under its seeded permutation π (from `seed`)."""

    num_slots: int = Field(ge=1)
    seed: int = Field(ge=0)


class SlotReply(_Record):
    """Metrics of a FedSKA slot reply; `loss` (query.ska_grad) = (1/L) Σ_l loss(f^s(h^g[l]), y)."""

    num_examples: int = Field(ge=0)
    loss: float | None = None


class FedCGTrainReply(_Record):
    """Metrics of a `train.fedcg` reply: the main model's and the student's mean losses, the share of
    local samples where the received student agrees with the teacher, and per-domain sample counts
    of the pseudo-domains used for training (`domain-counts`) and of the received student's argmax.
    `truth-counts` / `student-truth-counts` (flattened [G, D], where the client knows each image's
    true domain g: reporting only) split those counts by true domain for a per-image NMI."""

    num_examples: int = Field(ge=0)
    train_loss: float
    student_loss: float
    student_agreement: float = Field(ge=0.0, le=1.0)
    domain_counts: list[int]
    student_counts: list[int]
    truth_counts: list[int] | None = None
    student_truth_counts: list[int] | None = None
    cuda: int | None = Field(None, ge=0, le=1)  # the device it trained on: 1 a CUDA GPU, 0 the CPU


class FedCGBalanceRequest(_Record):
    """`query.fedcg_balance`: which statistic of the teacher's logits on the training images the
    server needs: `moments` (per-domain Σ z and Σ z²) or `marginals` (Σ softmax of the scores under
    the `teacher_labelling` record sent along, and the hard counts of their argmax)."""

    statistic: str = Field(pattern="^(moments|marginals)$")


class FedCGBalanceReply(_Record):
    """Metrics of a `query.fedcg_balance` reply: n_k and D floats per requested sum."""

    num_examples: int = Field(ge=0)
    logit_sum: list[float] | None = None
    logit_square_sum: list[float] | None = None
    soft_sum: list[float] | None = None
    hard_counts: list[int] | None = None


class FedCGEvaluateCounts(_Record):
    """`fedcg-metrics` of an `evaluate.fedcg` reply: per-domain counts of the test samples' student
    and teacher argmax (for the domain histogram and NMI against true domains), and the correct
    predictions under soft and under hard (argmax) domain weights (the reply's `correct` is the
    configured one's). `truth-counts`: the student's counts split by true domain (flattened [G, D])."""

    student_counts: list[int]
    teacher_counts: list[int]
    soft_correct: float = Field(ge=0)
    hard_correct: float = Field(ge=0)
    truth_counts: list[int] | None = None


def cluster_model(index: int) -> str:
    """ArrayRecord name of cluster model `index`; IFCA sends all C: `cluster-0`, `cluster-1`, ..."""
    return f"cluster-{index}"


def with_client(content: RecordDict, client_id: int) -> RecordDict:
    """A copy of `content` addressed to one logical client (records are shared, not copied)."""
    records = dict(content.items())
    records[CLIENT] = ClientAddress(client_id=client_id).config()
    return RecordDict(records)
