"""One live owner per run directory (server_app/run_lock.py): refusal naming the owner, takeover of a
dead owner's lock, heartbeat, and a run that lost its lock writing no further round."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client_app.app import app as client_app
from server_app.app import run
from server_app.harness.local_grid import LocalGrid
from server_app.run_lock import (LOCK_NAME, Owner, RunLock, RunLockedError, RunLockLostError,
                                 read_owner, _write)
from strategies.shared.run_config import RunConfig, default_run_config


def _dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _plant(directory: Path, host: str, pid: int, heartbeat_age: float) -> Owner:
    directory.mkdir(parents=True, exist_ok=True)
    now = time.time()
    owner = Owner(host, pid, "someone-else", now - 3600, now - heartbeat_age)
    _write(directory, owner)
    return owner


def test_the_lock_names_host_pid_and_heartbeat_and_is_removed_on_release(tmp_path):
    with RunLock(tmp_path / "run", interval=0.05, stale_after=5) as lock:
        owner = read_owner(tmp_path / "run")
        assert (owner.host, owner.pid, owner.token) == (socket.gethostname(), os.getpid(), lock.token)
        first = owner.heartbeat
        time.sleep(0.3)
        assert read_owner(tmp_path / "run").heartbeat > first  # refreshed while held
        lock.verify()
    assert not (tmp_path / "run" / LOCK_NAME).exists()


def test_a_second_owner_is_refused_while_the_first_lives_naming_it(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunLockedError, match=rf"PID {os.getpid()} on host {socket.gethostname()}"):
            RunLock(tmp_path).acquire()
    # another host's owner with a fresh heartbeat is alive as far as we can tell
    _plant(tmp_path, "elsewhere", 1, heartbeat_age=5)
    with pytest.raises(RunLockedError, match="PID 1 on host elsewhere .*last heartbeat 5 s ago"):
        RunLock(tmp_path, stale_after=60).acquire()


@pytest.mark.parametrize("host, age, reason", [
    ("here", 0, "process .* no longer exists"),  # same host, PID gone
    ("elsewhere", 120, "heartbeat is 120 s old"),  # other host, silent too long
])
def test_a_dead_owners_lock_is_taken_over_and_logged(tmp_path, caplog, host, age, reason):
    _plant(tmp_path, socket.gethostname() if host == "here" else host, _dead_pid(), age)
    with caplog.at_level(logging.WARNING, logger="flwr.bouquet"):
        with RunLock(tmp_path, stale_after=60) as lock:
            assert read_owner(tmp_path).token == lock.token
    assert any("taking over" in r.message and __import__("re").search(reason, r.message)
               for r in caplog.records), [r.message for r in caplog.records]


def test_a_lock_taken_over_is_noticed_and_not_removed_by_its_old_holder(tmp_path):
    lock = RunLock(tmp_path, interval=0.05, stale_after=5).acquire()
    intruder = _plant(tmp_path, "elsewhere", 4242, heartbeat_age=0)
    with pytest.raises(RunLockLostError, match="PID 4242 on host elsewhere"):
        lock.verify()
    time.sleep(0.2)
    assert read_owner(tmp_path) == intruder  # the old holder's heartbeat did not overwrite it
    lock.release()
    assert read_owner(tmp_path) == intruder  # nor did its release remove it


def _config(tmp_path: Path, **extra) -> dict:
    return {**default_run_config(), "dataset": "digits", "model": "mclr", "partition": "iid",
            "num-clients": 2, "num-rounds": 3, "max-samples-per-client": 40, "finetune-epochs": 0,
            "client-threads": 1, "method": "fedavg", "output-dir": str(tmp_path), "run-name": "run",
            **extra}


def _rounds(directory: Path) -> list[int]:
    return [json.loads(line)["round"] for line in (directory / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.federation
def test_a_resume_while_the_owner_lives_is_refused_and_touches_nothing(tmp_path):
    config = _config(tmp_path, **{"num-rounds": 1})
    run(LocalGrid(client_app, 2, config), RunConfig.from_flower(config))
    directory = tmp_path / "run"
    before = {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}
    assert LOCK_NAME not in before  # released at the end of the run
    resumed = {**config, "num-rounds": 2, "resume": True}
    with RunLock(directory):  # a live ServerApp holds the directory
        with pytest.raises(RunLockedError, match=f"in use by the ServerApp with PID {os.getpid()}"):
            run(LocalGrid(client_app, 2, resumed), RunConfig.from_flower(resumed))
        after = {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}
        assert {k: v for k, v in after.items() if k != LOCK_NAME} == before
    run(LocalGrid(client_app, 2, resumed), RunConfig.from_flower(resumed))  # owner gone: resumes
    assert _rounds(directory) == [0, 1, 2]


@pytest.mark.federation
def test_a_run_that_lost_its_lock_writes_no_further_round(tmp_path):
    """The lock is taken over while round 2 trains: the run stops before its next rounds.jsonl
    line, so the new owner's rounds are never doubled."""
    config = _config(tmp_path)
    directory = tmp_path / "run"

    def taken_over_in_round_2(message, context):
        if message.metadata.message_type.startswith("train") and \
                message.content["config"]["server-round"] == 2:
            _plant(directory, "elsewhere", 4242, heartbeat_age=0)
        return client_app(message, context)

    with pytest.raises(RunLockLostError, match="no longer owns it"):
        run(LocalGrid(taken_over_in_round_2, 2, config), RunConfig.from_flower(config))
    written = _rounds(directory)  # round 1's line waits for its evaluation, fused into round 2
    assert written == list(range(len(written))) and 2 not in written, written
    assert read_owner(directory).host == "elsewhere"
    assert not (directory / "summary.json").exists()
