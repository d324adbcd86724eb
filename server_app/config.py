"""The run configuration: one typed, frozen `RunConfig` built from Flower's flat `run_config`.

Flower hands the app a flat mapping (`num-rounds`, `fedprox.mu`, ...). Keys without a dot are common
settings; `<method>.<key>` keys belong to that method's section. Every value is validated here, before
any client is contacted, and a problem is reported as one line naming the key, the value and what is
allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator,
)

from datasets.federated import DataSpec, dataset_info
from datasets.partition import PARTITION_SCHEMES, PartitionSpec
from datasets.sources import SOURCE_NAMES, dataset_task
from models import MODEL_NAMES, SEQUENCE_MODELS


_CHOICES = {"dataset": SOURCE_NAMES, "partition": PARTITION_SCHEMES, "model": MODEL_NAMES}


class ConfigError(ValueError):
    """An invalid run configuration; the message is one line a user can act on."""


def _kebab(name: str) -> str:
    return name.rstrip("_").replace("_", "-")


class _Settings(BaseModel):
    """Frozen, strict about unknown keys, spelled in kebab-case like Flower's run config."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=_kebab, populate_by_name=True
    )


class _GraphFileRule(_Settings):
    """Sections that read their client graph from `<section>.graph-file` when `graph='file'`."""

    section: ClassVar[str]

    @field_validator("graph_file", check_fields=False)
    @classmethod
    def _file_iff_graph_file(cls, value: str, info: ValidationInfo) -> str:
        graph, key = info.data.get("graph"), cls.section
        if graph == "file" and not value:
            raise ValueError(f"{key}.graph='file' needs a path: set {key}.graph-file to a .npy or "
                             ".csv adjacency matrix [num-clients, num-clients]")
        if value and graph not in (None, "file"):
            raise ValueError(f"a graph file is only read with {key}.graph='file' (got {key}.graph="
                             f"'{graph}'); set {key}.graph='file' or leave {key}.graph-file empty")
        return value


class FedProxSection(_Settings):
    """FedProx: weight μ of the proximal term (μ/2)·||w − w_global||²."""

    mu: float = Field(0.01, ge=0.0)


class DittoSection(_Settings):
    """Ditto: weight λ of the pull (λ/2)·||v − w_global||² and local epochs of the personal model."""

    lambda_: float = Field(0.1, ge=0.0)
    personal_epochs: int = Field(1, ge=1)


class FLTSection(_Settings):
    """FLT (specs/flt.md): autoencoder phases, Form Client Relatedness and the graph threshold."""

    gamma: float = Field(1.0, gt=0.0)  # γ: connect clients closer than γ (UMAP units)
    k: int = Field(2, ge=1)  # k-means centroids per client (the maximum under k-mode=local-labels)
    k_mode: Literal["fixed", "local-labels"] = "fixed"
    distance: Literal["matching", "min-pair"] = "matching"
    clusters: int = Field(0, ge=0)  # C > 0: Ward clusters of Ã, one model per cluster
    latent_dim: int = Field(128, ge=1)  # e
    ae_rounds: int = Field(1, ge=0)  # federated autoencoder rounds (train.flt_ae) before FCR
    ae_epochs: int = Field(2, ge=1)  # F: local reconstruction epochs per autoencoder round
    ae_lr: float = Field(0.001, gt=0.0)  # Adam
    ae_batch_size: int = Field(32, ge=1)
    pretrain_samples: int = Field(0, ge=0)  # > 0: server pretraining on samples no client holds
    pretrain_epochs: int = Field(5, ge=1)
    umap_neighbors: int = Field(15, ge=2)  # n_neighbors = min(this, Σk − 1)
    fresh_only: bool = False  # average only the neighbours trained this round (spec: stale included)


class IFCASection(_Settings):
    """IFCA: number C of cluster models (every sampled client receives all C each round)."""

    clusters: int = Field(5, ge=1)


class FedSEMSection(_Settings):
    """FedSEM (FeSEM): number C of K-means centres over the client models."""

    clusters: int = Field(5, ge=1)


