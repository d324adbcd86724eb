"""`ditto`: FedAvg for a global model w plus, per client, a personal model v_i pulled toward w.

Ditto (Li et al., ICML 2021), Algorithm 1: each sampled client runs the FedAvg local update on w and
`personal-epochs` epochs on v_i with loss F_i(v_i) + (λ/2)·||v_i − w||² (w = the round's global model);
the server averages the w updates weighted by num-examples and keeps every v_i.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies.methods.ditto.settings import TRAIN_DITTO, DittoSection, DittoTrain
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.messages import CONFIG, GLOBAL, METRICS, MODEL, PERSONAL
from strategies.shared.personalized import PersonalizedStrategy

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig


class Ditto(PersonalizedStrategy):
    train_message_type = TRAIN_DITTO

    def __init__(self, num_clients: int, fraction_train: float, settings: DittoSection,
                 aggregation: str = "mean", trim_fraction: float = 0.2, *,
                 matrix_storage: ClientMatrixStorage | None = None) -> None:
        super().__init__(num_clients, fraction_train, aggregation, trim_fraction,
                         matrix_storage=matrix_storage)
        self.lam = settings.lambda_
        self.personal_epochs = settings.personal_epochs
        self._updates: list[tuple[torch.Tensor, float]] = []

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        ditto = DittoTrain.extending(config, ditto_lambda=self.lam,
                                     personal_epochs=self.personal_epochs)
        return RecordDict({GLOBAL: arrays, PERSONAL: self.personal_arrays(client),
                           CONFIG: ditto.config()})

    def absorb(self, client: int, content: RecordDict) -> None:
        super().absorb(client, content)
        self._updates.append(
            (self.layout.row(content[MODEL]), float(content[METRICS]["num-examples"]))
        )

    def after_train(self, server_round: int) -> ArrayRecord | None:
        if not self._updates:
            return None
        rows = torch.stack([row for row, _ in self._updates])
        weights = torch.tensor([n for _, n in self._updates])
        self._updates = []
        return self.layout.arrays(self.global_mean(rows, weights))

    def evaluate_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({GLOBAL: arrays, PERSONAL: self.personal_arrays(client), CONFIG: config})


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Ditto:
    """The strategy of a run (its `Method` builder, `strategies.methods.ditto.server:build`)."""
    return Ditto(cfg.num_clients, cfg.fraction_train, cfg.ditto, cfg.aggregation, cfg.trim_fraction,
                 matrix_storage=storage)
