"""The Docker Compose demo, run for real: docker/compose.yml with TLS and SuperNode authentication.

Builds the images (docker/scripts/build_images.sh, on local Flower bases unless the official flwr/*
images are present; the app image that BOUQUET_TORCH names, the CPU one by default, which
docker/scripts/check_cpu_image.py then checks inside), makes certificates and keys with docker/scripts/gen_certs.sh and gen_keys.sh,
brings up the SuperLink, 3 SuperNodes and their executors under Compose project `bouquet-e2e`,
registers the keys (docker/scripts/register_keys.sh from the `cli` service), runs a job with `flwr
run` and compares its numbers with the same job in this process, checks that the SuperLink's HTTP
API (Control + Runtime) cannot be reached from a SuperNode container nor through the SuperLink
container's address while the Fleet API can, restarts one SuperNode and checks it rejoins as the
same node and client, and tears everything down (no container, network or volume left).

Slow (minutes; first build longer): enabled by BOUQUET_COMPOSE_E2E=1, see docs/deploy-compose.md.
Uses the Docker daemon at DOCKER_HOST (or the default socket); without one it starts its own (as
root: `dockerd` with its own socket and data root under $BOUQUET_DOCKER_ROOT, default
~/.cache/bouquet/docker, kept so that base images and wheels are reused) and stops it by its PID.
Missing tools (docker.io, docker-compose, debootstrap) are installed with apt-get when run as root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server_app.harness import deploy
from server_app.harness.loopback import free_port
from server_app.harness.outcome import run_config_arg
from server_app.harness.simulate import simulate
from tests.conftest import REPO
from tests.test_deploy_e2e import numbers, rounds_of

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

ENABLED = os.environ.get("BOUQUET_COMPOSE_E2E") == "1"
PROJECT = "bouquet-e2e"
COMPOSE_FILE = REPO / "docker" / "compose.yml"
CACHE = Path(os.environ.get("BOUQUET_DOCKER_ROOT", Path.home() / ".cache" / "bouquet" / "docker"))
# the wheelhouse the page's steps fill (docker/scripts/fetch_wheels.sh's default), reused here
WHEELS = Path(os.environ.get("BOUQUET_WHEELS", REPO / "docker" / "wheels"))
PAGE = REPO / "docs" / "deploy-compose.md"
NODES = 3
# the app image the demo runs: docker/compose.yml's default, the CPU one, unless BOUQUET_TORCH=cuda
TORCH = os.environ.get("BOUQUET_TORCH") or "cpu"
APP_IMAGE = f"bouquet-superexec:{deploy.FLOWER_VERSION}-{TORCH}"
APT_PACKAGES = {"dockerd": "docker.io", "docker-compose": "docker-compose", "debootstrap": "debootstrap"}


def sh(*argv: str, env: dict | None = None, timeout: float = 600, check: bool = True,
       ) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def docker_env(host: str | None) -> dict[str, str]:
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    if host:
        env["DOCKER_HOST"] = host
    return env


def reachable(env: dict[str, str]) -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], env=env, capture_output=True, timeout=60).returncode == 0


def install_missing() -> str:
    """apt-get install what is missing; the reason it cannot be done ('' when all is there)."""
    missing = [pkg for tool, pkg in APT_PACKAGES.items() if shutil.which(tool) is None]
    if not missing:
        return ""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{', '.join(missing)} missing and not root with apt-get to install them"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return f"apt-get install {' '.join(missing)} failed: {done.stderr[-500:]}"
    return ""


@pytest.fixture(scope="module")
def docker():
    """The environment for docker/docker-compose: an existing daemon, or one started here."""
    if not ENABLED:
        pytest.skip("the Compose demo test takes minutes: BOUQUET_COMPOSE_E2E=1 enables it "
                    "(docs/deploy-compose.md)")
    env = docker_env(None)
    if reachable(env) and shutil.which("docker-compose") and shutil.which("debootstrap"):
        yield env
        return
    reason = install_missing()
    if reason:
        pytest.skip(f"Docker cannot be installed here: {reason}")
    env = docker_env(None)
    if reachable(env):
        yield env
        return
    if os.geteuid() != 0:
        pytest.skip("no Docker daemon reachable and not root to start one")
    CACHE.mkdir(parents=True, exist_ok=True)
    socket_path = CACHE / "docker.sock"
    env = docker_env(f"unix://{socket_path}")
    log = (CACHE / "dockerd.log").open("a")
    # No iptables/NAT/default bridge: Compose's own bridge network stays on this machine.
    daemon = subprocess.Popen(
        ["dockerd", "--iptables=false", "--ip-masq=false", "--bridge=none",
         "--host", f"unix://{socket_path}", "--data-root", str(CACHE / "data"),
         "--exec-root", str(CACHE / "exec"), "--pidfile", str(CACHE / "dockerd.pid")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not reachable(env):
            if daemon.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"dockerd did not start (exit {daemon.poll()}); see {CACHE}/dockerd.log")
            time.sleep(0.5)
        yield env
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=30)


class Demo:
    """docker-compose -p bouquet-e2e with its certificates, keys and data in `root`."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root = root
        self.env = {**env, "BOUQUET_APP": str(REPO), "BOUQUET_DATA": str(root / "data"),
                    "BOUQUET_FLEET_PUBLISH": f"127.0.0.1:{free_port()}"}  # not 9092: no clash
        if not all(sh("docker", "image", "inspect", f"flwr/{role}:{deploy.FLOWER_VERSION}",
                      env=env, check=False).returncode == 0
                   for role in ("superlink", "supernode", "superexec")):
            self.env["FLWR_IMAGES"] = "bouquet-base"  # local bases (build_images.sh --local-bases)

    def compose(self, *args: str, timeout: float = 600, check: bool = True):
        return sh("docker-compose", "-p", PROJECT, "--project-directory", str(self.root),
                  "-f", str(COMPOSE_FILE), *args, env=self.env, timeout=timeout, check=check)

    def cli(self, *argv: str, timeout: float = 600, check: bool = True):
        """A command in the `cli` service (the SuperLink's network namespace)."""
        return self.compose("run", "--rm", "-T", "cli", *argv, timeout=timeout, check=check)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def nodes(self) -> dict[int, str]:
        """node id -> status (`online`, `offline`, ...) as the SuperLink lists them."""
        listing = json.loads(self.cli("flwr", "supernode", "list", deploy.COMPOSE_CONNECTION,
                                      "--format", "json").stdout)
        return {int(n["node-id"]): n["status"] for n in listing["nodes"]}

    def wait_status(self, ids: set[int], status: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.nodes()
            if all(nodes.get(i) == status for i in ids):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not all of {sorted(ids)} {status}: {nodes}\n"
                                     f"{self.compose('logs', '--no-color', '--tail', '30').stdout[-4000:]}")
            time.sleep(3)


