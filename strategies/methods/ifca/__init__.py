"""`ifca`: iterative federated clustering; settings `settings.py`, server step `server.py`, client
step `client_app/methods/ifca.py`."""

from strategies.methods.ifca.settings import METHODS  # noqa: F401 (the registry reads it)
