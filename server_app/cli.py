"""`bouquet`: check a run config before anything is submitted, and run `flwr run` only when it is valid.

    bouquet check --run-config "method='flt' num-rounds=3"   # validate defaults + overrides
    bouquet run . --stream --run-config "num-rounds=3"        # check, then `flwr run` with these args

Flower itself rejects an unknown key with "[code: 15] Invalid run configuration." and checks no value;
`bouquet check` names the key with the nearest valid ones and reports a wrong value as one line naming
the key and what is allowed (`RunConfig`, the validation the ServerApp runs). On a SuperLink on this
machine (the local simulation) it also loads the data set the clients will read, so missing data is
reported before a run starts (`--no-data` skips that, e.g. when only the SuperNodes hold the data).

`bouquet run` passes its arguments to `flwr run` unchanged, with one exception: a relative
`output-dir` (the default `outputs`) is made absolute against the folder `bouquet run` was started in
when the SuperLink runs on this machine, so results land there rather than in the local SuperLink's
working directory. With `--stream` it exits 1 when the run ended failed (`flwr run` exits 0).
Exit codes: 0 valid (or the run completed), 2 invalid run config or missing data, else `flwr run`'s.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from strategies.shared.generate import toml_value
from strategies.shared.known_warnings import is_known_noise
from strategies.shared.run_config import (RunConfig, default_run_config, flat_keys,
                                           unknown_key_message)
from strategies.shared.settings import ConfigError

INVALID = 2  # exit status of an invalid run config (argparse uses 2 for bad arguments too)

# `flwr run` options that take a value (every other option is a flag)
_VALUE_OPTIONS = ("--run-config", "-c", "--federation-config", "--federation", "--format")
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0")
_STARTED = re.compile(r"Successfully started run (\d+)")


class CheckFailed(Exception):
    """A run config or its data that cannot run; the message is the one line to print."""


# --- the check ------------------------------------------------------------------------------------
def app_defaults(app: Path) -> dict[str, Any]:
    """The run-config defaults of the app at `app` (its pyproject.toml, flattened as Flower does);
    this installation's when `app` has none."""
    pyproject = app / "pyproject.toml"
    if not pyproject.is_file():
        return default_run_config()
    table = tomllib.loads(pyproject.read_text()).get("tool", {}).get("flwr", {}).get("app", {})
    if "config" not in table:
        return default_run_config()
    return flat_keys(table["config"])


def parse_overrides(values: Sequence[str]) -> dict[str, Any]:
    """`--run-config` values as `flwr run` reads them (`k=v k2='s'` strings, or one .toml file)."""
    if not values:
        return {}
    from flwr.common.config import parse_config_args

    try:
        return dict(parse_config_args(list(values)))
    except OSError as err:
        raise CheckFailed(f"run config: cannot read {err.filename}: {err.strerror}") from None
    except Exception as err:  # click.ClickException (bad syntax), ValueError (toml + pairs)
        message = getattr(err, "message", None) or str(err)
        raise CheckFailed(f"run config: {message}") from None


def check(overrides: Mapping[str, Any], defaults: Mapping[str, Any] | None = None,
          data: bool = False) -> RunConfig:
    """Validate `defaults` + `overrides` as the ServerApp will; with `data`, also load the data set
    the run reads (as a local simulation's clients will). Raises `CheckFailed` with one line."""
    defaults = default_run_config() if defaults is None else dict(defaults)
    for key in overrides:  # what Flower rejects with code 15, named here
        if key not in defaults:
            raise CheckFailed(f"run config: {unknown_key_message(key)}")
    try:
        cfg = RunConfig.from_flower({**defaults, **overrides})
    except ConfigError as err:
        raise CheckFailed(str(err)) from None
    if data:
        check_data(cfg)
    return cfg


