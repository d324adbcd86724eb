"""A fingerprint of the Bouquet code a process actually imported.

The server and every client compute it over the same package sources; a mismatch means a node serves a
stale copy of the app (e.g. a local SuperLink started from another checkout), which the server reports
before round 1 instead of silently running old code.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

PACKAGES = ("server_app", "client_app", "strategies", "models", "datasets")


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 (12 hex digits) over the relative paths and bytes of the packages' .py files."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
