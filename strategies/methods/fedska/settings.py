"""FedSKA: its settings (`fedska.*` run-config keys) and the messages only it sends."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from strategies.shared.method import Method
from strategies.shared.settings import MethodSettings, Record
from strategies.shared.messages import TrainInstructions, TrainReply


class FedSKASection(MethodSettings):
    """FedSKA (docs/methods/fedska.md): local cosine pull, structure learner, GNN_D denoising, GNN_E split
    learning."""

    lambda_s: float = Field(0.01, ge=0.0)  # λ_S of L_C + λ_S·L_S (Eq 9; [C] 0.01, [P] 1)
    k: int = Field(3, ge=1)  # kNN: top-(k+1) per row, self included (capped at num-clients − 1; spec 10)
    structure_steps: int = Field(10, ge=0)  # E_S: denoising (L_D) steps per round
    # E_g: split-learning exchanges (query.ska_grad) per round; 1 under the fused schedule = one
    # phase per round (the gradient rides on the next train message)
    encoder_steps: int = Field(1, ge=0)
    mask_ratio: float = Field(0.01, gt=0.0, le=1.0)  # r: Bernoulli ratio of noised entries
    noise: Literal["normal", "mask"] = "normal"  # H^c + M⊙N(0,1), or H^c⊙(1−M)
    denoiser_hidden: int = Field(64, ge=1)  # GNN_D: d → h → h → d
    structure_lr: float = Field(0.0001, gt=0.0)  # Adam of the MLP + GNN_D ([C] 0.01)
    encoder_lr: float = Field(0.01, gt=0.0)  # Adam of GNN_E
    encoder_weight_decay: float = Field(0.01, ge=0.0)
    encoder: Literal["gcn", "identity"] = "gcn"  # GNN_E; `identity` = the reference code (h^g = P)
    max_slots: int = Field(1024, ge=1)  # cap of L = max_k N_k
    graph: Literal["learned", "label-sharing"] = "learned"  # S: learned, or the given graph (Table 3)
    tau: float = Field(0.0, ge=0.0, le=1.0)  # S ← τ·Â0 + (1−τ)·S with the label-sharing Â0 ([C] 0.9)
    # cosine of the descriptors' embeddings after standardising each dimension over the clients,
    # or the plain cosine (spec)
    similarity: Literal["standardized", "cosine"] = "standardized"
    # clients start from w̄ (spec), or from their row of the learned graph applied to the models
    start: Literal["global", "graph"] = "graph"
    # > 0: S is learned over the descriptors sent in the last this many rounds only (older rows:
    # self-loops until the client trains again); 0: every descriptor ever received (spec)
    descriptor_max_age: int = Field(0, ge=0)
    # fused: the slot embedding rides on the next train reply and the last of the E_g gradient
    # queries on the next train message (1 + max(E_g − 1, 0) phases per round, the split learning one
    # round behind); separate: embed and every gradient query are phases of their own after
    # training (spec §3: 2 + E_g phases per round)
    schedule: Literal["fused", "separate"] = "fused"


# --- messages -------------------------------------------------------------------------------
GRAPH_TARGET = "graph_target"  # FedSKA: a client's structure-based features h^g, sent down in train
DESCRIPTOR = "descriptor"  # FedSKA: a client's mean feature h^c, sent up after training
SLOT_FEATURES = "slot_features"  # FedSKA: per-slot features of the global f^e, sent up
SLOT_ENCODING = "slot_encoding"  # FedSKA: GNN_E's encodings of a client's slots, sent down
GRAD = "grad"  # FedSKA: gradient of the client head's loss w.r.t. SLOT_ENCODING, sent up
HEAD = "head"  # FedSKA: the global model's head f^s (`head.*` without the prefix), sent down
EMBED_MODEL = "embed_model"  # FedSKA fused: the global model whose slot features a train reply carries
H_G = "h_g"  # the one array of GRAPH_TARGET and SLOT_ENCODING: float32 [L, d]
H_C = "h_c"  # the one array of DESCRIPTOR: float32 [d]
SLOT_P = "p"  # the one array of SLOT_FEATURES: float32 [L, d]
GRAD_G = "g"  # the one array of GRAD: float32 [L, d]
TRAIN_FEDSKA = "train.fedska"  # FedSKA: train from `global` with the cosine pull toward `graph_target`
QUERY_SKA_EMBED = "query.ska_embed"  # FedSKA: per-slot features of `global`'s feature extractor
QUERY_SKA_GRAD = "query.ska_grad"  # FedSKA: head loss gradient w.r.t. the received slot encodings


class SlotInstructions(Record):
    """`query.ska_embed` / `query.ska_grad` (FedSKA): the number L of aligned slots; slot l is the
    client's train sample π(l mod N) under its seeded permutation π (from `seed`)."""

    num_slots: int = Field(ge=1)
    seed: int = Field(ge=0)