def check_data(cfg: RunConfig) -> None:
    """Load the run's data set and partition (cached per process, as the clients load it), or with
    `data-dir` (a simulation over one's own data) find the clients there."""
    from datasets.federated import load_partition
    from datasets.local import LocalDataError, discover
    from datasets.sources import DataNotFoundError

    if cfg.data_dir:
        try:
            found = discover(cfg.data_dir)
        except LocalDataError as err:
            raise CheckFailed(f"data-dir: {err}") from None
        if len(found) != cfg.num_clients:
            raise CheckFailed(f"data-dir = '{cfg.data_dir}' holds {len(found)} clients "
                              f"({', '.join(c.name for c in found[:5])}{', ...' if len(found) > 5 else ''}) "
                              f"but num-clients = {cfg.num_clients}; set num-clients={len(found)}")
        return
    try:
        load_partition(cfg.data_spec)
    except (DataNotFoundError, OSError) as err:
        raise CheckFailed(f"data: {err}") from None


# --- where results land ---------------------------------------------------------------------------
def superlink_is_local(connection: str | None) -> bool:
    """Whether the named (or default) SuperLink connection runs on this machine: Flower's local
    simulation (`:local:`) or an address on the loopback interface."""
    try:
        from flwr.cli.flower_config import read_superlink_connection

        address = read_superlink_connection(connection).address or ""
    except Exception:  # no or unreadable Flower config: `flwr run` reports it itself
        return False
    if address.startswith(":local"):
        return True
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host in _LOCAL_HOSTS


def absolute_output_dir(overrides: Mapping[str, Any], defaults: Mapping[str, Any],
                        cwd: Path) -> str | None:
    """The run's output-dir made absolute against `cwd`; None when it is absolute already."""
    path = Path(str(overrides.get("output-dir", defaults.get("output-dir", "outputs")))).expanduser()
    return None if path.is_absolute() else str((cwd / path).resolve())


def toml_string(text: str) -> str:
    """`text` as a TOML string that Flower's `--run-config` parser keeps whole."""
    if "'" not in text and "\n" not in text:
        return f"'{text}'"
    if '"' in text or "\\" in text or "\n" in text:
        raise CheckFailed(f"run config: output-dir {text!r} has quotes of both kinds; rename it")
    return f'"{text}"'


# --- `flwr run` arguments -------------------------------------------------------------------------
def split_run_args(args: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """(positionals [app, connection], --run-config values, every other argument in order)."""
    positionals: list[str] = []
    run_config: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in ("--run-config", "-c"):
            if eq:
                run_config.append(value)
            elif i + 1 < len(args):
                run_config.append(args[i + 1])
                i += 1
            else:
                raise CheckFailed(f"{arg} needs a value, e.g. {arg} \"num-rounds=3\"")
        elif arg in _VALUE_OPTIONS and i + 1 < len(args):
            rest += [arg, args[i + 1]]
            i += 1
        elif arg.startswith("-"):
            rest.append(arg)
        else:
            positionals.append(arg)
        i += 1
    return positionals, run_config, rest


def flwr_executable() -> str:
    beside = Path(sys.executable).with_name("flwr")  # the flwr of this environment
    return str(beside) if beside.is_file() else (shutil.which("flwr") or "flwr")


def run_status(connection: str | None, run_id: str) -> dict[str, Any] | None:
    """The run's `flwr list` record (status `finished:failed`, ...); None if it cannot be read."""
    command = [flwr_executable(), "list", *([connection] if connection else []), "--run-id", run_id,
               "--format", "json"]
    try:
        listing = subprocess.run(command, capture_output=True, text=True, timeout=60)
        return json.loads(listing.stdout)["runs"][0]
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, IndexError):
        return None