class SFLSection(_GraphFileRule):
    """SFL / SFL* (specs/sfl.md): client graph, GCN hops L and α, local pulls λ1/λ2, SFL*'s learner."""

    section: ClassVar[str] = "sfl"

    graph: Literal["label-sharing", "road", "file", "none"] = "label-sharing"  # the prior A
    graph_file: str = Field("", validate_default=True)  # .npy / .csv adjacency for graph='file'
    hops: int = Field(1, ge=0)  # L (spec: 3)
    alpha: float = Field(0.5, ge=0.0, le=1.0)  # U = α·Â^L·V + (1−α)·V (spec: 1.0)
    lambda_personal: float = Field(0.3, ge=0.0)  # λ1·||θ − u_i||_2
    lambda_global: float = Field(0.3, ge=0.0)  # λ2·||θ − w||_2
    reg_grad: bool = False  # true: the pulls carry gradients (spec); false: constants (reference code)
    start: Literal["global", "personal"] = "personal"  # clients start from u_i, or from w (spec)
    propagation: Literal["auto", "graph-first", "rows-first"] = "auto"
    beta: float = Field(1.0, ge=0.0, le=1.0)  # SFL*: A = (1−β)·Â_prior + β·A_learn (spec: 0.05)
    # rows of V read by the propagation, the read-out and SFL*'s learner: `trained` leaves out the
    # rows of clients that never trained (still w0), renormalising Â's rows; `all` = the spec
    rows: Literal["trained", "all"] = "trained"
    staleness_decay: float = Field(0.5, gt=0.0, le=1.0)  # rows='trained': weight decay^(age in rounds)
    gl_k: int = Field(5, ge=1)  # top-k per row of the learned graph (at most N − 1)
    gl_model: Literal["mtgnn", "knn"] = "knn"  # knn: top-k of the model similarity itself
    gl_features: Literal["models", "updates"] = "updates"  # distances of V's rows, or of the updates
    gl_dim: int = Field(40, ge=1)  # m, node-embedding size
    gl_scale: float = Field(3.0, gt=0.0)  # a, tanh saturation
    gl_init_std: float = Field(0.1, gt=0.0)  # std of the node embeddings at init (reference: 1.0)
    gl_steps: int = Field(50, ge=1)  # learner steps per round
    gl_lr: float = Field(0.01, gt=0.0)
    gl_optimizer: Literal["adam", "sgd"] = "adam"
    gl_weight_decay: float = Field(0.0, ge=0.0)
    gl_persist: bool = True  # false: a fresh learner every round (reference code)
    gl_target: Literal["similarity", "distance"] = "similarity"
    gl_symmetric: bool = True  # export topk(A_L) + its transpose (reference: false)
    gl_self_loops: bool = True  # add self-loops to the exported graph (reference: false)


class FedSKASection(_Settings):
    """FedSKA (specs/fedska.md): local cosine pull, structure learner, GNN_D denoising, GNN_E split
    learning."""

    lambda_s: float = Field(0.01, ge=0.0)  # λ_S of L_C + λ_S·L_S (Eq 9; [C] 0.01, [P] 1)
    k: int = Field(10, ge=1)  # kNN: top-(k+1) per row, self included (capped at num-clients − 1)
    structure_steps: int = Field(10, ge=0)  # E_S: denoising (L_D) steps per round
    encoder_steps: int = Field(2, ge=0)  # E_g: split-learning exchanges (query.ska_grad) per round
    mask_ratio: float = Field(0.01, gt=0.0, le=1.0)  # r: Bernoulli ratio of noised entries
    noise: Literal["normal", "mask"] = "normal"  # H^c + M⊙N(0,1), or H^c⊙(1−M)
    denoiser_hidden: int = Field(64, ge=1)  # GNN_D: d → h → h → d
    structure_lr: float = Field(0.01, gt=0.0)  # Adam of the MLP + GNN_D
    encoder_lr: float = Field(0.01, gt=0.0)  # Adam of GNN_E
    encoder_weight_decay: float = Field(0.01, ge=0.0)
    encoder: Literal["gcn", "identity"] = "gcn"  # GNN_E; `identity` = the reference code (h^g = P)
    max_slots: int = Field(1024, ge=1)  # cap of L = max_k N_k
    graph: Literal["learned", "label-sharing"] = "learned"  # S: learned, or the given graph (Table 3)
    tau: float = Field(0.0, ge=0.0, le=1.0)  # S ← τ·Â0 + (1−τ)·S with the label-sharing Â0 ([C] 0.9)


