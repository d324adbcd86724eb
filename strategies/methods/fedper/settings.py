"""`fedper`'s registry entry: it has no settings of its own (its strategy takes the common
settings: `server.py`)."""

from __future__ import annotations

from strategies.shared.method import Method

METHODS = (Method("fedper", "strategies.methods.fedper.server:build", robust=True, secure_aggregation=True,
           summary="FedPer: shared feature extractor (`features.*`), personal head (`head.*`)",
           client_step="client_app/methods/local.py", privacy=("sample",)),)