def run(args: Sequence[str], cwd: Path | None = None, data: bool | None = None) -> int:
    """`bouquet run ARGS`: check the run config, then `flwr run ARGS` (output-dir made absolute for
    a SuperLink on this machine); the exit status."""
    cwd = cwd or Path.cwd()
    positionals, run_config, rest = split_run_args(args)
    app = Path(positionals[0] if positionals else ".").expanduser()
    connection = positionals[1] if len(positionals) > 1 else None
    local = superlink_is_local(connection)
    defaults = app_defaults(app)
    overrides = parse_overrides(run_config)
    check(overrides, defaults, data=local if data is None else data)

    extra_file = None
    absolute = absolute_output_dir(overrides, defaults, cwd) if local else None
    if absolute is not None:
        if len(run_config) == 1 and run_config[0].endswith(".toml"):  # a file can't take k=v too
            merged = {**overrides, "output-dir": absolute}
            extra_file = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
            extra_file.write("".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in merged.items()))
            extra_file.close()
            run_config = [extra_file.name]
        else:
            run_config = [*run_config, f"output-dir={toml_string(absolute)}"]
        print(f"bouquet: results go to {absolute}/<run-name>", flush=True)
    elif not local:
        print("bouquet: the SuperLink is not on this machine: a relative output-dir is resolved on "
              "the server, against its ServerApp's working directory", flush=True)

    command = [flwr_executable(), "run", *positionals[:2], *rest]
    for value in run_config:
        command += ["--run-config", value]
    try:
        return _flwr_run(command, connection, stream="--stream" in rest)
    finally:
        if extra_file is not None:
            Path(extra_file.name).unlink(missing_ok=True)


def _flwr_run(command: list[str], connection: str | None, stream: bool) -> int:
    """Run `flwr run`, echoing its output; with --stream, exit 1 when the run ended failed."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1) as process:
        run_id = None
        assert process.stdout is not None
        for line in process.stdout:
            if is_known_noise(line):  # Flower's warnings logged before the app is loaded
                continue
            sys.stdout.write(line)
            sys.stdout.flush()
            if run_id is None and (match := _STARTED.search(line)):
                run_id = match.group(1)
        code = process.wait()
    if code != 0 or not stream or run_id is None:
        return code
    status = run_status(connection, run_id)
    if status and str(status.get("status", "")).endswith("failed"):
        details = status.get("status-details") or "see the log above"
        print(f"bouquet: run {run_id} failed: {details}", file=sys.stderr)
        return 1
    return 0


# --- the command ----------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="bouquet", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check_cmd = commands.add_parser(
        "check", help="validate a run config (pyproject defaults + overrides); nothing is submitted")
    check_cmd.add_argument("app", nargs="?", default=".",
                           help="the Bouquet app folder whose pyproject.toml holds the defaults")
    check_cmd.add_argument("--run-config", "-c", action="append", default=[],
                           help="overrides as for `flwr run`: \"key=value key2='text'\" or a .toml file")
    check_cmd.add_argument("--no-data", action="store_true",
                           help="do not load the data set (only the SuperNodes hold it)")
    commands.add_parser("run", help="check, then `flwr run` with the same arguments",
                        add_help=False)
    if argv[:1] == ["run"]:  # everything after `run` belongs to `flwr run`
        if any(arg in ("-h", "--help") for arg in argv[1:]):
            print("usage: bouquet run [flwr run arguments...]\n\nChecks --run-config like "
                  "`bouquet check`, then runs `flwr run` with the same arguments.")
            return 0
        try:
            return run(argv[1:])
        except CheckFailed as err:
            print(f"bouquet: {err}", file=sys.stderr)
            print("bouquet: nothing was submitted", file=sys.stderr)
            return INVALID
    args = parser.parse_args(argv)
    try:
        app = Path(args.app).expanduser()
        cfg = check(parse_overrides(args.run_config), app_defaults(app), data=not args.no_data)
    except CheckFailed as err:
        print(f"bouquet: {err}", file=sys.stderr)
        return INVALID
    print(f"bouquet: run config is valid: method={cfg.method} dataset={cfg.dataset} "
          f"partition={cfg.partition} clients={cfg.num_clients} rounds={cfg.num_rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
