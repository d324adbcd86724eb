"""SFL*'s graph learner (docs/methods/sfl.md, `sfl.gl-model=mtgnn`; the reference code's `GraphConstructor` / `generate_adj`, MTGNN-style).

Node embeddings E1, E2 ∈ R^{N×m} give M1 = tanh(a·Lin1(E1)), M2 = tanh(a·Lin2(E2)) and the
antisymmetric score A_L = ReLU(tanh(a·(M1·M2ᵀ − M2·M1ᵀ))) (zero diagonal, at most one direction per
pair). It is fitted to the pairwise distances of the clients' models, Dist_ij = ||v_i − v_j||_2, with
the loss MSE(rowL2(A_L), rowL2(Target)); the exported graph keeps the top-k entries of every row and is
row-normalised: A_learn = rownorm(topk(A_L)).

[D] export: A_learn = rownorm(T + Tᵀ + I) with T = topk(A_L) (`gl-symmetric`, `gl-self-loops`). The
antisymmetric construction links each pair in one direction only and orders clients like a ranking, so
the raw export points most rows at a few hubs (at MNIST q = 2, K = 100: in-degree 0 for ≥ 10% of the
clients, up to 41 for others) and leaves every client out of its own u_i; three hops over it gave
28–62% personalized accuracy where the same models over T + Tᵀ + I gave 85–92% (the label-sharing graph:
86–88%). The similarity being fitted is symmetric, and SFL's given graphs carry self-loops, so the
default export does too; `gl-symmetric=false gl-self-loops=false` is the reference export.

[D] §6.4: the target is the similarity `max(Dist) − Dist` (close models → strong edge), the learner and
its Adam state persist across rounds, 50 steps per round; node embeddings start small (N(0, 0.1²), see
`GraphConstructor`). The reference code — a fresh learner every round, 10 SGD steps (lr 0.01, weight
decay 1e-4) on the row-normalised *distance*, embeddings N(0, 1), the raw top-k export — is
`gl-persist=false gl-steps=10 gl-target=distance gl-optimizer=sgd gl-weight-decay=0.0001
gl-init-std=1.0 gl-symmetric=false gl-self-loops=false`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from strategies.shared.graph import pairwise_row_distances, row_normalize, top_k_per_row

GraphTarget = Literal["similarity", "distance"]
GRAPH_TARGETS: tuple[str, ...] = ("similarity", "distance")
LearnerOptimizer = Literal["adam", "sgd"]
LEARNER_OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")
LearnerModel = Literal["mtgnn", "knn"]
LEARNER_MODELS: tuple[str, ...] = ("mtgnn", "knn")


class GraphConstructor(nn.Module):
    """A_L = ReLU(tanh(a·(M1·M2ᵀ − M2·M1ᵀ))), M_r = tanh(a·Lin_r(E_r)) (spec §2 (5)).

    [D] E_r ~ N(0, init_std²) with init_std = 0.1. The reference keeps nn.Embedding's N(0, 1): with
    m = 40 and a = 3 the scores a·(M1·M2ᵀ − M2·M1ᵀ) are then ~±17 at the start, tanh is saturated, the
    gradients vanish and the exported graph stays the random initial one (`gl-init-std=1.0`).
    """

    def __init__(self, num_nodes: int, dim: int = 40, scale: float = 3.0,
                 init_std: float = 0.1) -> None:
        super().__init__()
        self.emb1 = nn.Embedding(num_nodes, dim)
        self.emb2 = nn.Embedding(num_nodes, dim)
        nn.init.normal_(self.emb1.weight, std=init_std)
        nn.init.normal_(self.emb2.weight, std=init_std)
        self.lin1 = nn.Linear(dim, dim)
        self.lin2 = nn.Linear(dim, dim)
        self.scale = scale

    def forward(self) -> torch.Tensor:
        m1 = torch.tanh(self.scale * self.lin1(self.emb1.weight))
        m2 = torch.tanh(self.scale * self.lin2(self.emb2.weight))
        return F.relu(torch.tanh(self.scale * (m1 @ m2.T - m2 @ m1.T)))


def graph_target(distance: torch.Tensor, target: GraphTarget) -> torch.Tensor:
    """rowL2(max(Dist) − Dist) (`similarity`, [D]) or rowL2(Dist) (`distance`, [C])."""
    if target == "similarity":
        values = distance.max() - distance
    elif target == "distance":
        values = distance
    else:
        raise ValueError(f"unknown graph target {target!r}; allowed: {', '.join(GRAPH_TARGETS)}")
    return F.normalize(values, dim=1)


class GraphLearner:
    """Fits a `GraphConstructor` to the clients' model distances each round; `fit(V)` → A_learn."""

    def __init__(self, num_clients: int, *, k: int = 10, dim: int = 40, scale: float = 3.0,
                 init_std: float = 0.1, steps: int = 50, lr: float = 0.01, optimizer: LearnerOptimizer = "adam",
                 weight_decay: float = 0.0, persist: bool = True, target: GraphTarget = "similarity",
                 symmetric: bool = True, self_loops: bool = True, seed: int = 0,
                 model: LearnerModel = "mtgnn") -> None:
        if model not in LEARNER_MODELS:
            raise ValueError(f"unknown graph learner {model!r}; allowed: {', '.join(LEARNER_MODELS)}")
        if target not in GRAPH_TARGETS:
            raise ValueError(f"unknown graph target {target!r}; allowed: {', '.join(GRAPH_TARGETS)}")
        if optimizer not in LEARNER_OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r}; allowed: "
                             f"{', '.join(LEARNER_OPTIMIZERS)}")
        self.num_clients = num_clients
        self.k = max(0, min(k, num_clients - 1))  # spec §4: min(k, N − 1)
        self.dim, self.scale, self.init_std, self.steps, self.lr = dim, scale, init_std, steps, lr
        self.optimizer_name, self.weight_decay = optimizer, weight_decay
        self.persist, self.target, self.seed = persist, target, seed
        self.symmetric, self.self_loops = symmetric, self_loops
        self.model = model
        self._similarity: torch.Tensor | None = None  # `knn`: the scores of the last fit
        self.module: GraphConstructor | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.fits = 0
        self.losses: list[float] = []  # fit loss after the last step of each fit

    def _fresh(self) -> None:
        """A new learner seeded by (seed, fit number): deterministic, and different each round."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1_000_003 + self.fits)
            self.module = GraphConstructor(self.num_clients, self.dim, self.scale, self.init_std)
        params = self.module.parameters()
        if self.optimizer_name == "adam":
            self.optimizer = torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        else:
            self.optimizer = torch.optim.SGD(params, lr=self.lr, weight_decay=self.weight_decay)

    def fit(self, rows: torch.Tensor, include: torch.Tensor | None = None) -> torch.Tensor:
        """`steps` optimiser steps of MSE(rowL2(A_L), rowL2(Target)) on the distances of the rows
        V [N, P]; returns A_learn [N, N] (float32, see `export`).

        `include` [N] bool: fit to the distances among these rows only (e.g. the clients that have
        trained: a never-trained row is the initial model, and its distances say nothing about its
        data); the other clients get no learned edge (`export`). None = every row (spec)."""
        if rows.shape[0] != self.num_clients:
            raise ValueError(f"rows must have {self.num_clients} rows, got {rows.shape[0]}")
        index = None if include is None else torch.nonzero(include).squeeze(1)
        if index is not None and len(index) == self.num_clients:
            index = None
        if self.model == "knn":
            return self._fit_knn(rows, index, include)
        if self.module is None or not self.persist:
            self._fresh()
        self.module.train()
        loss = torch.tensor(float("nan"))
        if index is None or len(index) >= 2:
            subset = rows if index is None else rows[index]
            target = graph_target(pairwise_row_distances(subset), self.target).to(torch.float32)
            for _ in range(self.steps):
                self.optimizer.zero_grad(set_to_none=True)
                scores = self.module()
                if index is not None:
                    scores = scores[index][:, index]
                loss = F.mse_loss(F.normalize(scores, dim=1), target)
                loss.backward()
                self.optimizer.step()
        self.fits += 1
        self.losses.append(float(loss.detach()))
        return self.export(include=None if index is None else include)

    @torch.no_grad()
    def _fit_knn(self, rows: torch.Tensor, index: torch.Tensor | None,
                 include: torch.Tensor | None) -> torch.Tensor:
        """`knn`: the scores are the similarity max(Dist) − Dist itself (zero diagonal), so the
        export keeps every client's k nearest models — the graph the MTGNN learner is fitted to
        approximate, without its antisymmetric parametrisation (one direction per pair)."""
        subset = rows if index is None else rows[index]
        distance = pairwise_row_distances(subset)
        similarity = (distance.max() - distance).to(torch.float32)
        similarity.fill_diagonal_(0.0)
        if index is None:
            self._similarity = similarity
        else:
            self._similarity = torch.zeros(self.num_clients, self.num_clients)
            self._similarity[index.unsqueeze(1), index.unsqueeze(0)] = similarity
        self.fits += 1
        self.losses.append(0.0)
        return self.export(include=include if index is not None else None)

    @torch.no_grad()
    def scores(self) -> torch.Tensor:
        """The full learned score matrix A_L (no top-k) of the current learner."""
        if self.model == "knn":
            if self._similarity is None:
                raise RuntimeError("the graph learner has not been fitted yet")
            return self._similarity
        if self.module is None:
            raise RuntimeError("the graph learner has not been fitted yet")
        return self.module()

    @torch.no_grad()
    def export(self, include: torch.Tensor | None = None) -> torch.Tensor:
        """A_learn = rownorm(T [+ Tᵀ] [+ I]), T = topk(A_L) (spec §2 (5): top-k per row, the rest 0;
        [D] symmetrised and with self-loops unless switched off); rows sum to 1. With `include`,
        A_L is restricted to the included clients first (top-k among them; the others' rows and
        columns are 0, so their rows become self-loops)."""
        scores = self.scores()
        if include is not None:
            keep = include.to(scores.dtype)
            scores = scores * keep[:, None] * keep[None, :]
        k = self.k if include is None else max(0, min(self.k, int(include.sum()) - 1))
        graph = top_k_per_row(scores, k)
        if self.symmetric:
            graph = graph + graph.T
        if self.self_loops:
            graph = graph + torch.eye(self.num_clients, dtype=graph.dtype)
        return row_normalize(graph)


def blend(prior_hat: torch.Tensor | np.ndarray | None, learned: torch.Tensor,
          beta: float) -> torch.Tensor:
    """SFL* (spec §2 (5)): A = (1−β)·Â_prior + β·A_learn; β = 1 or no prior → A_learn alone."""
    if prior_hat is None or beta >= 1.0:
        return learned
    prior = torch.as_tensor(np.asarray(prior_hat), dtype=torch.float32)
    return (1.0 - beta) * prior + beta * learned
