"""FedSKA: its settings (`fedska.*` run-config keys)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from strategies.contracts.base import MethodSettings


class FedSKASection(MethodSettings):
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
