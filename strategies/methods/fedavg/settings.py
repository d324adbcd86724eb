"""`fedavg`'s registry entry: it has no settings of its own (its strategy takes the common
settings: `server.py`)."""

from __future__ import annotations

from strategies.shared.method import Method

METHODS = (Method("fedavg", "strategies.methods.fedavg.server:build", robust=True, secure_aggregation=True,
           summary="global model (Flower's `FedAvg`)",
           client_step="client_app/methods/fedavg.py", privacy=("sample", "client")),)
