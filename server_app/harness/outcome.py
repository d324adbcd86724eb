"""Run a deployment job and fail loudly unless it completed.

`flwr run --stream` exits 0 even when the run failed, so the outcome is read back from the SuperLink:
`flwr list <connection> --run-id <id> --format json` → `status` `finished:completed` (or `:failed`,
`:stopped`) and `status-details` (the exception). CLI:

    python -m server_app.harness.outcome . my-superlink --run-config "method='fedavg' num-rounds=2"

exits 0 when the run completed, 1 (printing the status, its details and the log tail) otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

COMPLETED = "finished:completed"


class RunFailedError(RuntimeError):
    """A Flower run did not finish `completed` (or could not be started / read back)."""


@dataclass(frozen=True)
class RunOutcome:
    run_id: int
    status: str  # e.g. finished:completed
    details: str  # status-details: why it failed, "" when completed
    log: str  # what `flwr run --stream` printed

    @property
    def completed(self) -> bool:
        return self.status == COMPLETED


def _flwr() -> str:
    beside = Path(sys.executable).parent / "flwr"  # the flwr of this environment first
    found = str(beside) if beside.exists() else shutil.which("flwr")
    if not found:
        raise RunFailedError("the `flwr` CLI was not found: pip install 'flwr[simulation]>=1.39,<1.40'")
    return found


def run_config_arg(run_config: Mapping[str, object]) -> str:
    """A `--run-config` string (TOML values: strings quoted, bools lower-case)."""
    def value(v: object) -> str:
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)
    return " ".join(f"{key}={value(v)}" for key, v in run_config.items())


def parse_run_id(output: str) -> int:
    """The run id from `flwr run` output ("Successfully started run <id>")."""
    for line in output.splitlines():
        if "Successfully started run" in line:
            return int(line.split("run")[-1].split()[0])
    raise RunFailedError("`flwr run` did not start a run:\n" + output[-3000:])


def run_status(connection: str, run_id: int, *, env: Mapping[str, str] | None = None,
               cwd: str | Path | None = None, timeout: float = 60) -> tuple[str, str]:
    """(status, status-details) of a run, from `flwr list --run-id <id> --format json`."""
    listing = subprocess.run(
        [_flwr(), "list", connection, "--run-id", str(run_id), "--format", "json"],
        env=dict(env) if env is not None else None, cwd=cwd, capture_output=True, text=True,
        timeout=timeout,
    )
    try:
        runs = json.loads(listing.stdout)["runs"]
        run = next(r for r in runs if int(r["run-id"]) == run_id)
    except (ValueError, KeyError, StopIteration) as err:
        raise RunFailedError(
            f"could not read run {run_id} from `flwr list {connection}` ({err!r}): "
            f"{(listing.stdout + listing.stderr)[-2000:]}"
        ) from None
    return str(run["status"]), str(run.get("status-details", ""))


def run_job(app: str | Path, connection: str, run_config: Mapping[str, object] | str = "", *,
            env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
            timeout: float = 1800) -> RunOutcome:
    """`flwr run <app> <connection> --stream`, then the run's recorded outcome."""
    config = run_config if isinstance(run_config, str) else run_config_arg(run_config)
    command = [_flwr(), "run", str(app), connection, "--stream"]
    if config:
        command += ["--run-config", config]
    environment = dict(os.environ if env is None else env)
    environment.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    environment.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    result = subprocess.run(command, env=environment, cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    log = result.stdout + result.stderr
    run_id = parse_run_id(log)
    status, details = run_status(connection, run_id, env=environment, cwd=cwd)
    return RunOutcome(run_id, status, details, log)


def check_run(app: str | Path, connection: str, run_config: Mapping[str, object] | str = "",
              **kwargs) -> RunOutcome:
    """`run_job`, raising `RunFailedError` (status, details, log tail) unless it completed."""
    outcome = run_job(app, connection, run_config, **kwargs)
    if not outcome.completed:
        raise RunFailedError(
            f"run {outcome.run_id} ended {outcome.status}: {outcome.details or '(no details)'}\n"
            f"--- flwr run output (tail) ---\n{outcome.log[-3000:]}"
        )
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server_app.harness.outcome",
                                     description="flwr run, then fail unless the run completed")
    parser.add_argument("app", help="the Flower app directory (e.g. .)")
    parser.add_argument("connection", help="a [superlink.<name>] of $FLWR_HOME/config.toml")
    parser.add_argument("--run-config", default="", help="as for `flwr run --run-config`")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds (default 1800)")
    args = parser.parse_args(argv)
    try:
        outcome = check_run(args.app, args.connection, args.run_config, timeout=args.timeout)
    except (RunFailedError, subprocess.TimeoutExpired) as err:
        print(err, file=sys.stderr)
        return 1
    print(outcome.log, end="")
    print(f"run {outcome.run_id}: {outcome.status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
