"""Each method's client step, found by its name: `client_app/methods/<method>.py` holds the handlers
its registry entry names (`strategies/methods/<method>/__init__.py`, as `"module:function"`, imported
on the first message of their type); `fedavg.py` is the generic `train` every method may use."""
