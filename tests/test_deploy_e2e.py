"""Deployed end to end: `flower-superlink` with TLS and SuperNode authentication, 3 authenticated
`flower-supernode`s (each with its own FLWR_HOME, as separate machines) and their executors, started
from `server_app.harness.deploy`'s command lines; jobs go through `flwr run` and `server_app.harness.outcome`.

Every deployed result is compared with the same configuration run in this process (`simulate`), so a
deployment that trains differently (wrong client, lost state, skipped data) fails. Every process is
started in its own session and stopped by its PID.
"""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from client_app.app import app as client_app
from server_app.harness import deploy
from server_app.app import run
from strategies.shared.run_config import RunConfig
from server_app.harness.local_grid import LocalGrid
from server_app.harness.loopback import LoopbackFederation
from server_app.harness.simulate import simulate
from strategies.shared.run_config import default_run_config
from strategies.shared.messages import CLIENT, CONFIG
from strategies.shared.registry import method_names
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

# The graph-aware methods and the baseline, as far as they are registered.
E2E_METHODS = [m for m in ("fedavg", "flt", "sfl", "fedcg", "fedska") if m in method_names()]
BASE = {"dataset": "digits", "model": "mclr", "partition": "iid", "num-clients": 3,
        "num-rounds": 2, "eval-every": 2, "max-samples-per-client": 100, "lr": 0.1,
        "finetune-epochs": 0, "client-threads": 1, "round-timeout": 120.0}
METHOD_SETTINGS = {
    "flt": {"flt.latent-dim": 16, "flt.ae-epochs": 1},
    "fedcg": {"model": "cnn", "partition": "domains", "max-samples-per-client": 40,
              "batch-size": 10, "domain-test-clients": 0.34, "domain-unseen-rotations": "45",
              "fedcg.teacher-period": 2, "fedcg.adj-warmup": 1, "fedcg.bottleneck": 8,
              "fedcg.domain-stride": 2, "fedcg.sinkhorn-iters": 3},
    "fedska": {"partition": "shards"},
}
# Executors ask for work every 0.1 s instead of 1 s (a Flower setting; see benchmarks/studies/deploy_speed.py).
FAST = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}


def job(method: str, out: Path, **extra) -> dict:
    return {**BASE, **METHOD_SETTINGS.get(method, {}), "method": method,
            "output-dir": str(out), "run-name": method, **extra}


def numbers(tree, prefix="") -> dict[str, float]:
    """A nested dict of results flattened to {"a.b": number} for approximate comparison."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in numbers(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): float(tree)} if isinstance(tree, (int, float)) else {}


def rounds_of(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "rounds.jsonl").read_text().splitlines()]


def client_rows(directory: Path) -> dict[int, dict[str, str]]:
    with (directory / "clients.csv").open() as handle:
        return {int(row["client-id"]): row for row in csv.DictReader(handle)}


def completed(federation: LoopbackFederation, config: dict):
    outcome = federation.run(REPO, config)
    assert outcome.completed, f"{outcome.status}: {outcome.details}\n{outcome.log[-3000:]}"
    return outcome


def wait_for_log(path: Path, pattern: str, seen: int, timeout: float = 240) -> None:
    """Until `pattern` occurs more than `seen` times in the log at `path`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(re.findall(pattern, path.read_text(errors="replace"))) > seen:
            return
        time.sleep(0.2)
    raise AssertionError(f"no new {pattern!r} in {path} within {timeout} s")


def in_background(federation: LoopbackFederation, config: dict):
    result = {}
    thread = threading.Thread(target=lambda: result.update(outcome=federation.run(REPO, config)))
    thread.start()
    return thread, result


def endpoint(address: str) -> tuple[str, int]:
    """`ss` address → (host, port); IPv4-mapped IPv6 (`[::ffff:10.0.0.1]:9092`) as plain IPv4."""
    host, port = address.rsplit(":", 1)
    return host.strip("[]").removeprefix("::ffff:"), int(port)


def fleet_connections(port: int) -> dict[int, list[str]]:
    """PID -> peer addresses of established TCP connections to the Fleet port (from `ss -tnp`)."""
    table = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                           text=True).stdout
    found: dict[int, list[str]] = {}
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 5 and endpoint(fields[3])[1] == port:
            for pid in re.findall(r"pid=(\d+)", line):
                found.setdefault(int(pid), []).append(fields[3])
    return found


def running_federation(base: Path):
    """A started 3-SuperNode loopback federation (TLS, SuperNode auth) in `base`, for a module fixture to
    yield from; afterwards stopped, and every process it started has ended."""
    fed = LoopbackFederation(base, 3, env_extra=FAST)
    try:
        fed.start()
        yield fed
    finally:
        processes = [p.process for p in fed.procs.values()]
        fed.stop()
        assert all(p.poll() is not None for p in processes)  # everything we started has ended


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    yield from running_federation(tmp_path_factory.mktemp("deploy"))


