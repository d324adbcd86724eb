"""The method pages' cited results: tables and sentences generated from the committed results.

A page names a block by a marker, filled by `python -m docs.gen` (and at every build):

    <!-- gen:block sfl-defaults -->  ...  <!-- /gen -->

Each block is a function of this package (`docs/blocks/<page>.py`, registered with `@block`) that
reads committed results through `docs.blocks.data` and returns Markdown. Every number it shows is
computed from those files, never typed: a changed result changes the page at the next
`python -m docs.gen` (`--check` fails until then). Under every block a line names the committed
files it read, linked to their results pages.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

from docs.blocks import data

BLOCKS: dict[str, Callable[[str], str]] = {}


def block(name: str) -> Callable[[Callable[[str], str]], Callable[[str], str]]:
    """Register a block: a function of the page's link prefix (`../` per folder level) that
    returns Markdown."""
    def register(fn: Callable[[str], str]) -> Callable[[str], str]:
        if name in BLOCKS:
            raise ValueError(f"docs: block '{name}' registered twice")
        BLOCKS[name] = fn
        return fn
    return register


def _load() -> None:
    """Import every page module of this package (all but `data`)."""
    for info in pkgutil.iter_modules(__path__):
        if info.name != "data":
            importlib.import_module(f"{__name__}.{info.name}")


def generate(name: str, prefix: str = "") -> tuple[str, list[Path]]:
    """The Markdown of block `name` and the committed files it read."""
    if not BLOCKS:
        _load()
    if name not in BLOCKS:
        raise KeyError(f"docs: no block '{name}' (docs/blocks/: {', '.join(sorted(BLOCKS))})")
    sources = data.Sources()
    data._current.append(sources)
    try:
        body = BLOCKS[name](prefix).rstrip()
    finally:
        data._current.pop()
    if not sources.paths:
        raise ValueError(f"docs: block '{name}' read no committed result")
    return body, sources.paths


def render(name: str, prefix: str = "") -> str:
    """The Markdown of block `name`, followed by the committed files it was generated from."""
    body, paths = generate(name, prefix)
    links = ", ".join(data.source_link(p, prefix) for p in paths)
    note = ""
    if any(p.suffix == ".md" for p in paths):
        note = (f" {data.JSON_LESS}: read from the committed Markdown page of a run whose JSON was "
                "never committed (its only record).")
    return f"{body}\n\n<small>Generated from {links}.{note}</small>"


def names() -> list[str]:
    """Every registered block."""
    if not BLOCKS:
        _load()
    return sorted(BLOCKS)
