"""Server-side faults of a deployment, end to end: the loopback federation of test_deploy_e2e (TLS,
SuperNode authentication, SuperExec secrets, Control API on 127.0.0.1) loses its SuperLink.

- the SuperLink machine crashes (SuperLink, executor and ServerApp `kill -9`) after a round, or with
  a round in flight; it is restarted with the same flags and database, the SuperNodes rejoin by
  themselves under their node ids, and `resume=true` finishes the run with the numbers of an
  uninterrupted run (fedavg; SFL*, whose server keeps per-client models and learns a graph);
- the SuperLink alone is killed and restarted at once: the ServerApp, left running, finishes the run,
  and the outcome says so although `flwr run --stream` exits 1;
- the ServerApp still runs after a SuperLink restart: a resume is refused naming its process.

Each test prints what it measured (rejoin seconds, exit codes) for docs/runbook.md's fault table.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from server_app.harness.loopback import CONNECTION, LoopbackFederation
from server_app.harness.simulate import simulate
from server_app.run_lock import LOCK_NAME, STALE_AFTER, dead_reason, read_owner
from tests.conftest import REPO
from tests.test_deploy_e2e import (FAST, client_rows, job, namespaces, numbers, rounds_of,  # noqa: F401
                                   running_federation)

pytestmark = pytest.mark.e2e

ROUNDS = 2  # killed after round 1 or in round 2: the resume runs the rest
SFL_STAR = {"partition": "shards"}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    yield from running_federation(tmp_path_factory.mktemp("faults"))


@pytest.fixture(autouse=True)
def superlink_back_up(request):
    """A test that failed between killing the SuperLink and restarting it leaves the next test a
    federation without one: restart it (same flags and database) so one failure stays one."""
    yield
    if "federation" in request.fixturenames:
        federation = request.getfixturevalue("federation")
        if "superlink" not in federation.procs or "superexec-serverapp" not in federation.procs:
            federation.terminate("superexec-serverapp", signal.SIGKILL)
            restart_and_rejoin(federation)


def config_for(method: str, out: Path) -> dict:
    """The job a fault test runs; the safeguard is off because a resumed run (a new Flower run)
    starts without the clients' own models, and these tests compare with an uninterrupted run."""
    return job(method, out, **(SFL_STAR if method == "sfl-star" else {}),
               **{"num-rounds": ROUNDS, "round-timeout": 60.0, "safeguard": "off"})


