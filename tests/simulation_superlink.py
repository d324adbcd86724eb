"""A simulation SuperLink for end-to-end tests, and `flwr` calls against it.

The SuperLink is started with its own FLWR_HOME on a free port (connection name `e2e`) and stopped by the
PID we started, so a test neither depends on nor disturbs any SuperLink a user has running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import REPO

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def simulation_superlink(home: Path, env_extra: dict[str, str] | None = None) -> Iterator[dict]:
    """Run `flower-superlink --simulation` in `home` (its FLWR_HOME, with a config.toml naming it
    `e2e`) with `env_extra` in its environment (inherited by the simulation process it starts);
    yields the environment for `flwr` calls."""
    port = free_port()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "e2e"\n\n'
        f'[superlink.e2e]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", **(env_extra or {})}
    log = (home / "superlink.log").open("w")
    process = subprocess.Popen(
        [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
         "--host", "127.0.0.1", "--port", str(port), "--database", str(home / "state.db")],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=home,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            raise RuntimeError("the SuperLink did not start: "
                               + (home / "superlink.log").read_text()[-2000:])
        yield env
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the group we started: SuperLink + its executors
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def flwr(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`flwr <args>` from the repository root with `env`."""
    return subprocess.run([str(BIN / "flwr"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def run_status(env: dict, run_id: str) -> dict:
    """The run's record from `flwr list` (`status` is e.g. `finished:completed`)."""
    listing = flwr(env, "list", "e2e", "--run-id", run_id, "--format", "json", timeout=60)
    assert listing.returncode == 0, listing.stderr
    return json.loads(listing.stdout)["runs"][0]


def run_id(stdout: str) -> str:
    """The run id `flwr run` printed."""
    for line in stdout.splitlines():
        if "Successfully started run" in line:
            return line.split("run")[-1].split()[0]
    raise AssertionError(f"no run id in: {stdout[-2000:]}")
