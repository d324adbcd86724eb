"""`local`: every client trains its own model alone; server step `server.py`, client step
`client_app/methods/local.py`."""

from strategies.methods.local.settings import METHODS  # noqa: F401 (the registry reads it)