def connects(env: dict[str, str], container: str, host: str, port: int) -> bool:
    """Whether a TCP connection from inside `container` to host:port succeeds."""
    probe = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)"
             "\nexcept OSError as err:\n    print(err)\n    sys.exit(1)")
    return sh("docker", "exec", container, "python", "-c", probe, host, str(port), env=env,
              check=False).returncode == 0


def host_connects(address: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(5)
        return sock.connect_ex((address, port)) == 0


def project_leftovers(env: dict[str, str]) -> dict[str, str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return {kind: sh("docker", *command, "--filter", label, "-q", env=env).stdout.strip()
            for kind, command in (("containers", ("ps", "-a")), ("networks", ("network", "ls")),
                                  ("volumes", ("volume", "ls")))}


def run_and_fetch(demo: Demo, job: dict, run_name: str, into: Path) -> Path:
    """`flwr run` of `job` in the `cli` service until the run completed; its run folder copied to
    `into`."""
    job = {**job, "output-dir": deploy.CONTAINER_OUTPUTS, "run-name": run_name}
    result = demo.cli("python", "-m", "server_app.harness.outcome", deploy.CONTAINER_APP,
                      deploy.COMPOSE_CONNECTION, "--run-config", run_config_arg(job),
                      "--timeout", "600", check=False, timeout=700)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "finished:completed" in result.stdout
    server = demo.container("superexec-serverapp")
    into.mkdir(parents=True, exist_ok=True)  # `docker cp` then copies the folder into it
    sh("docker", "cp", f"{server}:{deploy.CONTAINER_OUTPUTS}/{run_name}", str(into), env=demo.env)
    return into / run_name


def page_commands(page: Path = PAGE) -> list[str]:
    """The shell commands of the page's "What a user types" block, in order: continuation lines
    joined, comments and blank lines dropped."""
    text = page.read_text()
    block = text.split("## What a user types", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        line = line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if not line and not current:
            continue
        current += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return [c for c in commands if c]


def test_the_page_block_parses_into_its_steps():
    """The steps the demo test runs from the page (no Docker needed)."""
    compose = demo_commands()
    verbs = [c.split("compose.yml ", 1)[1].split()[0] for c in compose]
    assert verbs == ["up", "run", "up", "run", "run", "ps", "restart", "restart", "down"], verbs
    restarts = [c.split()[-1] for c in compose if " restart " in c]
    assert restarts == ["supernode-1", "superexec-clientapp-1"]  # the SuperNode before its executor
    assert any("server_app.harness.outcome" in c and "--run-config" in c for c in compose)
    # each site's own data, exported with the keys of the page's run
    export = [c for c in page_commands() if c.startswith("python -m client_app.export")]
    assert len(export) == 1 and "--out docker/data" in export[0]
    run = run_config_of(next(c for c in compose if "--run-config" in c))
    assert f"--dataset {run['dataset']}" in export[0] and f"--num-clients {run['num-clients']}" in export[0]


@pytest.mark.parametrize("overrides, needs", [
    ({"model": "mobilenet-v2", "dataset": "cifar10"}, "model 'mobilenet-v2'"),
    ({"partition": "domains", "domain-rotations": "0,45"}, "rotations that are not multiples of 90"),
    ({"partition": "domains", "domain-rotations": "0,90", "domain-unseen-rotations": "30",
      "domain-test-clients": 0.25}, "rotations that are not multiples of 90"),
])
def test_what_needs_torchvision_is_refused_without_it_naming_the_cuda_image(monkeypatch, overrides,
                                                                           needs):
    """The CPU app image has no torchvision: a run config that needs it is one line naming the CUDA
    image (no Docker needed; the image itself is checked by docker/scripts/check_cpu_image.py)."""
    import importlib.util

    from strategies.shared.run_config import RunConfig, default_run_config
    from strategies.shared.settings import ConfigError

    config = {**default_run_config(), **overrides}
    RunConfig.from_flower(config)  # valid where torchvision is installed
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torchvision" else find_spec(name, *a))
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_flower(config)
    message = str(refused.value)
    assert needs in message and "\n" not in message
    assert f"bouquet-superexec:{deploy.FLOWER_VERSION}-cuda" in message
    RunConfig.from_flower(default_run_config())  # the rest runs without it


def demo_commands() -> list[str]:
    """The page's commands that drive the demo (steps 3-6): its docker-compose and docker cp lines."""
    return [c for c in page_commands()
            if c.startswith("docker-compose -p bouquet -f compose.yml") or c.startswith("docker cp ")]


def run_config_of(command: str) -> dict:
    """The run config of a page command's `--run-config '...'` as a dict (TOML values)."""
    import shlex
    import tomllib
    words = shlex.split(command)
    pairs = shlex.split(words[words.index("--run-config") + 1], posix=False)  # keeps "quotes"
    return tomllib.loads("\n".join(pairs))


class PageSteps:
    """Runs the page's commands as a user types them, in a shell, under this test's Compose project
    (`-p bouquet-e2e`, its own project directory with certificates and keys)."""

    def __init__(self, demo: Demo, into: Path):
        self.demo, self.into = demo, into
        into.parent.mkdir(parents=True, exist_ok=True)  # `docker cp` makes `into` itself

    def shell(self, command: str, timeout: float = 900) -> subprocess.CompletedProcess:
        command = command.replace(
            "docker-compose -p bouquet -f compose.yml",
            f"docker-compose -p {PROJECT} --project-directory {self.demo.root} -f {COMPOSE_FILE}")
        command = command.replace(" ./demo", f" {self.into}")
        command = command.replace(" run --rm cli ", " run --rm -T cli ")  # the test has no TTY
        return sh("bash", "-c", command, env=self.demo.env, timeout=timeout)


def test_compose_demo_end_to_end(docker, tmp_path):
    started = time.monotonic()
    timings: dict[str, float] = {}
    env = {**docker, "BOUQUET_WHEELS": str(WHEELS)}
    # Steps 1-2 of the page: the wheelhouse (kept in docker/wheels/ between runs: the builds need no
    # index, and a second fetch with the same constraints resolves nothing), the images (reused when
    # present) and the certificates and keys (in this test's own project directory).
    sh("bash", str(REPO / "docker/scripts/fetch_wheels.sh"), env={**env, "PYTHON": sys.executable},
       timeout=1800)
    timings["wheels"] = time.monotonic() - started
    root = tmp_path / "demo"
    (root / "data").mkdir(parents=True)
    # the page's data step: each site's folder, exported with the run's keys
    export = next(c for c in page_commands() if c.startswith("python -m client_app.export"))
    sh("bash", "-c", export.replace("python ", f"{sys.executable} ", 1).replace(
        "--out docker/data", f"--out {root / 'data'}"))
    assert sorted(p.name for p in (root / "data").iterdir() if p.is_dir()) == [
        "client-000", "client-001", "client-002"]
    demo = Demo(root, env)
    local_bases = ["--local-bases"] if "FLWR_IMAGES" in demo.env else []
    sh("bash", str(REPO / "docker/scripts/build_images.sh"), *local_bases, env=env, timeout=1800)
    timings["build"] = time.monotonic() - started - timings["wheels"]
    assert sh("docker", "image", "inspect", APP_IMAGE, env=env, check=False).returncode == 0, (
        f"build_images.sh did not make {APP_IMAGE}")
    print(sh("docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}} {{.Size}}",
             env=env).stdout)
    print(sh("docker", "version", "--format", "Docker {{.Server.Version}}", env=env).stdout.strip()
          + ", docker-compose " + sh("docker-compose", "version", "--short", env=env).stdout)
    if TORCH == "cpu":
        # the CPU image: no CUDA package nor torchvision; MNIST, npz and ImageFolder clients train;
        # what needs torchvision is refused with one line naming the CUDA image
        checked = time.monotonic()
        print(sh("docker", "run", "--rm", "-v", f"{REPO / 'docker' / 'scripts'}:/checks:ro",
                 "-e", "PYTHONPATH=/app", "--entrypoint", "python", APP_IMAGE, "/checks/check_cpu_image.py", env=env,
                 timeout=900).stdout)
        timings["cpu-image-check"] = time.monotonic() - checked

    sh("bash", str(REPO / "docker/scripts/gen_certs.sh"), str(root / "certs"), "superlink")
    sh("bash", str(REPO / "docker/scripts/gen_keys.sh"), str(root / "keys"), str(NODES))
    shutil.copy(REPO / "docker" / "flwr-cli.toml", root / "flwr-cli.toml")
    # The images run as Flower's `app` user (uid 49999): it must read the private keys.
    for key in [root / "certs" / "server.key", *(root / "keys").glob("supernode-?")]:
        os.chown(key, 49999, 49999)

    # Steps 3-6: the page's own docker-compose commands, in the page's order, each followed by
    # what it should have done.
    steps = PageSteps(demo, tmp_path / "runs" / "page-run")
    commands = demo_commands()
    node_ids: list[int] = []
    try:
        up = time.monotonic()
        for command in commands:
            verb = command.split("compose.yml ", 1)[1].split()[0]
            if verb == "down":
                break  # below, with --volumes, after the logs are kept
            if verb == "up" and "superlink superexec-serverapp" in command:
                steps.shell(command)
                deadline = time.monotonic() + 120  # the Control API answers once the SuperLink is up
                while (listed := demo.cli("flwr", "supernode", "list", deploy.COMPOSE_CONNECTION,
                                          check=False)).returncode != 0:
                    assert time.monotonic() < deadline, listed.stdout + listed.stderr
                    time.sleep(3)
            elif "register_keys.sh" in command:
                registered = steps.shell(command).stdout
                node_ids = [int(n) for n in re.findall(r"SuperNode (\d+) registered", registered)]
                assert len(set(node_ids)) == NODES, registered  # site-0, site-1, site-2 in order
            elif verb == "up":
                steps.shell(command)
                demo.wait_status(set(node_ids), "online")
                timings["up"] = time.monotonic() - up
                check_closed_control_port(demo, env)
            elif "supernode list" in command:
                listing = steps.shell(command).stdout
                assert all(str(n) in listing for n in node_ids), listing
            elif "server_app.harness.outcome" in command:
                ran = time.monotonic()
                result = steps.shell(command)
                assert "finished:completed" in result.stdout, result.stdout[-3000:]
                timings["run"] = time.monotonic() - ran
                page_job = run_config_of(command)
            elif verb == "ps":  # step 5: docker cp of the run folder
                steps.shell(command)
                out = steps.into
                assert_page_run_equals_in_process(out, page_job, tmp_path / "page-in-process")
                listing = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
                print(f"run folder {out.name}/: {listing}")
                assert {"summary.json", "rounds.jsonl", "clients.csv"} <= set(listing)
            elif verb == "restart":
                steps.shell(command)
                if command.endswith("superexec-clientapp-1"):
                    # the page's restart: SuperNode 1, then its executor. The same key, so the same
                    # node id; the next run trains all 3 clients and again equals the in-process run.
                    demo.wait_status(set(node_ids), "online")
                    out = run_and_fetch(demo, page_job, "after-restart", tmp_path / "runs")
                    assert_page_run_equals_in_process(out, page_job, tmp_path / "again")
            else:
                raise AssertionError(f"the page has a step this test does not know: {command}")
        assert node_ids and "run" in timings, "the page's steps did not bring up and run the demo"
    finally:
        logs = demo.compose("logs", "--no-color", "--tail", "40", check=False).stdout
        demo.compose("down", "--volumes", "--remove-orphans", timeout=300, check=False)
        print(logs[-6000:])
    assert project_leftovers(env) == {"containers": "", "networks": "", "volumes": ""}
    timings["total"] = time.monotonic() - started
    print("timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))


def check_closed_control_port(demo: Demo, env: dict[str, str]) -> None:
    """Only the Fleet API is published, and neither a SuperNode container nor anyone dialling the
    SuperLink container's address reaches the HTTP API."""
    link = demo.container("superlink")
    published = sh("docker", "port", link, env=env).stdout.split()
    host_port = demo.env["BOUQUET_FLEET_PUBLISH"]  # 127.0.0.1:<free port>
    assert published == [f"{deploy.FLEET_PORT}/tcp", "->", host_port]
    assert host_connects("127.0.0.1", int(host_port.rsplit(":", 1)[1]))
    node0 = demo.container("supernode-0")
    assert connects(env, node0, "superlink", deploy.FLEET_PORT)
    assert not connects(env, node0, "superlink", deploy.CONTROL_PORT)
    address = sh("docker", "inspect", "-f",
                 "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", link,
                 env=env).stdout.strip()
    assert host_connects(address, deploy.FLEET_PORT)
    assert not host_connects(address, deploy.CONTROL_PORT)


def assert_page_run_equals_in_process(out: Path, page_job: dict, tmp_path: Path) -> None:
    """The page's run (its own run config, on each site's own folder: the split the page exported)
    trained every client every round and gives the numbers of the same job partitioned in this
    process."""
    rounds = rounds_of(out)
    assert all(r["failed-clients"] == [] and r["clients-trained"] == NODES for r in rounds[1:])
    summary = json.loads((out / "summary.json").read_text())
    reference = simulate({**page_job, "output-dir": str(tmp_path)}, num_nodes=NODES)
    assert numbers(summary["final"]) == pytest.approx(numbers(reference["final"]), rel=1e-5,
                                                      abs=1e-6)
