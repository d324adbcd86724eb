"""`PersonalizedStrategy`: the shared base of methods that keep one model per client on the server.

Client models are rows of one float32 matrix `V [num_clients, P]` (see `strategies.shared.params`), keyed by
stable client id, so graph methods aggregate with one matrix product and a client that misses a round
keeps its last (stale) row. Sampling is Flower's own (`sample_nodes`) over the reachable client ids
the runner's grid lists; replies arrive as (client id, reply) pairs (`ClientKeyed`), failed or
missing ones already left out. Subclasses say what a client receives and what the
server does with the replies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.messages import CONFIG, EVALUATE, METRICS, PERSONAL, TrainReply
from strategies.shared.params import ParameterLayout
from strategies.shared.phases import ClientKeyed, Replies
from strategies.shared.reporter import MethodReporter
from strategies.shared.robust_aggregation import AGGREGATIONS, robust_mean

log = logging.getLogger("flwr.bouquet")


def weighted_mean(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_i w_i·rows_i / Σ_i w_i for a [n, P] matrix (the FedAvg rule, eq. (2) of FedAvg)."""
    w = weights.to(rows.dtype)
    return (w / w.sum()) @ rows


class PersonalizedStrategy(Strategy, MethodReporter, ClientKeyed):
    """Per-client parameter matrix + per-client messages, replies keyed by client id."""

    train_message_type: str
    # the metrics contract of this method's training replies (a method's own extends TrainReply)
    train_reply: type[TrainReply] = TrainReply

    def __init__(self, num_clients: int, fraction_train: float, aggregation: str = "mean",
                 trim_fraction: float = 0.2, *, matrix_storage: ClientMatrixStorage | None = None) -> None:
        """`aggregation` / `trim_fraction`: the rule of the global part (`global_mean`);
        `matrix_storage`: where V (and a subclass's other [N, P] matrices) live, memory or a file
        above a size (the ServerApp passes the run config's; default: in memory up to 4 GiB)."""
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {aggregation!r}; allowed: {', '.join(AGGREGATIONS)}")
        self.num_clients = num_clients
        self.fraction_train = fraction_train
        self.layout: ParameterLayout | None = None
        self.personal: torch.Tensor | None = None  # V [num_clients, P]
        self.num_examples = torch.zeros(num_clients)
        self.aggregation = aggregation
        self.trim_fraction = trim_fraction
        self.last_trained = torch.full((num_clients,), -1, dtype=torch.long)  # round; -1 = never
        self.matrix_storage = matrix_storage if matrix_storage is not None else ClientMatrixStorage()

    def freshness(self, server_round: int, decay: float = 1.0) -> torch.Tensor:
        """Weight [N] of every client's row: 0 for a client that never trained (its row is still the
        initial model), decay^(rounds since it last trained) otherwise (1 for this round's clients;
        decay = 1: every trained row weighs 1)."""
        age = (server_round - self.last_trained).to(torch.float64)
        weights = torch.pow(torch.tensor(decay, dtype=torch.float64), age)
        return torch.where(self.last_trained >= 0, weights, torch.zeros_like(weights))

    def global_mean(self, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The global part's aggregate of this round's client rows under `self.aggregation`: the
        weighted mean, or a robust rule (strategies/shared/robust_aggregation.py)."""
        if self.aggregation == "mean":
            return weighted_mean(rows, weights)
        return robust_mean(rows, self.aggregation, self.trim_fraction)

    # --- hooks ------------------------------------------------------------------------------
    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        """What client `client` receives for training this round."""
        raise NotImplementedError

    def absorb(self, client: int, content: RecordDict) -> None:
        """Store what a client sent back (default: its personalized model as row `client` of V)."""
        self.personal[client] = self.layout.row(content[PERSONAL])

    def after_train(self, server_round: int) -> ArrayRecord | None:
        """Server step after the replies are absorbed; returns the new global model, if any."""
        return None

    def evaluate_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({PERSONAL: self.personal_arrays(client), CONFIG: config})

    # --- shared machinery -------------------------------------------------------------------
    def personal_arrays(self, client: int) -> ArrayRecord:
        return self.layout.arrays(self.personal[client])

    def bind(self, arrays: ArrayRecord) -> None:
        """On first use, lay out V from the global model."""
        if self.layout is None:
            self.layout = ParameterLayout.of(arrays)
            self.personal = self.matrix_storage.filled(self.layout.row(arrays), self.num_clients)

    def sample_size(self, online: int) -> int:
        """Clients trained per round out of `online`: max(1, ⌊ρ·online⌋), Flower's FedAvg rule
        (m = max(1, ⌊C·N⌋))."""
        return max(int(online * self.fraction_train), 1)

    def summary(self) -> None:
        log.info("%s: %d clients, fraction-train %.2f", type(self).__name__, self.num_clients,
                 self.fraction_train)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.bind(arrays)
        sampled, _ = sample_nodes(grid, 1, self.sample_size(len(grid.get_node_ids())))
        return [
            Message(self.train_content(c, arrays, config), dst_node_id=c,
                    message_type=self.train_message_type)
            for c in sorted(sampled)
        ]

    def aggregate_train(
        self, server_round: int, replies: Replies
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        losses, weights = [], []
        for client, reply in replies:
            if reply.has_error():
                continue
            metrics = self.train_reply.read(reply.content[METRICS])
            self.num_examples[client] = metrics.num_examples
            self.last_trained[client] = server_round
            self.absorb(client, reply.content)
            losses.append(metrics.train_loss)
            weights.append(metrics.num_examples)
        arrays = self.after_train(server_round)
        if not weights:
            return arrays, None
        loss = float(torch.tensor(losses) @ torch.tensor(weights, dtype=torch.float32)) / sum(weights)
        return arrays, MetricRecord({"train-loss": loss})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.bind(arrays)
        return [
            Message(self.evaluate_content(c, arrays, config), dst_node_id=c, message_type=EVALUATE)
            for c in grid.get_node_ids()
        ]

    def aggregate_evaluate(self, server_round: int, replies: Replies) -> MetricRecord | None:
        correct = total = 0.0
        for _, reply in replies:
            if not reply.has_error():
                correct += float(reply.content[METRICS]["correct"])
                total += float(reply.content[METRICS]["num-examples"])
        return MetricRecord({"accuracy": correct / total}) if total else None