# --- the deployment itself --------------------------------------------------------------------
def test_supernodes_are_registered_and_connect_over_grpc_to_the_fleet_port(federation):
    listing = json.loads(federation.flwr("supernode", "list", "bouquet", "--format", "json").stdout)
    online = {int(n["node-id"]) for n in listing["nodes"] if n["status"] == "online"}
    assert set(federation.node_ids.values()) <= online
    log = federation.home("superlink").joinpath("superlink.log").read_text()
    assert f"Starting Fleet API (gRPC-rere) on 127.0.0.1:{federation.fleet_port}" in log
    connections = fleet_connections(federation.fleet_port)
    for i in range(3):
        pid = federation.procs[f"supernode-{i}"].process.pid
        assert connections.get(pid), f"supernode-{i} (pid {pid}) has no connection to the Fleet API"
        assert not fleet_connections(federation.control_port).get(pid)  # the CLI API is not its


@pytest.mark.parametrize("method", E2E_METHODS)
def test_method_runs_deployed_exactly_as_in_process(federation, method, tmp_path):
    config = job(method, tmp_path)
    completed(federation, config)
    out = tmp_path / method
    summary = json.loads((out / "summary.json").read_text())
    rounds = rounds_of(out)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(r["failed-clients"] == [] for r in rounds[1:])
    assert (out / "clients.csv").read_text().count("\n") == 1 + 3  # header + every client
    reference = simulate({**config, "output-dir": str(tmp_path / "in-process")}, num_nodes=3)
    assert numbers(summary["final"]) == pytest.approx(numbers(reference["final"]), rel=1e-5,
                                                      abs=1e-6)


def test_an_unregistered_supernode_key_is_refused(federation, tmp_path):
    subprocess.run(["bash", str(REPO / "docker/scripts/gen_keys.sh"), str(tmp_path), "1"],
                   check=True, capture_output=True)
    command = deploy.supernode(deploy.Tls(str(federation.certs / "ca.crt")),
                               f"127.0.0.1:{federation.fleet_port}", str(tmp_path / "supernode-0"),
                               0, 3, port=deploy.CLIENTAPP_PORT + 7)
    stranger = federation.spawn("stranger", command, "stranger")
    try:
        code = stranger.process.wait(timeout=90)
    finally:
        federation.terminate("stranger")
    assert code != 0
    assert "2004" in stranger.tail() or "not registered" in stranger.tail().lower(), stranger.tail()


def test_a_restarted_supernode_is_the_same_client_and_its_state_continues(federation, tmp_path):
    """Client 1's SuperNode is stopped after its round-1 update and comes back under a new key
    (a re-provisioned machine: new Flower node id). The per-client models the server keeps must
    follow the client id: the run equals an in-process run where client 1 misses exactly the rounds
    it missed here."""
    subprocess.run(["bash", str(REPO / "docker/scripts/gen_keys.sh"), str(tmp_path / "new"), "2"],
                   check=True, capture_output=True)
    new_key = tmp_path / "new" / "supernode-1"
    new_id = federation.register(new_key.with_suffix(".pub"), "site-1-replacement")
    assert new_id != federation.node_ids[1]
    config = job("local", tmp_path, **{"num-rounds": 4, "eval-every": 4})
    log = federation.procs["supernode-1"].log
    sent = r"Sending: train\S* message[^\n]*\n[^\n]*Sent successfully"
    seen = len(re.findall(sent, log.read_text()))
    thread, result = in_background(federation, config)
    try:
        wait_for_log(log, sent, seen)
        federation.stop_supernode(1)  # SIGTERM: the node signs off
        before_restart = len(re.findall(sent, log.read_text()))
        federation.start_supernode(1, key=new_key)  # appends to the same log
    finally:
        thread.join(timeout=600)
    outcome = result["outcome"]
    assert outcome.completed, f"{outcome.status}: {outcome.details}\n{outcome.log[-3000:]}"
    rounds = rounds_of(tmp_path / "local")
    missed = {r["round"]: r["failed-clients"] + r["unreachable-clients"] for r in rounds[1:]}
    assert set(sum(missed.values(), [])) <= {1}
    # The replacement node answered train messages as client 1. Whether the restart also cost
    # client 1 a round depends on when the SuperLink saw the old node leave and the new one join;
    # if it did, client 1 trained again afterwards.
    assert len(re.findall(sent, log.read_text())) > before_restart, \
        "the replacement SuperNode never answered a train message: the restart was not exercised"
    absent = [r for r, clients in missed.items() if 1 in clients]
    assert not absent or any(1 not in missed[r] for r in missed if r > max(absent)), \
        f"client 1 did not train again after its restart (missed rounds {absent})"
    assert rounds[-1]["evaluated-clients"] == 3

    def drop_missed_rounds(message, context):
        if message.metadata.message_type.startswith("train") and \
                message.content[CLIENT]["client-id"] in missed[message.content[CONFIG]["server-round"]]:
            raise RuntimeError("node restarting")
        return client_app(message, context)

    run_config = {**default_run_config(), **config, "output-dir": str(tmp_path / "in-process")}
    reference = run(LocalGrid(drop_missed_rounds, 3, run_config), RunConfig.from_flower(run_config))
    summary = json.loads((tmp_path / "local" / "summary.json").read_text())
    assert numbers(summary["final"]) == pytest.approx(numbers(reference["final"]), rel=1e-5, abs=1e-6)
    deployed, in_process = (client_rows(tmp_path / d / "local") for d in (".", "in-process"))
    for key in ("accuracy", "loss", "num-examples"):  # client 1's own results
        assert float(deployed[1][key]) == pytest.approx(float(in_process[1][key]), rel=1e-5)