class SlotReply(Record):
    """Metrics of a FedSKA slot reply; `loss` (query.ska_grad) = (1/L) Σ_l loss(f^s(h^g[l]), y)."""

    num_examples: int = Field(ge=0)
    loss: float | None = None


class FedSKATrainReply(TrainReply):
    """Metrics of a `train.fedska` reply: the local training's mean structure loss and, under the
    fused schedule, the slot loss of the carried `query.ska_grad` answer."""

    structure_loss: float | None = None  # mean L_S (1 − cos to h^g) of the local training
    split_loss: float | None = None  # fused schedule: the slot loss of the carried grad query


class FedSKATrain(TrainInstructions):
    """`train.fedska`: λ_S of the cosine pull L_S, and the L aligned slots of `graph_target` once the
    structure features exist (absent before)."""

    lambda_s: float = Field(ge=0.0)
    num_slots: int | None = Field(None, ge=1)
    # schedule=fused: before training, reply the L slot features of `embed_model` (or of `global`
    # without it) as `slot_features`; with a `head` record, also the gradient of the head's slot
    # loss w.r.t. `graph_target` as `grad` (the query.ska_embed / query.ska_grad answers)
    embed_slots: int | None = Field(None, ge=1)


def round_uploads(settings: FedSKASection) -> int:
    """The most noised upload records one round takes from a client under DP (`dp-upload`): its
    descriptor, its slot features and one slot-loss gradient per encoder step (E_g; none with the
    identity encoder, which trains nothing)."""
    return 2 + (settings.encoder_steps if settings.encoder == "gcn" else 0)


def run_uploads(settings: FedSKASection, num_rounds: int) -> int:
    """The noised upload records a client that trains in each of `num_rounds` rounds makes in all.
    `separate`: `round_uploads` every round. `fused`: round 1's reply carries the descriptor alone
    (no slot count yet); from round 2 each reply carries the descriptor and the slot features, the
    round ends with E_g − 1 gradient exchanges, and from round 3 each reply also carries the
    gradient of the previous round's last exchange (the last round's is never sent)."""
    steps = settings.encoder_steps if settings.encoder == "gcn" else 0
    if settings.schedule == "separate" or num_rounds <= 0:
        return round_uploads(settings) * max(num_rounds, 0)
    later = num_rounds - 1
    return 1 + later * (2 + max(steps - 1, 0)) + max(later - 1, 0) * (1 if steps > 0 else 0)


def sample_releases(cfg: Any, n: int, noise: float, upload_noise: float) -> list[tuple[float, float, int]]:
    """`Method.sample_releases`: beside its DP-SGD rounds, a client makes `run_uploads` noised
    upload records over the run (n and the DP-SGD σ do not change them)."""
    from strategies.shared.privacy import upload_entry

    return [upload_entry(upload_noise, run_uploads(cfg.fedska, cfg.num_rounds))]


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
METHODS = (Method("fedska", "strategies.methods.fedska.server:build_fedska", "fedska", FedSKASection, {
    "train.fedska": "client_app.methods.fedska:train", "query.ska_embed": "client_app.methods.fedska:embed",
    "query.ska_grad": "client_app.methods.fedska:slot_gradient"}, limits={"k": "other-clients"}, safeguard=True, privacy=("sample", "client"),
           sample_releases=sample_releases,
           summary="FedSKA: unsupervised client-graph learning (denoising structure learner), split-learning GNN encoder whose features regularise local training"),)
