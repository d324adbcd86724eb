"""`local`'s registry entry: it has no settings of its own (its strategy takes the common
settings: `server.py`)."""

from __future__ import annotations

from strategies.shared.method import Method

METHODS = (Method("local", "strategies.methods.local.server:build", client={"train.local": "client_app.methods.local:train"},
           summary='one model per client, no sharing ("Separate")', privacy=("sample",)),)
