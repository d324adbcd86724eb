"""`lg-fedavg`'s registry entry: it has no settings of its own (its strategy takes the common
settings: `server.py`)."""

from __future__ import annotations

from strategies.shared.method import Method

METHODS = (Method("lg-fedavg", "strategies.methods.lg_fedavg.server:build", robust=True, secure_aggregation=True,
           summary="LG-FedAvg: personal feature extractor, shared head",
           client_step="client_app/methods/local.py", privacy=("sample",)),)
