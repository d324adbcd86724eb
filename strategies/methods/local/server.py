"""`local`: every client trains its own model alone (the "Separate" baseline of the FedSKA paper)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies.shared.messages import CONFIG, PERSONAL, TRAIN_LOCAL
from strategies.shared.personalized import PersonalizedStrategy

if TYPE_CHECKING:
    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


class Local(PersonalizedStrategy):
    """Client i receives its own model v_i, trains it, and sends it back; nothing is shared."""

    train_message_type = TRAIN_LOCAL

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({PERSONAL: self.personal_arrays(client), CONFIG: config})


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Local:
    """The strategy of a run (its `Method` builder, `strategies.methods.local.server:build`)."""
    return Local(cfg.num_clients, cfg.fraction_train, matrix_storage=storage)
