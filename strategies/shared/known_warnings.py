"""Flower's and Ray's warnings that every run prints and that ask nothing of a Bouquet user, kept out
of the log: `quiet_known_warnings()` (called when `client_app` or `server_app` is imported) and
`is_known_noise(line)` for a tool that relays a run's streamed log.

- Ray's FutureWarning "Tip: In future versions of Ray, Ray will no longer override accelerator
  visible devices env var if num_gpus=0 ...", printed by `ray.init` in every simulation. Bouquet
  relies on today's behaviour (a client given no GPU sees none); setting the variable it suggests
  would change which device such a client uses, so the warning is filtered instead. In the
  simulation process Flower imports the ClientApp before it starts Ray, so importing `client_app`
  installs the filter in time.
- Flower's "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2." and "Skipping `flwr`
  dependency from app requirements ...": logged on every simulated run, whatever its size (the next
  lines say the federation's size and how to change it). Flower logs both before it loads the app,
  so only a tool that relays the stream can drop them (`is_known_noise`); the logging filter covers
  any later occurrence in a process where Bouquet is loaded.
- Flower's "Manually terminating ClientAppActor", logged by each Ray actor as the simulation ends
  (the actor has loaded the ClientApp by then, so the logging filter drops it).

Each entry names its source so that a new Flower or Ray version's wording is easy to update; nothing
else is filtered.
"""

from __future__ import annotations

import logging
import re
import warnings

# (category, message regex) of Python warnings, as `warnings.filterwarnings` takes them
KNOWN_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r"Tip: In future versions of Ray, Ray will no longer override accelerator"),
)
# Flower's log messages (on the `flwr` logger), by their start
KNOWN_FLOWER_MESSAGES: tuple[str, ...] = (
    "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",
    "Skipping `flwr` dependency from app requirements to avoid replacing the running Flower",
    "Manually terminating ClientAppActor",
)
# A relayed log line: Flower's level prefix (possibly coloured), then one of its messages; or the
# first line of the Ray warning as the `warnings` module prints it
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LINE_PATTERNS = (
    *(re.compile(r"WARNING\s*:\s*" + re.escape(m)) for m in KNOWN_FLOWER_MESSAGES),
    re.compile(r"FutureWarning: " + KNOWN_WARNINGS[0][1]),
)


class _KnownFlowerMessages(logging.Filter):
    """Drops Flower's known messages (`KNOWN_FLOWER_MESSAGES`) from the `flwr` logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        return not message.startswith(KNOWN_FLOWER_MESSAGES)


_FILTER = _KnownFlowerMessages()


def quiet_known_warnings() -> None:
    """Filter the known warnings in this process (idempotent)."""
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    flower = logging.getLogger("flwr")
    if _FILTER not in flower.filters:
        flower.addFilter(_FILTER)


def is_known_noise(line: str) -> bool:
    """Whether a line of a run's relayed log is one of the known warnings (colour codes ignored)."""
    plain = _ANSI.sub("", line)
    return any(pattern.search(plain) for pattern in _LINE_PATTERNS)
