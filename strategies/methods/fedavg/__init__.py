"""`fedavg`: Flower's FedAvg (or FedMedian / FedTrimmedAvg with `aggregation`); server step
in `server.py`, client step `client_app/methods/fedavg.py` (the generic `train`)."""

from strategies.methods.fedavg.settings import METHODS  # noqa: F401 (the registry reads it)
