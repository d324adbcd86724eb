"""`scaffold`: SCAFFOLD's control variates correct the clients' drift; settings `settings.py`,
server step `server.py`, client step `client_app/methods/scaffold.py`."""

from strategies.methods.scaffold.settings import METHODS  # noqa: F401 (the registry reads it)