class FedUSection(_GraphFileRule):
    """FedU: local training + a Laplacian step over a given client graph each round."""

    section: ClassVar[str] = "fedu"

    graph: Literal["label-sharing", "road", "file"] = "label-sharing"
    graph_file: str = Field("", validate_default=True)  # .npy / .csv adjacency for graph='file'
    lambda_: float = Field(0.1, ge=0.0)  # λ of w_k ← w_k − η·λ·Σ_l a_kl (w_k − w_l) ([C] L_K 0.1)


class FedCGSection(_Settings):
    """FedCG (specs/fedcg.md): domain clustering (teacher/student), FedCG layers, GCN and adjacency."""

    domains: int = Field(4, ge=1)  # D
    teacher_period: int = Field(10, ge=1)  # T: the teacher is replaced by the student every T rounds
    beta: float = Field(0.5, ge=0.0, le=1.0)  # A_ii = β (eq. 7)
    adj_warmup: int = Field(10, ge=0)  # A = I before this round (spec: = T)
    adjacency: Literal["distance", "identity", "uniform", "random"] = "distance"
    layers: Literal["last", "all"] = "last"  # which conv layers become FedCG layers
    gcn_layers: Literal[1, 2] = 2  # 1: full W [q, q]; 2: bottleneck W1 [q, b], W2 [b, q]
    bottleneck: int = Field(64, ge=1)  # b
    use_w: bool = True  # false: a weight-free GCN
    relu: bool = True  # σ = ReLU on the GCN outputs (false: identity)
    residual: bool = True  # false: branch only (no agnostic layer)
    lambda_init: float = 0.1  # initial λ of every FedCG layer
    gcn_init: Literal["glorot", "scaled"] = "glorot"  # GCN weights: Glorot (spec) or variance-preserving
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


