"""Export a built-in partition to one folder per client in the local npz format:

    python -m client_app.export --dataset mnist --partition label-clusters --num-clients 10 \\
        --seed 0 --out DIR

Any run config key is given as `--<key> <value>` (the keys of `[tool.flwr.app.config]`; the others
keep their defaults) and validated as a run would validate it; `datasets.export.export` then writes
`DIR/client-000 ... DIR/client-NNN` with `train.npz` and `test.npz`. A run with the same keys on the
folders (node_config `data-dir`) gives the partitioned run's numbers exactly.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from datasets.export import export
from strategies.shared.run_config import RunConfig, default_run_config
from strategies.shared.settings import ConfigError


def _value(text: str) -> Any:
    """A command-line value as TOML reads it (numbers, true/false), else the string itself."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m client_app.export",
        description="Write a built-in partition as one folder per client (local npz format). Any "
                    "run config key is given as --<key> <value>.")
    parser.add_argument("--out", required=True, help="folder to write client-000 ... into")
    known, rest = parser.parse_known_args(argv)
    overrides: dict[str, Any] = {}
    while rest:
        key = rest.pop(0)
        if not key.startswith("--") or not rest:
            parser.error(f"expected --<run config key> <value>, got {key!r}")
        overrides[key[2:]] = _value(rest.pop(0))
    try:
        cfg = RunConfig.from_flower({**default_run_config(), **overrides})
    except ConfigError as err:
        parser.error(str(err))
    folders = export(cfg, known.out)
    print(f"wrote {len(folders)} client folders to {Path(known.out).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
