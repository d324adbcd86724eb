"""FedSKA's server-side learning (docs/methods/fedska.md) on plain tensors: the structure learner
(`StructureModel`: MLP generator + denoising GNN_D over the clients' descriptors, giving the client
graph S), one split-learning step of the encoder GNN_E from the clients' gradients, and the random
kNN graph FedSKA's learned graph is compared with."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from models.gnn import (
    DenseGCN,
    GCNEncoder,
    StructureLearner,
    denoising_loss,
    denoising_mask,
)

if TYPE_CHECKING:
    from strategies.methods.fedska.settings import FedSKASection


def random_knn_graph(num_nodes: int, k: int, seed: int) -> np.ndarray:
    """A random graph with the learned graph's sparsity: every row links k other nodes chosen
    uniformly (seeded), symmetrised — the baseline of the graph-quality share."""
    rng = np.random.default_rng(seed)
    graph = np.zeros((num_nodes, num_nodes))
    k = max(0, min(k, num_nodes - 1))
    for i in range(num_nodes):
        others = np.delete(np.arange(num_nodes), i)
        graph[i, rng.choice(others, size=k, replace=False)] = 1.0
    return np.maximum(graph, graph.T)


class StructureModel:
    """The server's structure learner (MLP generator + GNN_D, one Adam, §2) over the descriptors
    of the clients seen so far; `fit` runs E_S denoising steps and returns S and the losses."""

    def __init__(self, dim: int, settings: FedSKASection, seed: int) -> None:
        self.settings = settings
        with torch.random.fork_rng():  # seeded init that leaves the global RNG as it is
            torch.manual_seed(seed)
            self.learner = StructureLearner(dim, settings.k, settings.similarity)
            h = settings.denoiser_hidden
            self.denoiser = DenseGCN((dim, h, h, dim))
        self.optimizer = torch.optim.Adam(
            [*self.learner.parameters(), *self.denoiser.parameters()], lr=settings.structure_lr)
        self.generator = torch.Generator().manual_seed(seed)

    def fit(self, descriptors: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
        """E_S steps of L_D (a new mask per step), then S = learner(H^c) (no grad)."""
        s = self.settings
        self.learner.k = max(1, min(s.k, len(descriptors) - 1))
        losses = []
        for _ in range(s.structure_steps):
            mask = denoising_mask(tuple(descriptors.shape), s.mask_ratio, self.generator)
            loss = denoising_loss(self.learner, self.denoiser, descriptors, mask, s.noise,
                                  self.generator)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss.detach()))
        with torch.no_grad():
            return self.learner(descriptors), losses


def encoder_gradient_step(encoder: GCNEncoder, adjacency: torch.Tensor, slots: torch.Tensor,
                          grads: dict[int, torch.Tensor]) -> None:
    """Set the encoder's `.grad` to ∇θ_E = Σ_k backward(⟨H^g_k, G_k⟩) over the clients that replied
    (Eq 8, server side), with H^g = GNN_E(S, P) recomputed at the current θ_E."""
    encodings = encoder(adjacency, slots)
    surrogate = sum((encodings[:, k, :] * g).sum() for k, g in grads.items())
    encoder.zero_grad(set_to_none=True)
    surrogate.backward()