def test_a_supernode_killed_mid_round_does_not_stop_the_run(federation, tmp_path):
    """SIGKILL client 2's SuperNode while it trains: round 1 closes at its timeout with the other
    two, round 2 skips it, the run completes and writes its results."""
    config = job("fedavg", tmp_path, **{"round-timeout": 45.0})
    log = federation.procs["supernode-2"].log
    seen = len(re.findall(r"Receiving: train", log.read_text()))
    thread, result = in_background(federation, config)
    try:
        wait_for_log(log, r"Receiving: train", seen)
        federation.stop_supernode(2, signal.SIGKILL)
    finally:
        thread.join(timeout=600)
    outcome = result["outcome"]
    assert outcome.completed, f"{outcome.status}: {outcome.details}\n{outcome.log[-3000:]}"
    rounds = rounds_of(tmp_path / "fedavg")
    assert rounds[1]["failed-clients"] == [2] and rounds[1]["clients-trained"] == 2
    # Round 2: no reply within the timeout, or already marked offline by the SuperLink.
    assert rounds[2]["failed-clients"] + rounds[2]["unreachable-clients"] == [2]
    assert rounds[2]["clients-trained"] == 2 and rounds[2]["evaluated-clients"] == 2
    assert json.loads((tmp_path / "fedavg" / "summary.json").read_text())["final"]["round"] == 2


# --- each SuperNode in its own network namespace -----------------------------------------------
def _netns_unavailable() -> str:
    if shutil.which("ip") is None:
        return "no `ip` command"
    probe = f"bqprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return ""


@pytest.fixture
def namespaces():
    """A bridge 10.213.0.1/24 on the host and one namespace per SuperNode on a veth link to it."""
    reason = _netns_unavailable()
    if reason:
        print(f"network-namespace variant skipped: {reason}")
        pytest.skip(reason)
    tag = str(os.getpid() % 10000)
    bridge, names = f"bqbr{tag}", [f"bq{tag}n{i}" for i in range(3)]

    def ip(*args):
        subprocess.run(["ip", *args], check=True, capture_output=True)

    try:
        ip("link", "add", bridge, "type", "bridge")
        ip("addr", "add", "10.213.0.1/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        for i, ns in enumerate(names):
            ip("netns", "add", ns)
            ip("link", "add", f"bq{tag}h{i}", "type", "veth", "peer", "name", f"bq{tag}v{i}")
            ip("link", "set", f"bq{tag}v{i}", "netns", ns)
            ip("link", "set", f"bq{tag}h{i}", "master", bridge)
            ip("link", "set", f"bq{tag}h{i}", "up")
            ip("-n", ns, "addr", "add", f"10.213.0.{10 + i}/24", "dev", f"bq{tag}v{i}")
            ip("-n", ns, "link", "set", f"bq{tag}v{i}", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield names
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)


def test_supernodes_in_their_own_network_namespaces(namespaces, tmp_path):
    fed = LoopbackFederation(tmp_path / "fed", 3, host="10.213.0.1", env_extra=FAST)
    try:
        fed.start(supernode_prefix={i: ["ip", "netns", "exec", ns] for i, ns in enumerate(namespaces)})
        completed(fed, job("fedavg", tmp_path / "out"))
        fleet = ("10.213.0.1", fed.fleet_port)
        table = subprocess.run(["ss", "-tnH", "state", "established"], capture_output=True,
                               text=True).stdout
        peers = {endpoint(line.split()[3])[0] for line in table.splitlines()
                 if endpoint(line.split()[2]) == fleet}
        assert peers == {"10.213.0.10", "10.213.0.11", "10.213.0.12"}, table  # one per namespace
        for i, ns in enumerate(namespaces):
            inside = subprocess.run(["ip", "netns", "exec", ns, "ss", "-tnpH", "state",
                                     "established"], capture_output=True, text=True).stdout
            pid = fed.procs[f"supernode-{i}"].process.pid
            assert any(endpoint(line.split()[3]) == fleet and f"pid={pid}," in line
                       for line in inside.splitlines()), inside
    finally:
        processes = [p.process for p in fed.procs.values()]
        fed.stop()
        assert all(p.poll() is not None for p in processes)
    summary = json.loads((tmp_path / "out" / "fedavg" / "summary.json").read_text())
    assert summary["num-clients"] == 3 and summary["final"]["round"] == 2
