"""Run a deployment job and report its real outcome: completed, failed, or the SuperLink unreachable.

Flower 1.39's `flwr run --stream` exit code does not say how a run ended: it exits 0 when a SuperLink
SIGTERM failed the run, and 1 when a SuperLink SIGKILL broke the log stream of a run that then
completed (docs/runbook.md, "Flower's exit codes"). So the outcome is read back from the SuperLink,
`flwr list <connection> --run-id <id> --format json` → `status` (`finished:completed`, `:failed`,
`:stopped`, or still `running`/`starting`/`pending`) and `status-details`, and polled until the run is
finished or `--timeout` runs out; while the SuperLink cannot be reached the poll keeps trying.

    python -m server_app.harness.outcome . my-superlink --run-config "method='fedavg' num-rounds=2"
    python -m server_app.harness.outcome my-superlink --run-id 1234   # a run already submitted

Exit codes (`EXIT_CODES`):
  0  the run finished completed
  1  the run finished failed or stopped (status, details and log tail printed)
  2  `flwr run` started no run (the SuperLink refused it: bad app, config or connection settings)
  3  the SuperLink cannot be reached (nothing is known about the run's end; it may still be running)
  4  the run had not finished when --timeout ran out (the SuperLink answered; the run goes on)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

COMPLETED = "finished:completed"
FINISHED = "finished:"
UNREACHABLE_TEXT = "Connection to the SuperLink is unavailable"  # Flower's CLI message

EXIT_COMPLETED, EXIT_FAILED, EXIT_NOT_STARTED, EXIT_UNREACHABLE, EXIT_TIMEOUT = range(5)
EXIT_CODES = {
    EXIT_COMPLETED: "the run finished completed",
    EXIT_FAILED: "the run finished failed or stopped",
    EXIT_NOT_STARTED: "`flwr run` started no run",
    EXIT_UNREACHABLE: "the SuperLink cannot be reached",
    EXIT_TIMEOUT: "the run had not finished when the timeout ran out",
}


class RunFailedError(RuntimeError):
    """A Flower run did not finish `completed` (or could not be started / read back)."""

    exit_code = EXIT_FAILED


class RunNotStartedError(RunFailedError):
    """`flwr run` printed no run id."""

    exit_code = EXIT_NOT_STARTED


class SuperLinkUnreachableError(RunFailedError):
    """The SuperLink did not answer (connection refused, TLS or address wrong, host down)."""

    exit_code = EXIT_UNREACHABLE


class RunStillRunningError(RunFailedError):
    """The run was not finished when the wait ran out."""

    exit_code = EXIT_TIMEOUT


@dataclass(frozen=True)
class RunOutcome:
    run_id: int
    status: str  # e.g. finished:completed
    details: str  # status-details: why it failed, "" when completed
    log: str  # what `flwr run --stream` printed
    cli_exit: int | None = None  # `flwr run --stream`'s own exit code (not a verdict, see above)

    @property
    def completed(self) -> bool:
        return self.status == COMPLETED

    @property
    def finished(self) -> bool:
        return self.status.startswith(FINISHED)


def _flwr() -> str:
    beside = Path(sys.executable).parent / "flwr"  # the flwr of this environment first
    found = str(beside) if beside.exists() else shutil.which("flwr")
    if not found:
        raise RunFailedError("the `flwr` CLI was not found: pip install 'flwr[simulation]>=1.39,<1.40'")
    return found


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    environment = dict(os.environ if env is None else env)
    environment.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    environment.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    return environment


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
    error = SuperLinkUnreachableError if UNREACHABLE_TEXT in output else RunNotStartedError
    raise error("`flwr run` did not start a run:\n" + output[-3000:])


def run_status(connection: str, run_id: int, *, env: Mapping[str, str] | None = None,
               cwd: str | Path | None = None, timeout: float = 60) -> tuple[str, str]:
    """(status, status-details) of a run, from `flwr list --run-id <id> --format json`.
    Raises `SuperLinkUnreachableError` when the SuperLink does not answer, `RunFailedError` when
    it answers without the run."""
    try:
        listing = subprocess.run(
            [_flwr(), "list", connection, "--run-id", str(run_id), "--format", "json"],
            env=_environment(env), cwd=cwd, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise SuperLinkUnreachableError(f"`flwr list {connection}` got no answer within "
                                        f"{timeout:.0f} s") from None
    text = listing.stdout + listing.stderr
    if UNREACHABLE_TEXT in text:
        raise SuperLinkUnreachableError(f"the SuperLink of connection '{connection}' cannot be "
                                        f"reached: {text.strip()[-1000:]}")
    try:
        runs = json.loads(listing.stdout)["runs"]
        run = next(r for r in runs if int(r["run-id"]) == run_id)
    except (ValueError, KeyError, StopIteration) as err:
        raise RunFailedError(
            f"could not read run {run_id} from `flwr list {connection}` ({err!r}): {text[-2000:]}"
        ) from None
    return str(run["status"]), str(run.get("status-details", ""))


def wait_for_final(connection: str, run_id: int, timeout: float, *, poll: float = 3.0,
                   env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                   ) -> tuple[str, str]:
    """Poll the run's status until it is `finished:*`; retry while the SuperLink is unreachable.
    Raises `SuperLinkUnreachableError` (unreachable at the end) or `RunStillRunningError`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, details = run_status(connection, run_id, env=env, cwd=cwd,
                                         timeout=max(5.0, min(60.0, deadline - time.monotonic())))
            if status.startswith(FINISHED):
                return status, details
            last: RunFailedError = RunStillRunningError(
                f"run {run_id} is still {status} after {timeout:.0f} s; it goes on: wait again "
                f"with `python -m server_app.harness.outcome {connection} --run-id {run_id}`")
        except SuperLinkUnreachableError as err:
            last = SuperLinkUnreachableError(
                f"run {run_id}: the SuperLink could not be reached until the {timeout:.0f} s wait "
                f"ran out, so its outcome is unknown ({err})")
        if time.monotonic() + poll > deadline:
            raise last
        time.sleep(poll)


