"""FedCG's domain graph (eq. 6–7 of docs/methods/fedcg.md): the inverse-distance adjacency of the domain
branches and its controls (uniform, random)."""

from __future__ import annotations

import torch

from strategies.shared.graph import pairwise_row_distances

EPSILON = 1e-8  # ε of eq. 6


def normalized_adjacency(h: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 7: A_ii = β, A_ij = (1 − β)·h_ij / Σ_{d≠i} h_id; rows sum to 1 (D = 1: A = [[1]])."""
    d = len(h)
    if d == 1:
        return torch.ones(1, 1)
    h = h.to(torch.float64).clone()
    h.fill_diagonal_(0.0)
    a = (1.0 - beta) * h / h.sum(dim=1, keepdim=True)
    a.fill_diagonal_(beta)
    return a.to(torch.float32)


def inverse_distance_adjacency(rows: torch.Tensor, beta: float, eps: float = EPSILON) -> torch.Tensor:
    """Eq. 6–7 on the raw branch rows V [D, Σq]: h_ij = 1 / (||θ^i − θ^j||_2 + ε), then eq. 7."""
    return normalized_adjacency(1.0 / (pairwise_row_distances(rows) + eps), beta)


def uniform_adjacency(num_domains: int, beta: float) -> torch.Tensor:
    """Eq. 7 with equal h: A_ii = β, A_ij = (1 − β)/(D − 1)."""
    return normalized_adjacency(torch.ones(num_domains, num_domains), beta)


def random_adjacency(num_domains: int, beta: float, seed: int) -> torch.Tensor:
    """Eq. 7 with h_ij ~ U(0, 1) drawn once from `seed`."""
    h = torch.rand(num_domains, num_domains, generator=torch.Generator().manual_seed(seed))
    return normalized_adjacency(h + EPSILON, beta)
