"""LoopbackFederation without Flower processes: a start that fails part-way stops what it started, and
executors get the deployment settings of `server_app.harness.deploy`."""

import os
import subprocess
import sys

import pytest

from server_app.harness import deploy
from server_app.harness.loopback import LoopbackFederation


class SleepingFederation(LoopbackFederation):
    """Every process is a `sleep`; key registration fails after the SuperLink side is up."""

    def spawn(self, name, argv, home, prefix=None):
        return super().spawn(name, [sys.executable, "-c", "import time; time.sleep(600)"], home)

    def _wait_port(self, port, proc, timeout=60):
        return None

    def register(self, public_key, name):
        raise RuntimeError("registering failed: the SuperLink refused the key")


def test_a_start_that_fails_part_way_stops_the_processes_it_started(tmp_path):
    federation = SleepingFederation(tmp_path / "fed", num_supernodes=2)
    started = []
    original = LoopbackFederation.spawn

    def recording_spawn(self, name, argv, home, prefix=None):
        proc = original(self, name, argv, home, prefix)
        started.append(proc.process)
        return proc

    LoopbackFederation.spawn = recording_spawn
    try:
        with pytest.raises(RuntimeError, match="registering failed"):
            with federation:
                pass
    finally:
        LoopbackFederation.spawn = original
    assert len(started) == 2  # the SuperLink and its ServerApp executor
    assert all(process.poll() is not None for process in started)
    assert federation.procs == {}


def test_executors_get_the_deployment_settings(tmp_path, monkeypatch):
    seen = {}

    class Recorder:
        def __init__(self, argv, env, **kwargs):
            seen[argv[0].rsplit("/", 1)[-1]] = env
            self.pid = 0

    monkeypatch.setattr(subprocess, "Popen", Recorder)
    federation = LoopbackFederation(tmp_path, 1)
    federation.spawn("executor", deploy.clientapp_executor(), "node")
    federation.spawn("node", ["flower-supernode", "--help"], "node")
    for key, value in deploy.EXECUTOR_ENV.items():
        assert seen["flower-superexec"][key] == value
    assert (seen["flower-supernode"].get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL")
            == os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL"))  # only executors get it
    slower = LoopbackFederation(tmp_path, 1, env_extra={"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "1.0"})
    slower.spawn("executor", deploy.clientapp_executor(), "node")
    assert seen["flower-superexec"]["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "1.0"


def test_bare_metal_and_compose_executors_carry_the_same_settings():
    services = deploy.compose(2)["services"]
    executors = [s for name, s in services.items() if name.startswith("superexec-")]
    assert len(executors) == 3
    assert all(s["environment"] == deploy.EXECUTOR_ENV for s in executors)
    lines = deploy.bare_metal("10.0.0.1", 2, "/c", "/k", "").splitlines()
    settings = " ".join(f"{k}={v}" for k, v in deploy.EXECUTOR_ENV.items())
    executor_lines = [line for line in lines if "flower-superexec" in line]
    assert len(executor_lines) == 3
    assert all(line.startswith(settings + " flower-superexec ") for line in executor_lines)
