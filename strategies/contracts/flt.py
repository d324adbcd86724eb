"""FLT: its settings (`flt.*` run-config keys)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from strategies.contracts.base import MethodSettings


class FLTSection(MethodSettings):
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
