"""`fedu`: federated multi-task learning with Laplacian regularisation over a client graph;
settings `settings.py`, server step `server.py`; clients run the generic `train.local` step."""

from strategies.methods.fedu.settings import METHODS  # noqa: F401 (the registry reads it)
