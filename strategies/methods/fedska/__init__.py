"""`fedska`: client-graph structure learning with a split-learning GNN encoder; settings and
messages `settings.py`, server step `server.py`, graph learning `structure_learning.py`; client step
`client_app/methods/fedska.py`."""

from strategies.methods.fedska.settings import METHODS  # noqa: F401 (the registry reads it)
