"""`fedper` (Arivazhagan et al., 2019): shared feature extractor, personal head, on the partial-sharing
base (`strategies.shared.partial`); one of the partial-sharing baselines of the SFL paper. Client i
receives the global `features.*` with its own `head.*`; the server averages `features.*` only."""

from __future__ import annotations

from strategies.shared.partial import PartialSharing


class FedPer(PartialSharing):
    """FedPer: shared `features.*`, personal `head.*`."""

    shared_part = "features"
