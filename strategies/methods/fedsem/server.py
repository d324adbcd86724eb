"""`fedsem`: Multi-Center Federated Learning (FeSEM; Xie et al., 2020), FLT's "FedSEM" baseline.

FeSEM minimises Σ_i min_k ||w_i − w̃_k||² over client models w_i and C centre models w̃_k by
stochastic expectation maximisation, i.e. K-means of the client models in parameter space
interleaved with local training. Per round: every sampled client i receives the centre w̃_{r_i} of
its cluster, trains it with plain local SGD (the `train.local` handler) and returns w_i, which
overwrites row i of V (clients that were not sampled keep their last, stale row). Then the server
runs Lloyd's K-means on the rows of every client that has ever trained — E-step
r_i = argmin_k ||w_i − w̃_k||², M-step w̃_k = Σ_{r_i=k} n_i w_i / Σ_{r_i=k} n_i — warm-started from
the current centres, for at most `KMEANS_ITERATIONS` iterations.

Where the paper is silent, Bouquet decides:
- Start: every client starts from the run's initial model (all centres equal it; everyone in cluster
  0). Until min(C, K) clients have trained, the centres are their n-weighted mean (FedAvg warm-up);
  then K-means++ (seeded by the run seed, D² × n_i sampling) picks the first centres and Lloyd
  iterations split the clients. Later rounds warm-start from the current centres.
- A client that has not trained yet has no model of its own: it takes only the E-step (nearest
  centre to its row, the initial model) and joins the M-step after its first reply.
- A cluster left without members keeps its centre.
- A client's personalized model (evaluation) is the centre of its cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.clustered import ClusteredStrategy, cluster_means
from strategies.shared.messages import TRAIN_LOCAL
from strategies.shared.personalized import weighted_mean

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig

KMEANS_ITERATIONS = 20


def nearest_centre(rows: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """E-step: index of the closest centre (Euclidean) for every row; ties go to the lowest."""
    return torch.cdist(rows, centres).argmin(dim=1)


def kmeans_plus_plus(
    rows: torch.Tensor, weights: torch.Tensor, k: int, generator: torch.Generator
) -> torch.Tensor:
    """K-means++ seeding (Arthur & Vassilvitskii, 2007): each next centre is drawn with probability
    ∝ n_i·D(i)², D(i) = distance to the closest centre chosen so far."""
    weights = weights.to(rows.dtype)
    chosen = [int(torch.multinomial(weights, 1, generator=generator))]
    closest = torch.cdist(rows, rows[chosen]).squeeze(1).square()
    for _ in range(1, k):
        mass = weights * closest
        if mass.sum() <= 0:  # fewer distinct rows than k: duplicates become empty clusters
            mass = weights
        chosen.append(int(torch.multinomial(mass, 1, generator=generator)))
        closest = torch.minimum(closest, torch.cdist(rows, rows[chosen[-1:]]).squeeze(1).square())
    return rows[chosen].clone()


def kmeans(
    rows: torch.Tensor, weights: torch.Tensor, centres: torch.Tensor,
    iterations: int = KMEANS_ITERATIONS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's algorithm with n-weighted means, warm-started from `centres`; stops early when the
    assignment no longer changes. Returns (assignment [n], centres [C, P])."""
    assignment = nearest_centre(rows, centres)
    for _ in range(iterations):
        centres = cluster_means(rows, weights, assignment, centres)
        updated = nearest_centre(rows, centres)
        if torch.equal(updated, assignment):
            break
        assignment = updated
    return assignment, centres


class FedSEM(ClusteredStrategy):
    """FeSEM: K-means of the latest client models each round (see the module docstring)."""

    train_message_type = TRAIN_LOCAL

    def __init__(
        self, num_clients: int, fraction_train: float, num_clusters: int, seed: int, *,
        matrix_storage: ClientMatrixStorage | None = None
    ) -> None:
        super().__init__(num_clients, fraction_train, num_clusters, matrix_storage=matrix_storage)
        self.assignment.zero_()  # everyone starts in cluster 0 (all centres are the initial model)
        self.generator = torch.Generator().manual_seed(seed)
        self.seeded = False  # whether K-means++ has picked the first distinct centres

    def initial_centres(self, arrays: ArrayRecord) -> torch.Tensor:
        return self.layout.matrix(arrays, self.num_clusters)

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return self.personal_content(client, config)

    def after_train(self, server_round: int) -> ArrayRecord | None:
        """K-means over the rows of V of every client that has trained (stale rows included)."""
        trained = self.num_examples > 0
        if not trained.any():
            return None
        rows, weights = self.personal[trained], self.num_examples[trained]
        if not self.seeded:
            if int(trained.sum()) < min(self.num_clusters, self.num_clients):
                self.centres[:] = weighted_mean(rows, weights)  # FedAvg warm-up
                return None
            self.centres = kmeans_plus_plus(rows, weights, self.num_clusters, self.generator)
            self.seeded = True
        self.assignment[trained], self.centres = kmeans(rows, weights, self.centres)
        if not trained.all():
            self.assignment[~trained] = nearest_centre(self.personal[~trained], self.centres)
        return None  # no global model


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> FedSEM:
    """The strategy of a run (its `Method` builder, `strategies.methods.fedsem.server:build`)."""
    return FedSEM(cfg.num_clients, cfg.fraction_train, cfg.fedsem.clusters, cfg.seed,
                  matrix_storage=storage)
