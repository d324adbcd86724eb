"""`local`: every client trains its own model alone (the "Separate" baseline of the FedSKA paper)."""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies.shared.messages import CONFIG, PERSONAL, TRAIN_LOCAL
from strategies.shared.personalized import PersonalizedStrategy


class Local(PersonalizedStrategy):
    """Client i receives its own model v_i, trains it, and sends it back; nothing is shared."""

    train_message_type = TRAIN_LOCAL

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({PERSONAL: self.personal_arrays(client), CONFIG: config})
