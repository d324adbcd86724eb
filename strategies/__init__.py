"""The server half of every method and what the methods share.

- `strategies/methods/<method>/`: one package per method — its settings and message contract
  (`settings.py`), its server step (`server.py`), the math only it uses, its report; its `__init__`
  declares its registry entries (`METHODS`). Its client step is `client_app/methods/<method>.py`.
- `strategies/shared/`: what several methods use — the personalised / clustered / partial-sharing
  bases, the client-graph core and priors, phases, parameter matrices, the message protocol both halves
  import, the run config and the registry that finds the method packages.

No module here talks to the network: the transport (client grid, reply validation, the exchange loop)
is `server_app`'s.
"""
