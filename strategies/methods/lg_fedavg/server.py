"""`lg-fedavg` (LG-FedAvg, Liang et al., 2020): personal feature extractor ("local representation"),
shared head, on the partial-sharing base (`strategies.shared.partial`)."""

from __future__ import annotations

from strategies.shared.partial import PartialSharing


class LGFedAvg(PartialSharing):
    """LG-FedAvg: personal `features.*` (local representation), shared `head.*`."""

    shared_part = "head"
