"""`ditto`: a global model plus personal models pulled toward it; settings `settings.py`, server
step `server.py`, client step `client_app/methods/ditto.py`."""

from strategies.methods.ditto.settings import METHODS  # noqa: F401 (the registry reads it)
