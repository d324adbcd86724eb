"""`fedper` (Arivazhagan et al., 2019): shared feature extractor, personal head, on the partial-sharing
base (`strategies.shared.partial`); one of the partial-sharing baselines of the SFL paper. Client i
receives the global `features.*` with its own `head.*`; the server averages `features.*` only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.partial import PartialSharing

if TYPE_CHECKING:
    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


class FedPer(PartialSharing):
    """FedPer: shared `features.*`, personal `head.*`."""

    shared_part = "features"


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> FedPer:
    """The strategy of a run (its `Method` builder, `strategies.methods.fedper.server:build`)."""
    return FedPer(cfg.num_clients, cfg.fraction_train, cfg.aggregation, cfg.trim_fraction,
                  matrix_storage=storage)
