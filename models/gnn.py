"""FedSKA's server-side graph modules (docs/methods/fedska.md): the structure learner, the denoising GCN
GNN_D and the split-learning GCN encoder GNN_E. All are dense: the client graph is K×K.

- `StructureLearner` (§2 Generator/Sparsify/Symmetrize, [C] `graph_generator.MLP`, gen_mode 1):
  E = MLP(H^c) with identity-initialised weights → Ē = rowL2(E) → S̃ = ĒĒᵀ (cosine) → keep the k+1
  largest entries per row (self included) → ReLU → S̄ = (S̃ + S̃ᵀ)/2 → S = D^{-1/2} S̄ D^{-1/2}.
- `DenseGCN` (GNN_D, §2 Denoising): `X ← ReLU(S(XW + b))` per layer, the last without ReLU.
- `GCNEncoder` (GNN_E, §2 Encoder, Eq 7): `H^g[l] = S (P[l] W_E + b_E)` for every aligned slot l.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

NORMALIZE_EPS = 1e-10  # ε of D = diag(S̄·1) + ε ([C] `EOS`)
EncoderMode = Literal["gcn", "identity"]
ENCODER_MODES: tuple[str, ...] = ("gcn", "identity")
Similarity = Literal["standardized", "cosine"]
SIMILARITIES: tuple[str, ...] = ("standardized", "cosine")
STANDARDIZE_EPS = 1e-6


def keep_top_k(similarity: torch.Tensor, k: int) -> torch.Tensor:
    """Per row keep the k largest entries (the rest set to 0), then ReLU (§2 Sparsify, Eq 5).

    Gradients flow to the kept entries only (the mask is a constant)."""
    k = max(1, min(int(k), similarity.shape[1]))
    index = similarity.topk(k, dim=1).indices
    mask = torch.zeros_like(similarity).scatter_(1, index, 1.0)
    return F.relu(similarity * mask)


def symmetric_normalize(adjacency: torch.Tensor, eps: float = NORMALIZE_EPS) -> torch.Tensor:
    """S = D^{-1/2} A D^{-1/2} with D = diag(A·1) + ε (§2 Eq 6, [C] `normalize(adj, 'sym')`)."""
    inv_sqrt = (adjacency.sum(dim=1) + eps).pow(-0.5)
    return inv_sqrt[:, None] * adjacency * inv_sqrt[None, :]


def symmetrize(adjacency: torch.Tensor) -> torch.Tensor:
    """S̄ = (S̃ + S̃ᵀ)/2 (§2 Eq 6)."""
    return 0.5 * (adjacency + adjacency.T)


def standardize_columns(x: torch.Tensor, eps: float = STANDARDIZE_EPS) -> torch.Tensor:
    """Every column minus its mean over the rows, divided by √(its variance over the rows + ε)
    (finite gradients where a column is constant)."""
    centred = x - x.mean(dim=0, keepdim=True)
    return centred * (centred.pow(2).mean(dim=0, keepdim=True) + eps).rsqrt()


class StructureLearner(nn.Module):
    """The graph generator: identity-initialised MLP on the client descriptors H^c [K, d], cosine
    similarity, kNN top-(k+1) and ReLU (`sparse`), then symmetrise and normalise (`forward`).

    `similarity='standardized'` [D]: the cosine is taken after standardising every embedding
    dimension over the clients (`standardize_columns`). Mean features of a ReLU network are
    non-negative and share a large common part, so their plain cosines are all high (0.4–0.85 between
    any two MNIST clients) and the top-(k+1) graph is nearly uniform over the k nearest; without the
    common part, dissimilar clients get negative cosines, which the ReLU removes. `cosine` = [P]/[C]."""

    def __init__(self, dim: int, k: int, similarity: Similarity = "cosine") -> None:
        super().__init__()
        if similarity not in SIMILARITIES:
            raise ValueError(f"unknown similarity {similarity!r}; allowed: {', '.join(SIMILARITIES)}")
        self.k = k
        self.similarity = similarity
        self.layers = nn.ModuleList([nn.Linear(dim, dim), nn.Linear(dim, dim)])
        with torch.no_grad():  # [C] `mlp_knn_init`: weights = I (biases keep their default init)
            for layer in self.layers:
                layer.weight.copy_(torch.eye(dim))

    def embed(self, descriptors: torch.Tensor) -> torch.Tensor:
        """E = Linear(ReLU(Linear(H^c))) (§2 Generator)."""
        return self.layers[1](F.relu(self.layers[0](descriptors)))

    def sparse(self, descriptors: torch.Tensor) -> torch.Tensor:
        """S̃ before symmetrisation: top-(k+1) per row of the cosine similarity ĒĒᵀ, ReLU'd
        (Ē = rowL2(E), after `standardize_columns` when `similarity='standardized'`)."""
        e = self.embed(descriptors)
        if self.similarity == "standardized":
            e = standardize_columns(e)
        e = F.normalize(e, dim=1, p=2)
        return keep_top_k(e @ e.T, self.k + 1)

    def forward(self, descriptors: torch.Tensor) -> torch.Tensor:
        """S [K, K] = sym-normalise((S̃ + S̃ᵀ)/2): symmetric, non-negative."""
        return symmetric_normalize(symmetrize(self.sparse(descriptors)))


class DenseGCN(nn.Module):
    """GNN_D: dense GCN layers `X ← ReLU(S(XW + b))`, the last without ReLU (dims d→64→64→d)."""

    def __init__(self, dims: tuple[int, ...]) -> None:
        super().__init__()
        if len(dims) < 2:
            raise ValueError(f"a GCN needs at least an input and an output size, got {dims}")
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])])

    def forward(self, x: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = adjacency @ layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


def denoising_mask(shape: tuple[int, int], ratio: float, generator: torch.Generator) -> torch.Tensor:
    """M_ij ~ Bernoulli(ratio) over the K×d descriptor entries, with at least one entry set
    (§2 Denoising, [C] `get_random_mask`)."""
    mask = (torch.rand(shape, generator=generator) < ratio).float()
    if not bool(mask.any()):
        flat = int(torch.randint(mask.numel(), (1,), generator=generator))
        mask.view(-1)[flat] = 1.0
    return mask


def noisy_descriptors(descriptors: torch.Tensor, mask: torch.Tensor, noise: str,
                      generator: torch.Generator) -> torch.Tensor:
    """H̃ = H^c + M ⊙ N(0, 1) (`normal`) or H^c ⊙ (1 − M) (`mask`) (§2 Denoising)."""
    if noise == "normal":
        return descriptors + mask * torch.randn(descriptors.shape, generator=generator)
    if noise == "mask":
        return descriptors * (1.0 - mask)
    raise ValueError(f"unknown noise {noise!r}; allowed: 'normal', 'mask'")


def denoising_loss(learner: StructureLearner, denoiser: DenseGCN, descriptors: torch.Tensor,
                   mask: torch.Tensor, noise: str, generator: torch.Generator) -> torch.Tensor:
    """L_D = mean over masked entries of (GNN_D(H̃, S) − H^c)², S built from the clean H^c
    (§2 Denoising); differentiable in the learner's MLP and in GNN_D."""
    adjacency = learner(descriptors)
    noisy = noisy_descriptors(descriptors, mask, noise, generator)
    reconstruction = denoiser(noisy, adjacency)
    chosen = mask > 0
    return F.mse_loss(reconstruction[chosen], descriptors[chosen])


class GCNEncoder(nn.Module):
    """GNN_E (§2 Encoder, Eq 7): one GCN layer over S applied to every aligned slot,
    `H^g[l] = S·(P[l] W_E + b_E)` for P [L, K, d]. Mode `identity` reproduces the reference code,
    whose dense `GCN_C` applies no layer: H^g = P (§6.5)."""

    def __init__(self, dim: int, mode: EncoderMode = "gcn") -> None:
        super().__init__()
        if mode not in ENCODER_MODES:
            raise ValueError(f"unknown encoder mode {mode!r}; allowed: {', '.join(ENCODER_MODES)}")
        self.mode = mode
        self.linear = nn.Linear(dim, dim)

    def forward(self, adjacency: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """[L, K, d] slot features → [L, K, d] structure-based features (S is used as given)."""
        if self.mode == "identity":
            return slots
        return torch.einsum("ij,ljd->lid", adjacency, self.linear(slots))
