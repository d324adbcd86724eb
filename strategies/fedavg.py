"""`fedavg` and `fedprox`: Flower's built-in message-API strategies, configured for Bouquet.

They run over a `ClientGrid`, whose node ids are stable client ids, so Flower's sampling and
weighted aggregation are used unchanged. The global model travels as the ArrayRecord `global`.
`aggregation='median'` / `'trimmed-mean'` swaps the weighted mean for Flower's FedMedian /
FedTrimmedAvg aggregation (FedProx keeps its proximal term and takes the robust aggregation).
With whole test clients held out (`domain-test-clients` > 0), `TrainClientsOnly` samples the
training clients among the train clients alone (a test client has no training data), as FedCG does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, FedMedian, FedProx, FedTrimmedAvg, Strategy

from datasets.partition import PartitionSpec, heldout_test_clients

from strategies.messages import GLOBAL


def _common(fraction_train: float) -> dict:
    # Bouquet waits for every client before round 1 (ClientGrid); Flower need not wait again.
    return dict(
        fraction_train=fraction_train,
        fraction_evaluate=1.0,
        min_train_nodes=1,
        min_evaluate_nodes=1,
        min_available_nodes=1,
        arrayrecord_key=GLOBAL,
    )


class FedProxMedian(FedProx):
    """FedProx clients, FedMedian's coordinate-wise median on the server."""

    aggregate_train = FedMedian.aggregate_train


class FedProxTrimmedAvg(FedProx):
    """FedProx clients, FedTrimmedAvg's coordinate-wise trimmed mean on the server."""

    aggregate_train = FedTrimmedAvg.aggregate_train

    def __init__(self, *, beta: float = 0.2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.beta = beta


def build_fedavg(fraction_train: float, aggregation: str = "mean",
                 trim_fraction: float = 0.2) -> FedAvg:
    """FedAvg (McMahan et al., 2017): θ ← Σ_k n_k θ_k / Σ_k n_k, or Flower's FedMedian /
    FedTrimmedAvg with `aggregation='median'` / `'trimmed-mean'`."""
    if aggregation == "median":
        return FedMedian(**_common(fraction_train))
    if aggregation == "trimmed-mean":
        return FedTrimmedAvg(**_common(fraction_train), beta=trim_fraction)
    return FedAvg(**_common(fraction_train))


def build_fedprox(fraction_train: float, mu: float, aggregation: str = "mean",
                  trim_fraction: float = 0.2) -> FedProx:
    """FedProx (Li et al., 2020): FedAvg whose clients add (μ/2)·||θ − θ_global||² to their loss."""
    if aggregation == "median":
        return FedProxMedian(**_common(fraction_train), proximal_mu=mu)
    if aggregation == "trimmed-mean":
        return FedProxTrimmedAvg(**_common(fraction_train), proximal_mu=mu, beta=trim_fraction)
    return FedProx(**_common(fraction_train), proximal_mu=mu)


class _TrainClientsView:
    """A grid that lists only the train clients among its reachable nodes (everything else: the grid)."""

    def __init__(self, grid: Grid, train_clients: frozenset[int]) -> None:
        self._grid, self._train = grid, train_clients

    def get_node_ids(self) -> list[int]:
        return [node for node in self._grid.get_node_ids() if node in self._train]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


class TrainClientsOnly(Strategy):
    """A strategy whose training rounds sample among `train_clients` only (fraction-train of them);
    everything else is the wrapped strategy's own."""

    def __init__(self, strategy: Strategy, train_clients: Sequence[int]) -> None:
        self.strategy = strategy
        self.train_clients = frozenset(int(c) for c in train_clients)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        view = _TrainClientsView(grid, self.train_clients)
        return self.strategy.configure_train(server_round, arrays, config, view)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.strategy.summary()


def train_clients_only(strategy: Strategy, partition: PartitionSpec) -> Strategy:
    """`strategy` sampling only the train clients when the partition holds whole test clients out."""
    held_out = heldout_test_clients(partition)
    if held_out is None:
        return strategy
    test = set(held_out.tolist())
    return TrainClientsOnly(strategy, [c for c in range(partition.num_clients) if c not in test])
