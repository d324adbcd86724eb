"""Run-config values as written on a command line (`--run-config`, `benchmarks.compare --set`)."""

from __future__ import annotations

import json
import tomllib
from typing import Any


def parse_value(text: str) -> Any:
    """A run-config value the way Flower reads one (TOML: int, float, true/false, "quoted" string);
    anything TOML cannot read (e.g. a bare word or `0,90,180`) is taken as a plain string."""
    text = text.strip()
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        try:
            return float(text) if any(c in text for c in ".eE") else int(text)
        except ValueError:
            return text
    if isinstance(value, (bool, int, float, str)):
        return value
    return text  # arrays, tables, dates: not run-config types; keep the text


def format_value(value: Any) -> str:
    """The inverse of `parse_value` for a command line (strings quoted only where needed)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and parse_value(value) != value:
        return json.dumps(value)
    return str(value)


def method_settings(config: dict[str, Any], method: str) -> dict[str, Any]:
    """The flat run-config keys that apply to `method`: the common keys (no dot) and its own
    section's `<section>.*` keys; every other method's section is left out."""
    from strategies.shared import registry

    registered = registry.METHODS.get(method)
    section = registered.section if registered is not None else None
    return {key: value for key, value in config.items()
            if "." not in key or (section is not None and key.startswith(f"{section}."))}
