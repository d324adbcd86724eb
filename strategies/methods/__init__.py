"""One package per method (`strategies/methods/<method>/`), found by the registry
(`strategies.shared.registry.discover`): its `__init__` declares `METHODS = (Method(...), ...)` and
imports only its settings; its server step is `server.py`, its contract `settings.py`."""
