"""Files written from the code, never by hand: the run config's defaults (the `[tool.flwr.app.config]`
block of `pyproject.toml`, from `RunConfig` and every method's settings model) and the methods table
(`docs/methods.md`, from the registry).

    python -m strategies.shared.generate            # write both
    python -m strategies.shared.generate --check    # exit 1 naming what differs

`tests/test_config.py` fails, naming the key, when pyproject.toml and the settings models disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from strategies.shared import registry
from strategies.shared.run_config import PYPROJECT, RunConfig

REPO = PYPROJECT.parent
METHODS_PAGE = REPO / "docs" / "methods.md"
CONFIG_HEADER = "[tool.flwr.app.config]"
CONFIG_COMMENT = ("# Run configuration defaults, generated from strategies/shared/run_config.py (RunConfig) "
                  "and the methods'\n# settings sections: `python -m strategies.shared.generate`; "
                  "do not edit by hand.")


def config_defaults() -> dict[str, Any]:
    """Every run-config key (Flower's flat spelling) with its default, as pyproject.toml holds it
    (an unset optional value is the empty string)."""
    return {key: "" if value is None else value for key, value in RunConfig().flat().items()}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"run-config default {value!r} has no TOML spelling (str, int, float, bool)")


def config_block() -> str:
    """The `[tool.flwr.app.config]` block: common keys, then each settings section's keys."""
    lines = [CONFIG_COMMENT, CONFIG_HEADER]
    lines += [f"{key} = {toml_value(value)}" for key, value in config_defaults().items()]
    return "\n".join(lines) + "\n"


def with_config_block(pyproject: str) -> str:
    """`pyproject` with its config block (and the comment lines right above it) replaced by
    `config_block()`; the block ends at the first blank line or table header after it."""
    lines = pyproject.splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == CONFIG_HEADER)
    except StopIteration:
        raise ValueError(f"{PYPROJECT} has no {CONFIG_HEADER} table") from None
    end = start + 1
    while end < len(lines) and lines[end].strip() and not lines[end].startswith("["):
        end += 1
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    return "".join(lines[:start]) + config_block() + "".join(lines[end:])


def _file(module: str) -> str:
    return module.replace(".", "/") + ".py"


def method_files(method: registry.Method) -> tuple[str | None, list[str], list[str]]:
    """(settings file, server files, client files) of a method, repository-relative."""
    package = method.package
    folder = REPO / package.replace(".", "/")
    server = [f"{package.replace('.', '/')}/{p.name}" for p in sorted(folder.glob("*.py"))
              if p.name not in ("__init__.py", "settings.py")]
    server.sort(key=lambda path: not path.endswith("/server.py"))  # its server step first
    settings = _file(method.settings.__module__) if method.settings is not None else None
    client = sorted({_file(str(target).partition(":")[0]) if isinstance(target, str)
                     else _file(target.__module__) for target in method.client.values()})
    if not client and method.client_step:
        client = [method.client_step]
    return settings, server, client


def methods_table() -> str:
    """The Markdown table of every registered method: what it is and the files that hold it."""
    rows = ["| method | kind | settings + messages | server | client |", "|---|---|---|---|---|"]
    for name, method in registry.METHODS.items():
        settings, server, client = method_files(method)
        files = lambda paths: ", ".join(f"`{p}`" for p in paths) or "—"  # noqa: E731
        rows.append(f"| `{name}` | {method.summary} | {f'`{settings}`' if settings else '—'} | "
                    f"{files(server)} | {files(client)} |")
    return "\n".join(rows) + "\n"


def methods_page() -> str:
    return ("# Methods\n\n"
            "Every method is one package, `strategies/methods/<method>/`: its settings and messages\n"
            "(`settings.py`), its server step (`server.py`) and the math only it uses; its client step is\n"
            "`client_app/methods/<method>.py`. The table is generated from the registry\n"
            "(`python -m strategies.shared.generate`); see [Add a method](add-a-method.md).\n\n"
            + methods_table())


def outputs() -> dict[Path, str]:
    """Each generated file with the text it must hold."""
    return {PYPROJECT: with_config_block(PYPROJECT.read_text()), METHODS_PAGE: methods_page()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'}: {path.relative_to(REPO)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
