"""FLT: its settings (`flt.*` run-config keys) and the messages only it sends."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from strategies.shared.method import Method
from strategies.shared.settings import MethodSettings, Record


class FLTSection(MethodSettings):
    """FLT (docs/methods/flt.md): autoencoder phases, Form Client Relatedness and the graph threshold."""

    # paper and reference code: absolute; evidence: the cut a federation without groups would be
    # the least likely to show (relatedness.evidence_cut), tested at structure-confidence
    threshold: Literal["relative", "absolute", "evidence"] = "relative"
    gamma: float = Field(1.0, gt=0.0)  # absolute: connect clients closer than γ (UMAP units)
    relative_gamma: float = Field(0.05, gt=0.0)  # relative: closer than this × the median distance
    k: int = Field(2, ge=1)  # k-means centroids per client (the maximum under k-mode=local-labels)
    k_mode: Literal["fixed", "local-labels"] = "fixed"
    distance: Literal["matching", "min-pair"] = "matching"
    clusters: int = Field(0, ge=0)  # C > 0: Ward clusters of Ã, one model per cluster
    latent_dim: int = Field(128, ge=1)  # e
    ae_rounds: int = Field(1, ge=0)  # federated autoencoder rounds (train.flt_ae) before FCR
    ae_epochs: int = Field(2, ge=1)  # F: local reconstruction epochs per autoencoder round
    ae_lr: float = Field(0.001, gt=0.0)  # Adam
    ae_batch_size: int = Field(32, ge=1)
    pretrain_samples: int = Field(0, ge=0)  # > 0: server pretraining on this many of its own images
    # the server's own data for that pretraining (never a client's): "" none (pretraining skipped);
    # a .npz with `x` on the server; "unassigned": the built-in data set's samples that the partition
    # gives no client (simulation: the server reads the data set for them)
    pretrain_data: str = ""
    pretrain_epochs: int = Field(5, ge=1)
    # a file on the server: the autoencoder's state_dict (torch.save) to start from instead of the
    # seeded initialisation, e.g. pretrained on another data set (the paper: CIFAR-100); "" none
    encoder_checkpoint: str = ""
    umap_neighbors: int = Field(5, ge=2)  # n_neighbors = min(this, Σk − 1) ([C] 15)
    fresh_only: bool = True  # average only the neighbours trained this round (reference code: stale included)
    no_structure: Literal["complete", "keep"] = "complete"  # graph failing the check (paper: keep)
    # Ã is kept when a federation without groups shows edges as close (relative to its non-edges)
    # with probability at most 1 − this (the structure test's p-value); else the complete graph
    structure_confidence: float = Field(0.95, gt=0.0, lt=1.0)


# --- messages -------------------------------------------------------------------------------
AUTOENCODER = "autoencoder"  # FLT: the convolutional autoencoder (encoder + decoder), down and up
ENCODER = "encoder"  # FLT: the encoder G alone, sent down for Form Client Relatedness
CENTROIDS = "centroids"  # FLT: a client's k-means centroids of its codes, sent up
CENTROIDS_MU = "mu"  # the one array of CENTROIDS: float32 [k, e]
TRAIN_FLT_AE = "train.flt_ae"  # FLT phase 1: federated autoencoder round
QUERY_FLT_EMBED = "query.flt_embed"  # FLT phase 2: encode local data, reply k-means centroids


class AutoencoderInstructions(Record):
    """`train.flt_ae` (FLT phase 1): F epochs of reconstruction MSE with Adam on the local data."""

    ae_round: int = Field(ge=1)
    epochs: int = Field(ge=1)
    lr: float = Field(gt=0.0)
    batch_size: int = Field(ge=1)
    latent_dim: int = Field(ge=1)
    seed: int = Field(ge=0)


class AutoencoderReply(Record):
    """Metrics of a `train.flt_ae` reply; `num-examples` weights the FedAvg of the autoencoders."""

    num_examples: int = Field(ge=0)
    recon_loss: float


class EmbedInstructions(Record):
    """`query.flt_embed` (FLT phase 2): encode the local train split, reply k k-means centroids
    (k-mode `fixed`: k; `local-labels`: min(k, number of distinct local labels))."""

    k: int = Field(ge=1)
    k_mode: str = Field(pattern="^(fixed|local-labels)$")
    kmeans_seed: int = Field(ge=0)
    latent_dim: int = Field(ge=1)


class EmbedReply(Record):
    """The only metric of a `query.flt_embed` reply (beside the `centroids` record)."""

    num_examples: int = Field(ge=0)


def sample_releases(cfg: Any, n: int, noise: float, upload_noise: float) -> list[tuple[float, float, int]]:
    """`Method.sample_releases`: beside the classifier's DP-SGD rounds, a client of n train samples
    trains the autoencoder by DP-SGD at the run's σ (`flt.ae-rounds` rounds of `flt.ae-epochs`
    epochs at `flt.ae-batch-size`) and uploads its centroids once (one noised record, FCR)."""
    from strategies.shared.privacy import sample_schedule, upload_entry

    s = cfg.flt
    rate, steps = sample_schedule(n, s.ae_batch_size, s.ae_epochs)
    return [(noise, rate, steps * s.ae_rounds), upload_entry(upload_noise, 1)]


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
METHODS = (Method("flt", "strategies.methods.flt.server:build_flt", "flt", FLTSection, {"train.flt_ae": "client_app.methods.flt:train_autoencoder",
                                                     "query.flt_embed": "client_app.methods.flt:embed"},
                  limits={"clusters": "clients"}, safeguard=True, privacy=("sample", "client"),
                  sample_releases=sample_releases,
           summary="FLT: one-shot client relatedness (autoencoder codes → k-means centroids → UMAP → threshold graph) + graph-weighted averaging of per-client models"),)
