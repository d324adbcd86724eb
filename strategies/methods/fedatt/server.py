"""`fedatt`: FedAtt (Ji et al., IJCNN 2019, "Learning Private Neural Language Modeling with Attentive
Aggregation"), the server's attentive aggregation.

The sampled clients train the global model w as FedAvg's do (the generic `train`) and send back
w_k. For each layer l (each floating-point entry of the model's state, weight and bias apart, as
in the authors' code) the server scores every client by the distance s_k^l = ‖w^l − w_k^l‖₂, takes
the attention α^l = softmax_k(s^l) and steps

    w^l ← w^l − ε · Σ_k α_k^l · (w^l − w_k^l)  (+ σ·N(0, I), `fedatt.noise`; off by default).

Clients' sample counts play no part. The noise is drawn from a generator seeded by (seed, round), so
a run is reproducible and a resumed run draws the same noise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collections.abc import Iterable, Sequence

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from strategies.methods.fedatt.settings import FedAttSection
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.messages import CONFIG, GLOBAL, MODEL, TRAIN
from strategies.shared.params import ParameterLayout
from strategies.shared.personalized import PersonalizedStrategy

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig


def attention(server: torch.Tensor, clients: torch.Tensor, offsets: Sequence[int]) -> torch.Tensor:
    """α [L, K]: per layer l (entries offsets[l]:offsets[l+1] of the rows), the softmax over the K
    clients of ‖w^l − w_k^l‖₂ (server [P], clients [K, P]); computed in float64."""
    diffs = server.to(torch.float64).unsqueeze(0) - clients.to(torch.float64)
    distances = torch.stack([diffs[:, lo:hi].norm(dim=1) for lo, hi in zip(offsets[:-1], offsets[1:])])
    return torch.softmax(distances, dim=1)


def attentive_step(server: torch.Tensor, clients: torch.Tensor, offsets: Sequence[int],
                   epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(the new global row, α [L, K]): w^l − ε·Σ_k α_k^l (w^l − w_k^l) for every layer l."""
    alpha = attention(server, clients, offsets)
    diffs = server.to(torch.float64).unsqueeze(0) - clients.to(torch.float64)
    step = torch.cat([alpha[l] @ diffs[:, lo:hi]
                      for l, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:]))])
    return (server.to(torch.float64) - epsilon * step).to(server.dtype), alpha


def noise_seed(seed: int, server_round: int) -> int:
    """The seed of round `server_round`'s noise generator."""
    return (int(seed) * 1_000_003 + int(server_round)) % (2**63 - 1)


class FedAtt(PersonalizedStrategy):
    train_message_type = TRAIN  # the generic local update (client_app/methods/fedavg.py)

    def __init__(self, num_clients: int, fraction_train: float, settings: FedAttSection,
                 seed: int = 0, *, matrix_storage: ClientMatrixStorage | None = None) -> None:
        super().__init__(num_clients, fraction_train, matrix_storage=matrix_storage)
        self.epsilon = settings.epsilon
        self.noise = settings.noise
        self.seed = seed
        self._server: torch.Tensor | None = None  # this round's global model as a row
        self._rows: list[torch.Tensor] = []

    def bind(self, arrays: ArrayRecord) -> None:
        """On first use, the layout (the server keeps no per-client models)."""
        if self.layout is None:
            self.layout = ParameterLayout.of(arrays)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.bind(arrays)
        self._server = self.layout.row(arrays)
        self._rows = []
        return super().configure_train(server_round, arrays, config, grid)

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({GLOBAL: arrays, CONFIG: config})

    def absorb(self, client: int, content: RecordDict) -> None:
        self._rows.append(self.layout.row(content[MODEL]))

    def after_train(self, server_round: int) -> ArrayRecord | None:
        if not self._rows:
            return None
        clients = torch.stack(self._rows)
        self._rows = []
        new, _ = attentive_step(self._server, clients, self.layout.offsets, self.epsilon)
        if self.noise > 0:
            generator = torch.Generator().manual_seed(noise_seed(self.seed, server_round))
            new = new + self.noise * torch.randn(new.shape, generator=generator, dtype=new.dtype)
        return self.layout.arrays(new)

    def evaluate_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({GLOBAL: arrays, CONFIG: config})


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> FedAtt:
    """The strategy of a run (its `Method` builder, `strategies.methods.fedatt.server:build`)."""
    return FedAtt(cfg.num_clients, cfg.fraction_train, cfg.fedatt, cfg.seed, matrix_storage=storage)
