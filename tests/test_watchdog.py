"""The deployed ClientApp's watchdog (client_app/watchdog.py) in real processes: it ends a process
whose SuperNode runtime API is gone or whose executor died, and leaves a healthy one alone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client_app import watchdog
from tests.conftest import REPO

CHILD = """import sys, time
sys.path.insert(0, {repo!r})
from client_app import watchdog
watchdog.PARENT_GRACE, watchdog.POLL = 1.0, 0.2
assert watchdog.start()
time.sleep(120)
"""


def _clientapp_script(tmp_path: Path) -> Path:
    """A stand-in `flwr-clientapp` program that imports the watchdog and then idles."""
    script = tmp_path / "flwr-clientapp"
    script.write_text(CHILD.format(repo=str(REPO)))
    return script


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(tmp_path: Path, port: int, grace: str = "1") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(_clientapp_script(tmp_path)), "--token", "t",
                             "--runtime-api-address", f"127.0.0.1:{port}", "--parent-pid", "1"],
                            env={**os.environ, watchdog.GRACE_ENV: grace},
                            stderr=subprocess.PIPE, text=True)


def test_it_runs_only_in_a_flwr_clientapp_process():
    assert watchdog.runtime_address(["/venv/bin/flwr-clientapp", "--runtime-api-address",
                                     "127.0.0.1:9094", "--token", "x"]) == ("127.0.0.1", 9094)
    assert watchdog.runtime_address(["flwr-clientapp", "--runtime-api-address=[::1]:19094"]) == (
        "::1", 19094)
    assert watchdog.runtime_address(["/venv/bin/flwr-simulation", "--runtime-api-address",
                                     "127.0.0.1:9094"]) is None
    assert watchdog.runtime_address(["pytest", "-q"]) is None
    assert not watchdog.start(["python", "-m", "pytest"])  # nothing started in this process


def test_a_process_whose_runtime_api_is_gone_exits(tmp_path):
    started = time.monotonic()
    child = _spawn(tmp_path, _closed_port())
    code = child.wait(timeout=30)
    assert code == watchdog.EXIT_CODE
    assert time.monotonic() - started < 15
    assert "refused connections for 1 s" in child.stderr.read()


def test_a_healthy_process_is_left_alone_until_its_runtime_api_goes(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        child = _spawn(tmp_path, server.getsockname()[1])
        time.sleep(4)  # four graces with the runtime API up
        assert child.poll() is None
    assert child.wait(timeout=30) == watchdog.EXIT_CODE  # closed: gone after its grace


def test_an_orphaned_process_exits(tmp_path):
    """Its executor (the parent) is SIGKILLed: the process ends although its runtime API lives."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        parent = subprocess.Popen(
            [sys.executable, "-c", "import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:]);"
             " print(p.pid, flush=True); time.sleep(120)", sys.executable,
             str(_clientapp_script(tmp_path)), "--runtime-api-address",
             f"127.0.0.1:{server.getsockname()[1]}"],
            stdout=subprocess.PIPE, text=True, env={**os.environ, watchdog.GRACE_ENV: "60"})
        pid = int(parent.stdout.readline())
        time.sleep(2)
        parent.kill()
        parent.wait()

        def gone() -> bool:
            try:
                return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
            except FileNotFoundError:
                return True

        deadline = time.monotonic() + 20
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not gone():
            os.kill(pid, 9)
            pytest.fail(f"the orphaned ClientApp process {pid} was still running 20 s later")


def test_a_bad_grace_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(watchdog.GRACE_ENV, "soon")
    with pytest.raises(ValueError, match="BOUQUET_CLIENTAPP_GRACE='soon': expected a number"):
        watchdog._grace()


def test_a_local_runtime_api_is_seen_listening_without_connecting_to_it():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not watchdog.reachable(("127.0.0.1", port))  # bound, not yet listening
        server.listen(1)
        assert watchdog._listening_locally(port) is True
        assert watchdog.reachable(("127.0.0.1", port))
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()  # the check opened no connection
