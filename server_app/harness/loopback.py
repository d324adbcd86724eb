"""A whole deployment on one machine: SuperLink + N authenticated SuperNodes over TLS on loopback.

Exactly the command lines of `server_app.harness.deploy` (those of the README and docker/compose.yml), each
process with its own FLWR_HOME as if on its own machine, on free ports. Every process is started in
its own session and stopped by the PID it was started with (its executor's app processes follow).
Used by the deployment tests and benchmarks/studies/deploy_speed.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from server_app.harness import deploy
from server_app.harness.outcome import RunOutcome, run_job

SCRIPTS = Path(__file__).resolve().parents[2] / "docker" / "scripts"
BIN = Path(sys.executable).parent
CONNECTION = "bouquet"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tool(argv: list[str]) -> list[str]:
    """A Flower entry point from this Python environment (not whatever is first on PATH)."""
    local = BIN / argv[0]
    return [str(local) if local.exists() else argv[0], *argv[1:]]


@dataclass
class Proc:
    name: str
    process: subprocess.Popen
    log: Path

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class LoopbackFederation:
    """Start with `start()`, run jobs with `run()`, always `stop()` (or use as a context manager)."""

    root: Path
    num_supernodes: int = 3
    host: str = "127.0.0.1"  # the address SuperNodes dial (a veth address in a namespace variant)
    env_extra: dict[str, str] = field(default_factory=dict)
    fleet_port: int = field(default_factory=free_port)
    control_port: int = field(default_factory=free_port)
    procs: dict[str, Proc] = field(default_factory=dict)
    node_ids: dict[int, int] = field(default_factory=dict)  # partition -> node id at registration

    # --- layout -------------------------------------------------------------------------------
    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def tls(self) -> deploy.Tls:
        return deploy.Tls.in_dir(str(self.certs))

    def home(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def secret(self, home: str) -> str:
        """The SuperExec shared secret of one machine (its FLWR_HOME), made on first use."""
        path = self.home(home) / deploy.SECRET_FILE
        if not path.exists():
            path.write_bytes(os.urandom(32))
            path.chmod(0o600)
        return str(path)

    def env(self, home: str = "cli") -> dict[str, str]:
        return {**os.environ, "FLWR_HOME": str(self.home(home)), "FLWR_TELEMETRY_ENABLED": "0",
                "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1", **self.env_extra}

    # --- processes ------------------------------------------------------------------------------
    def spawn(self, name: str, argv: list[str], home: str, prefix: list[str] | None = None) -> Proc:
        """Start `argv` in its own session; executors get `deploy.EXECUTOR_ENV` (below
        `env_extra`, which a benchmark uses to compare settings)."""
        log = self.home(home) / f"{name}.log"
        env = self.env(home)
        if argv[0] == "flower-superexec":
            env = {**env, **deploy.EXECUTOR_ENV, **self.env_extra}
        process = subprocess.Popen(
            [*(prefix or []), *_tool(argv)], env=env, cwd=self.home(home),
            stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.procs[name] = proc = Proc(name, process, log)
        return proc

    def terminate(self, name: str, sig: int = signal.SIGTERM, wait: float = 20) -> int | None:
        """Signal the process group we started under `name`; returns its exit code."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        try:
            os.killpg(proc.process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.process.pid, signal.SIGKILL)
            return proc.process.wait(timeout=10)

    def _wait_port(self, port: int, proc: Proc, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.process.poll() is not None:
                raise RuntimeError(f"{proc.name} exited {proc.process.returncode}: {proc.tail()}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"{proc.name} did not open port {port}: {proc.tail()}")

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self, supernode_prefix: dict[int, list[str]] | None = None) -> LoopbackFederation:
        """Certificates, keys, SuperLink + its executor, key registration, SuperNodes + executors.
        `supernode_prefix[i]` wraps SuperNode i's commands (e.g. `ip netns exec ns-i`). If a step
        fails, the processes already started are stopped before the error propagates."""
        try:
            return self._start(supernode_prefix)
        except BaseException:
            self.stop()
            raise

    def _start(self, supernode_prefix: dict[int, list[str]] | None) -> LoopbackFederation:
        self.root.mkdir(parents=True, exist_ok=True)
        names = [self.host] if self.host not in ("127.0.0.1", "localhost") else []
        subprocess.run(["bash", str(SCRIPTS / "gen_certs.sh"), str(self.certs), *names],
                       check=True, capture_output=True)
        subprocess.run(["bash", str(SCRIPTS / "gen_keys.sh"), str(self.keys),
                        str(self.num_supernodes)], check=True, capture_output=True)
        (self.home("cli") / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.control_port}"\n'
            f'root-certificates = "{self.certs / "ca.crt"}"\n'
        )
        self.start_superlink()
        for i in range(self.num_supernodes):
            self.node_ids[i] = self.register(self.keys / f"supernode-{i}.pub", f"site-{i}")
        for i in range(self.num_supernodes):
            self.start_supernode(i, prefix=(supernode_prefix or {}).get(i))
        return self

    def start_superlink(self) -> Proc:
        """The SuperLink (Control API on 127.0.0.1, its database under `superlink/`) and its
        ServerApp executor; also how a test restarts them with the same flags and database."""
        link = self.spawn("superlink", deploy.superlink(
            self.tls, str(self.home("superlink") / "state.db"),
            fleet_address=f"{'127.0.0.1' if self.host in ('127.0.0.1', 'localhost') else '0.0.0.0'}"
                          f":{self.fleet_port}",
            port=self.control_port, secret_file=self.secret("superlink")), "superlink")
        self._wait_port(self.control_port, link)
        self._wait_port(self.fleet_port, link)
        if "superexec-serverapp" not in self.procs:
            self.spawn("superexec-serverapp", deploy.serverapp_executor(
                self.tls, f"127.0.0.1:{self.control_port}", self.secret("superlink")), "superlink")
        return link

    def register(self, public_key: Path, name: str) -> int:
        """`flwr supernode register`: the node id the SuperLink assigned to this key."""
        result = subprocess.run(
            _tool(["flwr", "supernode", "register", str(public_key), CONNECTION, "--name", name,
                   "--format", "json"]),
            env=self.env(), capture_output=True, text=True, timeout=60,
        )
        if result.returncode != 0:
            raise RuntimeError(f"registering {public_key} failed: {result.stdout}{result.stderr}")
        return int(json.loads(result.stdout)["node-id"])

    def start_supernode(self, i: int, key: Path | None = None, prefix: list[str] | None = None,
                        ) -> Proc:
        """SuperNode i (its own FLWR_HOME) + its ClientApp executor on a fresh runtime port."""
        port = free_port()
        home = f"supernode-{i}"
        node = self.spawn(home, deploy.supernode(
            deploy.Tls(str(self.certs / "ca.crt")), f"{self.host}:{self.fleet_port}",
            str(key or self.keys / f"supernode-{i}"), i, self.num_supernodes, port=port,
            secret_file=self.secret(home)), home, prefix)
        if not prefix:  # inside a network namespace the port is not visible from here; the
            self._wait_port(port, node)  # executor retries its connection until it is up
        self.spawn(f"superexec-clientapp-{i}", deploy.clientapp_executor(port, self.secret(home)),
                   home, prefix)
        return node

    def stop_supernode(self, i: int, sig: int = signal.SIGTERM) -> None:
        self.terminate(f"superexec-clientapp-{i}", sig)
        self.terminate(f"supernode-{i}", sig)

    def stop(self) -> None:
        """SuperNodes and their executors first, then the SuperLink side, each by its PID."""
        for name in sorted(self.procs, key=lambda n: n.startswith(("superlink", "superexec-serverapp"))):
            self.terminate(name)

    def __enter__(self) -> LoopbackFederation:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- jobs -----------------------------------------------------------------------------------
    def run(self, app: str | Path, run_config: dict, timeout: float = 600) -> RunOutcome:
        return run_job(app, CONNECTION, run_config, env=self.env(), cwd=self.root, timeout=timeout)

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(_tool(["flwr", *args]), env=self.env(), capture_output=True,
                              text=True, timeout=timeout)
