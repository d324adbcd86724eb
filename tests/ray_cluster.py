"""A Ray cluster of several nodes on this machine's loopback, for tests: `LoopbackRayCluster`.

Every node is a `ray start --block` process in its own session with a private temp dir and free ports,
and it is stopped by the PIDs it started (the `ray start` processes and everything below them), never by
`ray stop`, which would stop every Ray instance of this user on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.simulation_superlink import BIN, free_port

# Ray replaces a node address of 127.0.0.1 (and localhost) by the machine's routable address, and
# refuses several nodes when told not to; any other loopback address is kept as given.
NODE_IP = "127.0.0.2"
QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process from /proc, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[19]
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every live process below `pid` (read from /proc)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


class LoopbackRayCluster:
    """`nodes` Ray nodes with `cpus_per_node` CPUs each, all on loopback (`NODE_IP`); `.address`
    to join it."""

    def __init__(self, nodes: int = 2, cpus_per_node: int = 1, startup_timeout: float = 90.0) -> None:
        self.nodes, self.cpus, self.timeout = nodes, cpus_per_node, startup_timeout
        self.root = Path(tempfile.mkdtemp(prefix="bq-ray-", dir="/tmp"))  # short: socket paths
        self.port = free_port()
        self.address = f"{NODE_IP}:{self.port}"
        self.env = {**os.environ, **QUIET_ENV}
        self.env.pop("RAY_ADDRESS", None)
        self.processes: list[subprocess.Popen] = []

    def _start_node(self, index: int) -> None:
        head = index == 0
        args = [str(BIN / "ray"), "start", "--block", f"--node-ip-address={NODE_IP}",
                f"--num-cpus={self.cpus}", "--num-gpus=0", f"--temp-dir={self.root / f'node{index}'}",
                "--disable-usage-stats", "--object-store-memory=100000000",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--dashboard-agent-grpc-port={free_port()}", f"--metrics-export-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}"]
        args += ([ "--head", f"--port={self.port}", "--include-dashboard=false",
                  f"--ray-client-server-port={free_port()}"] if head else [f"--address={self.address}"])
        log = (self.root / f"node{index}.log").open("w")
        self.processes.append(subprocess.Popen(args, env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def alive_nodes(self) -> list[dict]:
        """The cluster's alive nodes as Ray's GCS lists them (queried from a separate driver)."""
        script = ("import json, ray; ray.init(logging_level='ERROR'); "
                  "print(json.dumps([n for n in ray.nodes() if n['Alive']], default=str))")
        out = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True,
                             text=True, timeout=60, env={**self.env, "RAY_ADDRESS": self.address})
        if out.returncode != 0:
            return []
        return json.loads(out.stdout.strip().splitlines()[-1])

    def __enter__(self) -> LoopbackRayCluster:
        try:
            self._start_node(0)
            self._wait(1)
            for index in range(1, self.nodes):
                self._start_node(index)
            self._wait(self.nodes)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, count: int) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if len(self.alive_nodes()) >= count:
                return
            time.sleep(1.0)
        logs = "\n".join(p.read_text()[-1500:] for p in sorted(self.root.glob("node*.log")))
        raise RuntimeError(f"the loopback Ray cluster did not reach {count} nodes:\n{logs}")

    def stop(self) -> None:
        """SIGTERM every `ray start` we started (it stops its daemons), then SIGKILL what is left of
        the processes below them."""
        tree = [d for p in self.processes for d in descendants(p.pid)]
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for pid, started in tree:  # the same process (start time), not a reused pid
            stat = _stat(pid)
            if stat is not None and stat[1] == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.root, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.stop()
