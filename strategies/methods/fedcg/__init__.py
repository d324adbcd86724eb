"""`fedcg`: cluster-driven graph FL; settings and messages `settings.py`, server step `server.py`,
domain balancing `domain_balance.py`, its domain graph `domain_graph.py`, its report `report.py`;
client step `client_app/methods/fedcg.py` (its model: `models/fedcg.py`)."""

from strategies.methods.fedcg.settings import METHODS  # noqa: F401 (the registry reads it)
