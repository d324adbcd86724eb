"""`fedatt`: attentive aggregation of the clients' models, layer by layer (settings `fedatt.*` in
`settings.py`, server step `server.py`); the client step is FedAvg's (`client_app/methods/fedavg.py`)."""

from strategies.methods.fedatt.settings import METHODS  # noqa: F401 (the registry reads it)