class RunConfig(_Settings):
    """Every setting of a Bouquet run (see pyproject.toml `[tool.flwr.app.config]` for defaults)."""

    method: str = "sfl"
    dataset: str = "mnist"
    data_root: str | None = None
    partition: str = "label-clusters"
    num_clients: int = Field(10, ge=1)
    num_rounds: int = Field(5, ge=1)
    fraction_train: float = Field(1.0, gt=0.0, le=1.0)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.05, gt=0.0)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int = Field(0, ge=0)
    model: str = "mlp"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    run_name: str = ""
    output_dir: str = "outputs"
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    max_samples_per_client: int = Field(300, ge=0)
    shards_per_client: int = Field(2, ge=1)
    dirichlet_alpha: float = Field(0.5, gt=0.0)
    num_clusters: int = Field(5, ge=1)
    labels_per_cluster: int = Field(2, ge=1)
    power_law: bool = False
    domain_rotations: str = "0,90,180,270"
    domain_test_clients: float = Field(0.0, ge=0.0, lt=1.0)  # domains: share of whole test clients
    domain_unseen_rotations: str = ""  # domains: angles only the held-out test clients see
    domain_family: Literal["rotations", "styles"] = "rotations"  # domains: what makes a domain
    domain_styles: str = "plain,inverted,noisy,thick"  # domains, family styles: the train domains
    domain_unseen_styles: str = ""  # domains, family styles: styles only held-out test clients see
    domains_per_client: int = Field(1, ge=1)  # domains: k domains per train client (images split)
    eval_every: int = Field(1, ge=1)
    # send round r's evaluation with round r + 1's train message (one phase per round); false: a
    # separate evaluate phase after each evaluated round (strategies/fusion.py)
    fuse_evaluate: bool = True
    finetune_epochs: int = Field(1, ge=0)
    round_timeout: float = Field(600.0, gt=0.0)
    max_update_norm: float = Field(10000.0, ge=0.0)  # drop replies whose model moved further (0 = off)
    aggregation: Literal["mean", "median", "trimmed-mean"] = "mean"  # the global part's rule
    trim_fraction: float = Field(0.2, ge=0.0, lt=0.5)  # aggregation='trimmed-mean': cut per side
    resume: bool = False  # continue run-name from its newest valid checkpoint
    checkpoint_every: int = Field(1, ge=0)  # checkpoint after every n-th round (and the last; 0 = off)
    client_threads: int = Field(0, ge=0)
    traffic_days: int = Field(0, ge=0)  # traffic: days of the series (0 = all; traffic-synthetic: 14)
    fedprox: FedProxSection = FedProxSection()
    ditto: DittoSection = DittoSection()
    flt: FLTSection = FLTSection()
    ifca: IFCASection = IFCASection()
    fedsem: FedSEMSection = FedSEMSection()
    sfl: SFLSection = SFLSection()
    fedska: FedSKASection = FedSKASection()
    fedu: FedUSection = FedUSection()
    fedcg: FedCGSection = FedCGSection()

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        from strategies.registry import METHOD_NAMES  # the registry is the source of truth

        return _one_of(value, METHOD_NAMES)

    @field_validator("dataset", "partition", "model")
    @classmethod
    def _known_choice(cls, value: str, info: ValidationInfo) -> str:
        return _one_of(value, _CHOICES[info.field_name])

    @field_validator("data_root", mode="before")
    @classmethod
    def _empty_root_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("domain_rotations")
    @classmethod
    def _rotation_list(cls, value: str) -> str:
        try:
            angles = [float(part) for part in value.split(",")]
        except ValueError:
            raise ValueError("must be comma-separated angles in degrees, e.g. '0,90,180,270'") from None
        if not angles:
            raise ValueError("must list at least one angle")
        return value

    @field_validator("domain_unseen_rotations", mode="before")
    @classmethod
    def _one_angle_is_a_list(cls, value: Any) -> Any:
        """`domain-unseen-rotations=45` arrives as a number; it means the list '45'."""
        return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    @field_validator("domain_unseen_rotations")
    @classmethod
    def _unseen_rotation_list(cls, value: str) -> str:
        if value.strip():
            try:
                [float(part) for part in value.split(",")]
            except ValueError:
                raise ValueError("must be empty or comma-separated angles in degrees, e.g. '45'") from None
        return value

    @field_validator("domain_styles", "domain_unseen_styles")
    @classmethod
    def _style_list(cls, value: str, info: ValidationInfo) -> str:
        from datasets.domains import STYLES

        for name in cls._names(value):
            if name not in STYLES:
                raise ValueError(f"unknown style {name!r}; allowed styles: {', '.join(STYLES)}")
        if info.field_name == "domain_styles" and not cls._names(value):
            raise ValueError(f"must list at least one style of {', '.join(STYLES)}")
        return value

    @staticmethod
    def _names(text: str) -> tuple[str, ...]:
        return tuple(part.strip() for part in text.split(",") if part.strip())

    @model_validator(mode="after")
    def _held_out_domains(self) -> RunConfig:
        if self.domain_test_clients > 0 and self.partition != "domains":
            raise ValueError(f"domain-test-clients = {self.domain_test_clients} holds out whole test "
                             f"clients of partition 'domains' only (got partition '{self.partition}')")
        if self.domain_unseen_rotations.strip() and self.domain_test_clients <= 0:
            raise ValueError("domain-unseen-rotations needs held-out test clients: set "
                             "domain-test-clients > 0 (e.g. 0.2)")
        if self.domain_unseen_styles.strip() and self.domain_test_clients <= 0:
            raise ValueError("domain-unseen-styles needs held-out test clients: set "
                             "domain-test-clients > 0 (e.g. 0.2)")
        seen = self.data_spec.partition.num_seen_domains
        if self.partition == "domains" and self.domains_per_client > seen:
            raise ValueError(f"domains-per-client = {self.domains_per_client} exceeds the {seen} seen "
                             f"domains of family '{self.domain_family}'; lower it or list more domains")
        return self

    @model_validator(mode="after")
    def _fedcg_fits(self) -> RunConfig:
        """FedCG needs an image model with conv layers; the 1-layer GCN a small enough layer."""
        if self.method != "fedcg":
            return self
        from models.fedcg import fedcg_layer_sizes  # torch models: imported only when needed

        convs = ("cnn", "leaf-cnn", "resnet9")
        if self.model not in convs:
            raise ValueError(f"method 'fedcg' needs a model with convolutional layers: one of "
                             f"{', '.join(convs)} (got model '{self.model}')")
        input_shape, num_classes = dataset_info(self.dataset, self.data_root)
        fedcg_layer_sizes(self.model, input_shape, num_classes, self.fedcg.spec)  # raises if too big
        return self

    @model_validator(mode="after")
    def _clients_per_round(self) -> RunConfig:
        if int(self.fraction_train * self.num_clients) < 1:
            raise ValueError(
                f"fraction-train × num-clients = {self.fraction_train} × {self.num_clients} "
                "selects no client; raise fraction-train or num-clients"
            )
        return self

    @model_validator(mode="after")
    def _settings_fit_together(self) -> RunConfig:
        """Cross-field rules: values that are valid alone but not together. A per-client count that
        must stay below num-clients (kNN k, cluster counts) is capped when left at its default and
        an error when set explicitly."""
        from datasets.sources import SOURCE_INFO

        if self.resume and not self.run_name:
            raise ValueError("resume=true needs run-name (and output-dir) of the run to continue; "
                             "a run without run-name gets a new timestamped directory")
        if self.partition == "domains" and self.domain_family == "rotations" and len(self.rotations) < 2:
            raise ValueError(f"partition 'domains' needs at least 2 domains, but domain-rotations="
                             f"'{self.domain_rotations}' lists {len(self.rotations)}; list two or "
                             "more angles, e.g. '0,90,180,270'")
        if self.partition == "domains" and self.domain_family == "styles" and len(self._names(
                self.domain_styles)) < 2:
            raise ValueError(f"partition 'domains' needs at least 2 domains, but domain-styles="
                             f"'{self.domain_styles}' lists fewer; list two or more styles, e.g. "
                             "'plain,inverted,noisy,thick'")
        if self.method == "fedcg" and self.fedcg.clustering == "oracle":
            seen = self.data_spec.partition.num_seen_domains
            if self.partition != "domains" or self.fedcg.domains < seen:
                raise ValueError(f"fedcg.clustering='oracle' trains with each image's true domain: it "
                                 f"needs partition 'domains' and fedcg.domains >= its {seen} seen "
                                 f"domains (got partition '{self.partition}', fedcg.domains = "
                                 f"{self.fedcg.domains})")
        if self.partition == "label-clusters" and self.dataset in SOURCE_INFO:
            classes = SOURCE_INFO[self.dataset][1]
            if self.num_clusters * self.labels_per_cluster > classes:
                raise ValueError(
                    f"num-clusters × labels-per-cluster = {self.num_clusters} × "
                    f"{self.labels_per_cluster} exceeds the {classes} classes of '{self.dataset}'; "
                    "lower one of them")
            explicit = self.num_clusters != type(self).model_fields["num_clusters"].default
            if self.num_clusters > self.num_clients and explicit:  # a default is capped
                raise ValueError(f"num-clusters = {self.num_clusters} exceeds num-clients = "
                                 f"{self.num_clients}; every cluster needs a client")
        if self.aggregation != "mean":
            from strategies.registry import ROBUST_METHODS

            if self.method not in ROBUST_METHODS:
                raise ValueError(
                    f"aggregation='{self.aggregation}' applies to the global part of "
                    f"{', '.join(ROBUST_METHODS)}; method '{self.method}' aggregates over a client "
                    "graph or clusters: set aggregation='mean'")
        below_clients = {
            "sfl-star": ("sfl", "gl_k"), "fedska": ("fedska", "k"), "ifca": ("ifca", "clusters"),
            "fedsem": ("fedsem", "clusters"), "flt": ("flt", "clusters"),
        }
        if self.method in below_clients:
            section_name, field = below_clients[self.method]
            section = getattr(self, section_name)
            value = getattr(section, field)
            default = type(section).model_fields[field].default
            limit = self.num_clients if field == "clusters" else self.num_clients - 1
            if value != default and value > limit:
                key = f"{section_name}.{_kebab(field)}"
                raise ValueError(f"{key} = {value} must be at most {limit} with num-clients = "
                                 f"{self.num_clients}; lower {key} or raise num-clients")
        return self

    @model_validator(mode="after")
    def _task_fits(self) -> RunConfig:
        """Traffic (regression) data sets need partition 'sensors' and a sequence model, and only they
        take them."""
        traffic = dataset_task(self.dataset) == "regression"
        if traffic and self.partition != "sensors":
            raise ValueError(f"dataset '{self.dataset}' is traffic (one client per sensor): set "
                             f"partition='sensors' (got '{self.partition}')")
        if not traffic and self.partition == "sensors":
            raise ValueError(f"partition 'sensors' is for the traffic data sets; dataset '{self.dataset}' "
                             "takes iid, dirichlet, shards, label-clusters, domains or natural")
        if traffic != (self.model in SEQUENCE_MODELS):
            allowed = SEQUENCE_MODELS if traffic else tuple(m for m in MODEL_NAMES if m not in SEQUENCE_MODELS)
            raise ValueError(f"model '{self.model}' does not fit dataset '{self.dataset}'; allowed models: "
                             f"{', '.join(allowed)}")
        return self

    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any]) -> RunConfig:
        """Validate Flower's flat run config; raise `ConfigError` with one actionable line."""
        nested: dict[str, Any] = {}
        for key, value in run_config.items():
            section, dot, name = key.partition(".")
            if dot:
                nested.setdefault(section, {})[name] = value
            else:
                nested[key] = value
        try:
            return cls.model_validate(nested)
        except ValidationError as err:
            raise ConfigError(_describe(err, nested)) from None

    @cached_property
    def rotations(self) -> tuple[float, ...]:
        return tuple(float(part) for part in self.domain_rotations.split(","))

    @cached_property
    def unseen_rotations(self) -> tuple[float, ...]:
        text = self.domain_unseen_rotations.strip()
        return tuple(float(part) for part in text.split(",")) if text else ()

    @cached_property
    def data_spec(self) -> DataSpec:
        """What a client needs to load its partition: dataset, root and the partition parameters."""
        return DataSpec(
            dataset=self.dataset,
            data_root=self.data_root,
            traffic_days=self.traffic_days,
            partition=PartitionSpec(
                scheme=self.partition,
                num_clients=self.num_clients,
                seed=self.seed,
                test_fraction=self.test_fraction,
                alpha=self.dirichlet_alpha,
                shards_per_client=self.shards_per_client,
                num_clusters=min(self.num_clusters, self.num_clients),  # capped default (checked above)
                labels_per_cluster=self.labels_per_cluster,
                power_law=self.power_law,
                rotations=self.rotations,
                max_samples_per_client=self.max_samples_per_client,
                test_clients=self.domain_test_clients,
                unseen_rotations=self.unseen_rotations,
                family=self.domain_family,
                styles=self._names(self.domain_styles),
                unseen_styles=self._names(self.domain_unseen_styles),
                domains_per_client=self.domains_per_client,
            ),
        )

    def flat(self) -> dict[str, Any]:
        """The config as Flower-style flat keys (for `config.json` and reproduction)."""
        out: dict[str, Any] = {}
        for key, value in self.model_dump(by_alias=True).items():
            if isinstance(value, dict):
                out.update({f"{key}.{name}": item for name, item in value.items()})
            else:
                out[key] = value
        return out


def _one_of(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"allowed values are {', '.join(repr(a) for a in allowed)}")
    return value


def _describe(err: ValidationError, given: Mapping[str, Any]) -> str:
    """Turn pydantic's first error into: run config key 'k' = v is invalid: <what is allowed>."""
    first = err.errors()[0]
    loc = [str(part) for part in first["loc"]]
    key = ".".join(loc) if loc else "(config)"
    if first["type"] == "extra_forbidden":
        section = RunConfig if len(loc) == 1 else _section_model(loc[0])
        allowed = ", ".join(_allowed_keys(section)) if section else "see pyproject.toml"
        return f"run config: unknown key '{key}'; allowed keys: {allowed}"
    if not loc:
        return f"run config: {first['msg'].removeprefix('Value error, ')}"
    value = given
    for part in loc:
        value = value.get(part) if isinstance(value, Mapping) else None
    message = first["msg"].removeprefix("Value error, ")
    return f"run config: key '{key}' = {value!r} is invalid: {message}"


def _section_model(name: str) -> type[_Settings] | None:
    field = RunConfig.model_fields.get(name.replace("-", "_"))
    annotation = field.annotation if field else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, _Settings) else None


def _allowed_keys(model: type[_Settings]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]
