"""`lg-fedavg` (LG-FedAvg, Liang et al., 2020): personal feature extractor ("local representation"),
shared head, on the partial-sharing base (`strategies.shared.partial`); one of the partial-sharing
baselines of the SFL paper. The reverse of FedPer: the server averages `head.*` only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.partial import PartialSharing

if TYPE_CHECKING:
    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


class LGFedAvg(PartialSharing):
    """LG-FedAvg: personal `features.*` (local representation), shared `head.*`."""

    shared_part = "head"


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> LGFedAvg:
    """The strategy of a run (its `Method` builder, `strategies.methods.lg_fedavg.server:build`)."""
    return LGFedAvg(cfg.num_clients, cfg.fraction_train, cfg.aggregation, cfg.trim_fraction,
                    matrix_storage=storage)
