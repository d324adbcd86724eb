"""`flt`: Federated Learning with Taskonomy; settings and messages `settings.py`, server step
`server.py`, its relatedness (`relatedness`, `set_distance`) and neighbourhood averaging
(`neighbourhood`, `neighbourhood_sums`); client step `client_app/methods/flt.py`."""

from strategies.methods.flt.settings import METHODS  # noqa: F401 (the registry reads it)
