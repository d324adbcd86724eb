"""`fedsem`: multi-centre FL (FeSEM); settings `settings.py`, server step `server.py`; clients run
the generic `train.local` step."""

from strategies.methods.fedsem.settings import METHODS  # noqa: F401 (the registry reads it)
