"""Clustered personalization shared by the clustered methods: C centre models (rows of one `[C, P]`
matrix), one cluster index per client, per-cluster weighted means, and the cluster reports."""

from __future__ import annotations

import functools

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from sklearn.metrics import adjusted_rand_score

from datasets.partition import Partition
from datasets.sources import SOURCE_INFO
from models import build_model
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.messages import CONFIG, PERSONAL
from strategies.shared.personalized import PersonalizedStrategy

ModelInit = Callable[[int], ArrayRecord]
UNASSIGNED = -1


def _seeded_model(model: str, dataset: str, seed: int, index: int) -> ArrayRecord:
    input_shape, num_classes = SOURCE_INFO[dataset]
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed + index)
        return ArrayRecord(build_model(model, input_shape, num_classes).state_dict())


def seeded_models(model: str, dataset: str, seed: int) -> ModelInit:
    """Cluster j's initial model: `model` for `dataset` built under torch seed `seed + j` (a
    partial of a module-level function, so a strategy holding it can be checkpointed)."""
    return functools.partial(_seeded_model, model, dataset, seed)


def cluster_means(
    rows: torch.Tensor, weights: torch.Tensor, assignment: torch.Tensor, centres: torch.Tensor
) -> torch.Tensor:
    """θ_c = Σ_{i: a_i = c} n_i·rows_i / Σ_{i: a_i = c} n_i for every cluster c at once (one matrix
    product); a cluster without members (or with zero weight) keeps its row of `centres`."""
    membership = torch.zeros(len(centres), len(rows), dtype=rows.dtype)
    membership[assignment, torch.arange(len(rows))] = weights.to(rows.dtype)
    mass = membership.sum(dim=1, keepdim=True)
    means = (membership @ rows) / mass.clamp_min(torch.finfo(rows.dtype).tiny)
    return torch.where(mass > 0, means, centres)


class ClusteredStrategy(PersonalizedStrategy):
    """C centre models (`centres [C, P]`) and each client's cluster index (`assignment`, −1 = none).

    A client's personalized model is the centre of its cluster. Reports the cluster sizes every
    round and, at the end, the final assignment and its adjusted Rand index against the true
    clusters.
    """

    def __init__(self, num_clients: int, fraction_train: float, num_clusters: int, *,
                 matrix_storage: ClientMatrixStorage | None = None) -> None:
        super().__init__(num_clients, fraction_train, matrix_storage=matrix_storage)
        self.num_clusters = num_clusters
        self.centres: torch.Tensor | None = None
        self.assignment = torch.full((num_clients,), UNASSIGNED, dtype=torch.long)

    def initial_centres(self, arrays: ArrayRecord) -> torch.Tensor:
        """The `[C, P]` centre models before round 1."""
        raise NotImplementedError

    def bind(self, arrays: ArrayRecord) -> None:
        super().bind(arrays)
        if self.centres is None:
            self.centres = self.initial_centres(arrays)

    def centre_arrays(self, cluster: int) -> ArrayRecord:
        return self.layout.arrays(self.centres[cluster])

    def personal_content(self, client: int, config: ConfigRecord) -> RecordDict:
        """The centre of the client's cluster as its `personal` model, with `config`."""
        centre = self.centre_arrays(int(self.assignment[client]))
        return RecordDict({PERSONAL: centre, CONFIG: config})

    def evaluate_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return self.personal_content(client, config)

    def cluster_sizes(self) -> list[int]:
        assigned = self.assignment[self.assignment != UNASSIGNED]
        return torch.bincount(assigned, minlength=self.num_clusters).tolist()

    def round_report(self, server_round: int) -> dict[str, Any]:
        """Merged into rounds.jsonl: clients per cluster, and clients without a cluster yet."""
        return {
            "cluster-sizes": self.cluster_sizes(),
            "unassigned-clients": int((self.assignment == UNASSIGNED).sum()),
        }

    def report(self, directory: Path, truth: Partition | None) -> dict[str, Any]:
        """Merged into summary.json: final cluster per client (−1 = never assigned) and, when the
        partition has true clusters, the adjusted Rand index over the assigned clients."""
        out: dict[str, Any] = {"cluster-assignment": self.assignment.tolist()}
        if truth is not None and truth.cluster_ids is not None:
            assigned = (self.assignment != UNASSIGNED).numpy()
            if assigned.any():
                out["cluster-ari"] = float(adjusted_rand_score(
                    truth.cluster_ids[assigned], self.assignment.numpy()[assigned]))
        return out