def wait_until(condition, what: str, timeout: float = 240, poll: float = 0.2) -> float:
    """Seconds until `condition()` held."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(poll)
    raise AssertionError(f"{what}: not within {timeout} s")


def recorded(directory: Path) -> list[int]:
    path = directory / "rounds.jsonl"
    return [json.loads(line)["round"] for line in path.read_text().splitlines()] if path.exists() else []


def online_nodes(federation: LoopbackFederation) -> set[int]:
    result = federation.flwr("supernode", "list", CONNECTION, "--format", "json")
    try:
        return {int(n["node-id"]) for n in json.loads(result.stdout)["nodes"] if n["status"] == "online"}
    except (ValueError, KeyError):
        return set()


def in_background(federation: LoopbackFederation, config: dict):
    result: dict = {}

    def work() -> None:
        try:
            result["outcome"] = federation.run(REPO, config)
        except Exception as err:  # noqa: BLE001 - reported by the test
            result["error"] = err

    thread = threading.Thread(target=work)
    thread.start()
    return thread, result


def crash_superlink_machine(federation: LoopbackFederation) -> None:
    """`kill -9` of the SuperLink and of its executor's process group (executor + ServerApp), all
    signalled before any is waited for, as a machine that loses power: a SuperLink killed first
    and waited for gives the ServerApp a moment to see its connection fail and end the run
    itself (releasing its lock), which a crashed machine never does."""
    for name in ("superexec-serverapp", "superlink"):
        os.killpg(federation.procs[name].process.pid, signal.SIGKILL)
    for name in ("superexec-serverapp", "superlink"):
        federation.terminate(name, signal.SIGKILL)


def restart_and_rejoin(federation: LoopbackFederation) -> float:
    """Restart the SuperLink side; seconds until every SuperNode is online again, same node id."""
    started = time.monotonic()
    federation.start_superlink()
    wait_until(lambda: set(federation.node_ids.values()) <= online_nodes(federation),
               "the SuperNodes rejoining the restarted SuperLink", timeout=180, poll=2)
    return time.monotonic() - started


def assert_equals_uninterrupted(config: dict, directory: Path, reference_dir: Path) -> None:
    """Every round once; every rounds.jsonl field but timings, summary, clients.csv and the method's
    arrays (graph.npy, learned graphs) equal to the same run in process, uninterrupted."""
    reference = simulate({**config, "resume": False, "output-dir": str(reference_dir)}, num_nodes=3)
    expected = reference_dir / config["run-name"]
    assert recorded(directory) == list(range(ROUNDS + 1))
    summary = json.loads((directory / "summary.json").read_text())
    assert numbers(summary["final"]) == pytest.approx(numbers(reference["final"]), rel=1e-5, abs=1e-6)
    for got, want in zip(rounds_of(directory), rounds_of(expected)):
        assert set(got) == set(want)
        for key in want:
            if "seconds" in key:
                continue
            if isinstance(want[key], (int, float, dict)):
                assert numbers({key: got[key]}) == pytest.approx(numbers({key: want[key]}), rel=1e-5,
                                                                 abs=1e-6), key
            else:
                assert got[key] == want[key], key
    got_rows, want_rows = client_rows(directory), client_rows(expected)
    assert got_rows.keys() == want_rows.keys()
    for client, row in want_rows.items():
        assert got_rows[client].keys() == row.keys()
        for key, value in row.items():
            try:
                assert float(got_rows[client][key]) == pytest.approx(float(value), rel=1e-5,
                                                                     abs=1e-6), (client, key)
            except ValueError:  # a text column (device, cluster label, ...)
                assert got_rows[client][key] == value, (client, key)
    for array in sorted(expected.glob("*.npy")):  # graph.npy, SFL*'s learned graphs, ...
        np.testing.assert_allclose(np.load(directory / array.name), np.load(array), rtol=1e-5,
                                   atol=1e-6, err_msg=array.name)


@pytest.mark.parametrize("method, in_flight", [("fedavg", False), ("sfl-star", True)],
                         ids=["fedavg-after-round-1", "sfl-star-round-2-in-flight"])
def test_superlink_machine_crash_then_resume_equals_an_uninterrupted_run(federation, tmp_path,
                                                                         method, in_flight):
    config = config_for(method, tmp_path)
    directory = tmp_path / method
    node_log = federation.procs["supernode-0"].log

    def train_messages() -> int:
        return len(re.findall("Receiving: train", node_log.read_text()))

    before = train_messages()  # counted before the run: round 2's may arrive with round 1's checkpoint
    thread, result = in_background(federation, config)
    try:
        # a checkpoint after round 1 (keep-checkpoints=1 keeps only the newest, so round 1's may
        # already have given way to round 2's; round 0's comes first and does not count)
        wait_until(lambda: any(int(p.stem.split("-")[1]) >= 1
                               for p in (directory / "checkpoints").glob("round-*.ckpt")),
                   "round 1's checkpoint")
        if in_flight:  # round 2's train message (one per round and node) is being worked on
            wait_until(lambda: train_messages() >= before + 2, "a round-2 train message")
        crash_superlink_machine(federation)
        executor_log = federation.home("superlink") / "superexec-serverapp.log"
        assert max(recorded(directory)) < ROUNDS and (directory / LOCK_NAME).exists(), (  # dead owner's
            f"the run ended before the crash: rounds {recorded(directory)}; the executor's log "
            f"ends:\n{executor_log.read_text()[-3000:]}")
        rejoined = restart_and_rejoin(federation)
    finally:
        thread.join(timeout=300)  # its outcome, read back from the restarted SuperLink
    assert not thread.is_alive()
    interrupted = result.get("outcome")
    assert interrupted is not None, result.get("error")
    assert interrupted.status == "finished:failed", interrupted.status  # that run did not finish
    resumed = federation.run(REPO, {**config, "resume": True})
    assert resumed.completed, f"{resumed.status}: {resumed.details}\n{resumed.log[-3000:]}"
    executor_log = federation.home("superlink").joinpath("superexec-serverapp.log").read_text()
    assert "taking over" in executor_log + resumed.log  # the dead ServerApp's lock, logged
    assert not (directory / LOCK_NAME).exists()
    assert_equals_uninterrupted(config, directory, tmp_path / "in-process")
    print(f"\n[fault] {method}: machine crash {'in round 2' if in_flight else 'after round 1'}; "
          f"SuperNodes online again {rejoined:.1f} s after the restart; interrupted run "
          f"{interrupted.status} ({interrupted.details}), its flwr run --stream exit "
          f"{interrupted.cli_exit}; resumed run {resumed.status}, flwr exit {resumed.cli_exit}")


def test_a_quick_superlink_restart_leaves_the_serverapp_to_finish_the_run(federation, tmp_path):
    """The SuperLink alone is killed after round 1 and restarted at once: the ServerApp, a child of
    the executor, reconnects and completes the run; a resume meanwhile is refused naming it. Where
    the restarted SuperLink has already given the ServerApp's task up (its heartbeat lapsed while
    the SuperLink was down: seen once on a loaded 2-core machine), the run is marked failed, that
    ServerApp exits, and `resume=true` finishes the run from its checkpoint: nothing is lost."""
    config = config_for("fedavg", tmp_path)
    directory = tmp_path / "fedavg"
    thread, result = in_background(federation, config)
    try:
        wait_until(lambda: 1 in recorded(directory), "round 1")
        killed = time.monotonic()
        federation.terminate("superlink", signal.SIGKILL)
        federation.start_superlink()
        restarted = time.monotonic() - killed
        if max(recorded(directory)) < ROUNDS:  # the old ServerApp owns the directory still
            resume = federation.run(REPO, {**config, "resume": True})
            if resume.status == "finished:failed":  # refused while the old ServerApp held it
                assert re.search(r"in use by the ServerApp with PID \d+ on host", resume.details + resume.log)
            else:  # the old ServerApp finished (and let go) before the resume reached the directory
                assert resume.status == "finished:completed", f"{resume.status}: {resume.details}"
    finally:
        thread.join(timeout=600)
    outcome = result.get("outcome")
    assert outcome is not None, result.get("error")
    how = "the ServerApp finished it"
    if not outcome.completed:  # the SuperLink gave the task up: the documented way on is a resume
        assert "No heartbeat received from the task" in outcome.details, (
            f"{outcome.status}: {outcome.details}\n{outcome.log[-3000:]}")
        wait_until(lambda: (owner := read_owner(directory)) is None or dead_reason(
            owner, time.time(), STALE_AFTER, socket.gethostname()), "the old ServerApp exiting",
            timeout=120, poll=1)
        resumed = federation.run(REPO, {**config, "resume": True})
        assert resumed.completed, f"{resumed.status}: {resumed.details}\n{resumed.log[-3000:]}"
        how = f"marked {outcome.status} ({outcome.details}); resume=true finished it"
    assert recorded(directory) == list(range(ROUNDS + 1))  # no round twice
    assert_equals_uninterrupted(config, directory, tmp_path / "in-process")
    print(f"\n[fault] quick SuperLink restart ({restarted:.1f} s from kill to restarted): {how}; "
          f"flwr run --stream exit {outcome.cli_exit}")


# --- who can reach what -------------------------------------------------------------------------
PROBE = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), "
         "timeout=5).close()\n    print('open')\nexcept OSError as err:\n    print('closed', err)\n")


def probe_from(namespace: str, host: str, port: int) -> str:
    """'open' or 'closed <why>': a TCP connection to host:port from inside `namespace`."""
    return subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", PROBE, host,
                           str(port)], capture_output=True, text=True, timeout=30).stdout.strip()


def test_a_supernode_elsewhere_joins_over_the_fleet_port_but_cannot_reach_the_control_port(
        namespaces, tmp_path):
    """A SuperNode in its own network namespace (veth to a bridge, as another machine on the LAN)
    joins over the Fleet port; from there the Control API (`flwr run`) port refuses connections,
    while on the SuperLink host it answers."""
    fed = LoopbackFederation(tmp_path / "fed", 1, host="10.213.0.1", env_extra=FAST)
    outside = namespaces[0]
    try:
        fed.start(supernode_prefix={0: ["ip", "netns", "exec", outside]})
        wait_until(lambda: set(fed.node_ids.values()) <= online_nodes(fed), "the SuperNode joining",
                   timeout=120, poll=2)
        assert probe_from(outside, "10.213.0.1", fed.fleet_port) == "open"
        assert probe_from(outside, "10.213.0.1", fed.control_port).startswith("closed")
        (fed.home("stranger") / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "10.213.0.1:{fed.control_port}"\n'
            f'root-certificates = "{fed.certs / "ca.crt"}"\n')
        stranger = subprocess.run(
            ["ip", "netns", "exec", outside, str(Path(sys.executable).parent / "flwr"), "list",
             CONNECTION, "--format", "json"], env=fed.env("stranger"), capture_output=True,
            text=True, timeout=60)
        assert "Connection to the SuperLink is unavailable" in stranger.stdout + stranger.stderr
        assert json.loads(fed.flwr("list", CONNECTION, "--format", "json").stdout)["success"]
    finally:
        processes = [p.process for p in fed.procs.values()]
        fed.stop()
        assert all(p.poll() is not None for p in processes)
