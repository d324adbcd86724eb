"""`ifca`: Iterative Federated Clustering Algorithm (Ghosh et al., NeurIPS 2020), model averaging.

IFCA Algorithm 2 ("model averaging" option): the server keeps C cluster models θ_1..θ_C, rows of one
matrix `[C, P]`. Each round every sampled client i receives all C models (ArrayRecords `cluster-0` …
`cluster-{C-1}`, so IFCA's C-fold downlink shows in the byte counts), estimates its cluster
ĵ = argmin_j F_i(θ_j) on its training data, runs local SGD on θ_ĵ and returns the trained model
with ĵ.
The server sets θ_j to the num-examples-weighted mean of the models returned for cluster j; a
cluster that nobody chose keeps its model.

Where the paper is silent or differs, Bouquet decides:
- Initialisation: θ_j is the model built under torch seed `seed + j` (θ_0 is the run's initial
  model), so the C models start apart and the clusters can separate; no FedAvg warm-up.
- Averaging weights: num-examples (the paper's Algorithm 2 averages the chosen machines uniformly).
- Personalized model for evaluation: the cluster model the client chose most recently. A client that
  has never trained gets all C models (`evaluate.ifca`) and picks by lowest training loss, as in
  training.

The clustered machinery (centres, assignment, reports) is `strategies.shared.clustered.ClusteredStrategy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collections.abc import Iterable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.clustered import UNASSIGNED, ClusteredStrategy, ModelInit, cluster_means
from strategies.methods.ifca.settings import EVALUATE_IFCA, TRAIN_IFCA, IFCATrainReply, cluster_model
from strategies.shared.messages import CONFIG, EVALUATE, METRICS, MODEL

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig


class IFCA(ClusteredStrategy):
    """IFCA, Algorithm 2 with model averaging (see the module docstring)."""

    train_message_type = TRAIN_IFCA
    train_reply = IFCATrainReply

    def __init__(
        self, num_clients: int, fraction_train: float, num_clusters: int, init: ModelInit, *,
        matrix_storage: ClientMatrixStorage | None = None
    ) -> None:
        super().__init__(num_clients, fraction_train, num_clusters, matrix_storage=matrix_storage)
        self.init = init
        self._records: dict[str, ArrayRecord] | None = None  # the C models as sent this round
        self._trained: list[tuple[int, torch.Tensor, int]] = []  # (cluster, model row, n)

    def initial_centres(self, arrays: ArrayRecord) -> torch.Tensor:
        return torch.stack([self.layout.row(self.init(j)) for j in range(self.num_clusters)])

    def cluster_records(self) -> dict[str, ArrayRecord]:
        """All C cluster models as named ArrayRecords, built once per round, shared by messages."""
        if self._records is None:
            self._records = {
                cluster_model(j): self.centre_arrays(j) for j in range(self.num_clusters)
            }
        return self._records

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({**self.cluster_records(), CONFIG: config})

    def absorb(self, client: int, content: RecordDict) -> None:
        """Remember the client's choice ĵ and its trained θ_ĵ for this round's cluster averages."""
        reply = IFCATrainReply.read(content[METRICS])
        if reply.cluster is None or reply.cluster >= self.num_clusters:
            raise ValueError(
                f"client {client}: an IFCA reply needs 'cluster' in [0, {self.num_clusters}), "
                f"got {reply.cluster}"
            )
        self.assignment[client] = reply.cluster
        self._trained.append((reply.cluster, self.layout.row(content[MODEL]), reply.num_examples))

    def after_train(self, server_round: int) -> ArrayRecord | None:
        """θ_j ← weighted mean of the models trained on θ_j this round (unchosen θ_j unchanged)."""
        if self._trained:
            clusters, rows, weights = zip(*self._trained)
            self.centres = cluster_means(
                torch.stack(rows), torch.tensor(weights), torch.tensor(clusters), self.centres)
            self._trained = []
            self._records = None
        return None  # no global model

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Clients with a cluster test its model (`evaluate`); others choose (`evaluate.ifca`)."""
        self.bind(arrays)
        messages = []
        for client in grid.get_node_ids():
            if self.assignment[client] == UNASSIGNED:
                content = RecordDict({**self.cluster_records(), CONFIG: config})
                messages.append(Message(content, dst_node_id=client, message_type=EVALUATE_IFCA))
            else:
                content = self.evaluate_content(client, arrays, config)
                messages.append(Message(content, dst_node_id=client, message_type=EVALUATE))
        return messages


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> IFCA:
    """The strategy of a run (its `Method` builder, `strategies.methods.ifca.server:build`)."""
    from strategies.shared.clustered import seeded_models

    return IFCA(cfg.num_clients, cfg.fraction_train, cfg.ifca.clusters,
                seeded_models(cfg.model, cfg.dataset, cfg.seed), matrix_storage=storage)
