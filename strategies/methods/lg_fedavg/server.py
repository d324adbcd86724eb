"""`lg-fedavg` (LG-FedAvg, Liang et al., 2020): personal feature extractor ("local representation"),
shared head, on the partial-sharing base (`strategies.shared.partial`); one of the partial-sharing
baselines of the SFL paper. The reverse of FedPer: the server averages `head.*` only."""

from __future__ import annotations

from strategies.shared.partial import PartialSharing


class LGFedAvg(PartialSharing):
    """LG-FedAvg: personal `features.*` (local representation), shared `head.*`."""

    shared_part = "head"