def run_job(app: str | Path, connection: str, run_config: Mapping[str, object] | str = "", *,
            env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
            timeout: float = 1800) -> RunOutcome:
    """`flwr run <app> <connection> --stream`, then the run's final state, waited for while
    `timeout` (for both together) lasts: a SuperLink restart can cut the stream of a run that goes on."""
    config = run_config if isinstance(run_config, str) else run_config_arg(run_config)
    command = [_flwr(), "run", str(app), connection, "--stream"]
    if config:
        command += ["--run-config", config]
    environment = _environment(env)
    started = time.monotonic()
    try:
        result = subprocess.run(command, env=environment, cwd=cwd, capture_output=True, text=True,
                                timeout=timeout)
        log, code = result.stdout + result.stderr, result.returncode
    except subprocess.TimeoutExpired as err:
        log, code = _text(err.stdout) + _text(err.stderr), None
    run_id = parse_run_id(log)
    remaining = max(0.0, timeout - (time.monotonic() - started))
    status, details = wait_for_final(connection, run_id, remaining, env=environment, cwd=cwd)
    return RunOutcome(run_id, status, details, log, code)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


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
    parser = argparse.ArgumentParser(
        prog="python -m server_app.harness.outcome",
        description="flwr run (or follow a submitted run) and exit with how the run ended",
        epilog="exit codes: " + "; ".join(f"{code} {text}" for code, text in EXIT_CODES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="+", metavar="APP CONNECTION",
                        help="the Flower app directory (e.g. .) and a [superlink.<name>] of "
                             "$FLWR_HOME/config.toml; only CONNECTION with --run-id")
    parser.add_argument("--run-id", type=int, help="follow this run instead of starting one")
    parser.add_argument("--run-config", default="", help="as for `flwr run --run-config`")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds to wait for the run's final state (default 1800)")
    args = parser.parse_args(argv)
    expected = 1 if args.run_id is not None else 2
    if len(args.target) != expected:
        parser.error("give APP CONNECTION, or CONNECTION --run-id ID")
    try:
        if args.run_id is not None:
            status, details = wait_for_final(args.target[0], args.run_id, args.timeout)
            outcome = RunOutcome(args.run_id, status, details, "")
        else:
            outcome = run_job(args.target[0], args.target[1], args.run_config, timeout=args.timeout)
    except RunFailedError as err:
        print(f"{EXIT_CODES[err.exit_code]}: {err}", file=sys.stderr)
        return err.exit_code
    print(outcome.log, end="")
    if not outcome.completed:
        print(f"{EXIT_CODES[EXIT_FAILED]}: run {outcome.run_id} ended {outcome.status}: {outcome.details or '(no details)'}\n"
              f"--- flwr run output (tail) ---\n{outcome.log[-3000:]}", file=sys.stderr)
        return EXIT_FAILED
    print(f"run {outcome.run_id}: {outcome.status}")
    return EXIT_COMPLETED


if __name__ == "__main__":
    sys.exit(main())
