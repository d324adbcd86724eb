"""`fedprox`: FedAvg whose clients add a proximal term (settings `fedprox.*` in `settings.py`,
server step `server.py`); the client step is FedAvg's (`client_app/methods/fedavg.py`)."""

from strategies.methods.fedprox.settings import METHODS  # noqa: F401 (the registry reads it)
