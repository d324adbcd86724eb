"""Deployment kit without starting a federation: certificates, keys, the compose file against the
installed Flower's command lines, run-outcome parsing, node data roots and device metrics."""

import json
import re
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest
import torch
import yaml
from flwr.app import Context, MetricRecord, RecordDict

import flwr
from client_app.node import NodeConfigError, node_data_spec
from server_app.harness import deploy
from strategies.shared.run_config import RunConfig
from server_app.harness.outcome import RunFailedError, parse_run_id, run_config_arg
from server_app.runner import train_devices
from server_app.harness.simulate import simulate
from strategies.shared.run_config import default_run_config
from tests.conftest import REPO

SCRIPTS = REPO / "docker" / "scripts"
COMPOSE = REPO / "docker" / "compose.yml"
BIN = Path(sys.executable).parent


@cache
def accepted_options(program: str) -> dict[str, set[str] | None]:
    """Options of `<program> --help` of the installed Flower; choice lists where it prints them."""
    text = subprocess.run([str(BIN / program), "--help"], capture_output=True, text=True,
                          timeout=60).stdout
    options: dict[str, set[str] | None] = {}
    for match in re.finditer(r"(--[a-z][a-z0-9-]*)(?: \{([a-z0-9,-]+)\})?", text):
        name, choices = match.groups()
        if choices:
            options[name] = set(choices.split(","))
        else:
            options.setdefault(name, None)
    return options


def assert_accepted(command: list[str]) -> None:
    options = accepted_options(command[0])
    assert "--help" in options and len(options) > 5, f"could not read {command[0]} --help"
    for i, arg in enumerate(command[1:], start=1):
        if arg.startswith("--"):
            assert arg in options, f"{command[0]} does not accept {arg}"
            if options[arg]:
                assert command[i + 1] in options[arg], (arg, command[i + 1], options[arg])


def compose_file() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def command_of(service: dict) -> list[str]:
    return [*service["entrypoint"], *service["command"]]


def mounts(service: dict) -> dict[str, str]:
    """Container path -> host source of a service's volumes (`source:target[:mode]`)."""
    result = {}
    for volume in service["volumes"]:
        parts = volume.split(":")
        if parts[-1] in ("ro", "rw"):
            parts = parts[:-1]
        result[parts[-1]] = ":".join(parts[:-1])
    return result


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


# --- certificates and keys -------------------------------------------------------------------
def test_gen_certs_signs_a_server_certificate_for_every_name(tmp_path):
    subprocess.run(["bash", str(SCRIPTS / "gen_certs.sh"), str(tmp_path), "superlink", "10.1.2.3"],
                   check=True, capture_output=True)
    verify = subprocess.run(["openssl", "verify", "-CAfile", tmp_path / "ca.crt",
                             tmp_path / "server.pem"], capture_output=True, text=True)
    assert verify.stdout.strip().endswith(": OK"), verify.stderr
    text = subprocess.run(["openssl", "x509", "-in", tmp_path / "server.pem", "-noout", "-ext",
                           "subjectAltName,extendedKeyUsage"], capture_output=True, text=True).stdout
    for san in ("DNS:localhost", "IP Address:127.0.0.1", "DNS:superlink", "IP Address:10.1.2.3"):
        assert san in text
    assert "TLS Web Server Authentication" in text
    assert (tmp_path / "server.key").stat().st_mode & 0o077 == 0  # private keys not world-readable
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0
    ca = (tmp_path / "ca.crt").read_bytes()
    subprocess.run(["bash", str(SCRIPTS / "gen_certs.sh"), str(tmp_path), "other"], check=True,
                   capture_output=True)
    assert (tmp_path / "ca.crt").read_bytes() == ca  # a new server cert keeps the distributed CA


def test_gen_keys_makes_one_p384_key_pair_per_supernode(tmp_path):
    subprocess.run(["bash", str(SCRIPTS / "gen_keys.sh"), str(tmp_path), "3"], check=True,
                   capture_output=True)
    for i in range(3):
        public = (tmp_path / f"supernode-{i}.pub").read_text()
        assert public.startswith("ecdsa-sha2-nistp384 ")
        assert (tmp_path / f"supernode-{i}").stat().st_mode & 0o077 == 0
    first = (tmp_path / "supernode-0.pub").read_text()
    subprocess.run(["bash", str(SCRIPTS / "gen_keys.sh"), str(tmp_path), "4"], check=True,
                   capture_output=True)
    assert (tmp_path / "supernode-0.pub").read_text() == first  # identity follows the key: kept
    assert (tmp_path / "supernode-3.pub").exists()


def test_generated_secrets_are_ignored_by_git():
    for path in ("docker/certs/ca.key", "docker/certs/server.key", "docker/keys/supernode-0",
                 "certs/ca.key", "keys/supernode-1", "server.pem",
                 "docker/keys/supernode-0.pub", "docker/state/state.db"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO)
        assert ignored.returncode == 0, f"{path} is not ignored by .gitignore"


# --- the command lines -----------------------------------------------------------------------
@pytest.mark.parametrize("command", [
    deploy.superlink(deploy.Tls.in_dir("/c"), "/s/state.db"),
    deploy.serverapp_executor(deploy.Tls.in_dir("/c")),
    deploy.supernode(deploy.Tls("/c/ca.crt"), "link:9092", "/k/supernode-0", 0, 3, "/data"),
    deploy.clientapp_executor(),
], ids=["superlink", "serverapp-executor", "supernode", "clientapp-executor"])
def test_bare_metal_commands_use_flags_this_flower_accepts(command):
    assert_accepted(command)


def test_superlink_runs_tls_and_node_auth_and_supernodes_dial_the_fleet_port():
    link = deploy.superlink(deploy.Tls.in_dir("/c"), "/s/state.db")
    assert "--insecure" not in link and "--enable-supernode-auth" in link
    assert flag(link, "--ssl-certfile") == "/c/server.pem"
    assert flag(link, "--fleet-api-address").endswith(f":{deploy.FLEET_PORT}")
    assert flag(link, "--port") == str(deploy.CONTROL_PORT)
    node = deploy.supernode(deploy.Tls("/c/ca.crt"), "link:9092", "/k/sn", 1, 3)
    assert "--insecure" not in node
    assert flag(node, "--root-certificates") == "/c/ca.crt"
    assert flag(node, "--auth-supernode-private-key") == "/k/sn"
    assert flag(node, "--node-config") == "partition-id=1 num-partitions=3"
    with pytest.raises(ValueError, match="partition-id 3 must be in"):
        deploy.node_config(3, 3)


def test_committed_compose_file_is_the_rendered_one():
    assert COMPOSE.read_text() == deploy.compose_yaml(3), (
        "docker/compose.yml differs from server_app.harness.deploy: regenerate it with "
        "`python -m server_app.harness.deploy compose --supernodes 3 > docker/compose.yml`")


def test_compose_services_use_accepted_flags_and_the_pinned_images():
    services = compose_file()["services"]
    assert {"superlink", "superexec-serverapp", "cli"} <= set(services)
    pinned = flwr.__version__.rsplit(".", 1)[0]  # 1.39 (pyproject: flwr>=1.39,<1.40)
    assert deploy.FLOWER_VERSION.startswith(pinned + ".")
    flower = "${FLWR_IMAGES:-flwr}"  # Docker Hub's flwr/* unless FLWR_IMAGES names local bases
    for name, service in services.items():
        if name != "cli":
            assert_accepted(command_of(service))
        if "build" in service:
            role = "superlink" if name == "superlink" else "superexec"
            assert service["build"]["args"]["BASE"] == f"{flower}/{role}:{deploy.FLOWER_VERSION}"
        elif name.startswith("supernode-"):
            assert service["image"] == f"{flower}/supernode:{deploy.FLOWER_VERSION}"
    for dockerfile, base in (("superlink.Dockerfile", "flwr/superlink"),
                             ("superexec.Dockerfile", "flwr/superexec")):
        text = (REPO / "docker" / dockerfile).read_text()
        assert re.search(rf"^ARG BASE={base}:{re.escape(deploy.FLOWER_VERSION)}$", text, re.M), dockerfile
        assert re.search(r"^FROM \$\{BASE\}$", text, re.M), dockerfile
        for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):  # from the context
            for source in sources.split():
                assert (REPO / source).exists(), f"{dockerfile} copies missing {source}"
    local = (REPO / "docker" / "base.Dockerfile").read_text()  # the local stand-ins' entrypoints
    for role in ("superlink", "supernode", "superexec"):
        assert re.search(rf'^FROM base AS {role}\nENTRYPOINT \["flower-{role}"\]$', local, re.M)


def test_compose_file_is_valid_for_compose_v1_and_v2():
    spec = compose_file()
    assert "name" not in spec and "version" not in spec  # v1 rejects `name:`; `version:` is obsolete
    if shutil.which("docker-compose"):  # Compose v1 (Debian's docker-compose 1.29) validates it
        result = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr


def test_compose_publishes_only_the_fleet_port_and_keeps_the_control_api_on_loopback():
    services = compose_file()["services"]
    link = command_of(services["superlink"])
    assert flag(link, "--host") == "127.0.0.1"
    assert services["superlink"]["ports"] == [
        f"${{BOUQUET_FLEET_PUBLISH:-{deploy.FLEET_PORT}}}:{deploy.FLEET_PORT}"]
    assert flag(link, "--port") == str(deploy.CONTROL_PORT)
    assert not any("ports" in s for n, s in services.items() if n != "superlink")
    # Who reaches the control port shares the SuperLink's network namespace: its executor and the CLI.
    for name in ("superexec-serverapp", "cli"):
        assert services[name]["network_mode"] == "service:superlink"
    cli_config = (REPO / "docker" / "flwr-cli.toml").read_text()
    assert f'address = "127.0.0.1:{deploy.CONTROL_PORT}"' in cli_config
    assert f"[superlink.{deploy.COMPOSE_CONNECTION}]" in cli_config
    assert mounts(services["cli"])["/app/.flwr/config.toml"] == "./flwr-cli.toml"
    assert mounts(services["cli"])[deploy.CONTAINER_APP] == "${BOUQUET_APP:-..}"


def test_compose_wires_ports_sites_tls_and_data():
    spec = compose_file()
    services = spec["services"]
    link = command_of(services["superlink"])
    fleet = flag(link, "--fleet-api-address").rsplit(":", 1)[1]
    control = flag(link, "--port")
    assert services["superlink"]["ports"] == [f"${{BOUQUET_FLEET_PUBLISH:-{fleet}}}:{fleet}"]
    certs = {t for t, source in mounts(services["superlink"]).items() if source == "./certs"}
    for key in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"):
        assert any(flag(link, key).startswith(c) for c in certs), key
    executor = command_of(services["superexec-serverapp"])
    assert services["superexec-serverapp"]["network_mode"] == "service:superlink"
    assert flag(executor, "--runtime-api-address") == f"127.0.0.1:{control}"
    assert flag(executor, "--root-certificates").startswith(deploy.CONTAINER_CERTS)
    nodes = {n: s for n, s in services.items() if n.startswith("supernode-")}
    assert len(nodes) == 3
    sites = set()
    for name, service in nodes.items():
        command = command_of(service)
        assert flag(command, "--superlink") == f"superlink:{fleet}"
        config = {k: v.strip('"') for k, v in
                  (item.split("=") for item in flag(command, "--node-config").split())}
        # each node holds its own data: one folder, mounted for its executor only
        assert set(config) == {"data-dir", "client-name"}
        sites.add(config["client-name"])
        assert mounts(service)[flag(command, "--root-certificates")] == "./certs/ca.crt"
        key = flag(command, "--auth-supernode-private-key")
        assert mounts(service)[key] == f"./keys/{Path(key).name}"
        runner = services[f"superexec-clientapp-{name.split('-')[1]}"]
        assert runner["network_mode"] == f"service:{name}"
        assert flag(command_of(runner), "--runtime-api-address") == f"127.0.0.1:{flag(command, '--port')}"
        assert mounts(runner) == {config["data-dir"]: f"${{BOUQUET_DATA:-./data}}/{config['client-name']}"}
        assert runner["shm_size"]
    assert sites == {"client-000", "client-001", "client-002"}  # python -m client_app.export's names


def test_deploy_cli_prints_the_same_commands():
    out = subprocess.run([sys.executable, "-m", "server_app.harness.deploy", "commands", "--superlink-host",
                          "10.0.0.1", "--supernodes", "2", "--certs", "/c", "--keys", "/k"],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert "flower-supernode --root-certificates /c/ca.crt --superlink 10.0.0.1:9092" in out
    assert "'partition-id=1 num-partitions=2'" in out
    assert out.count("flower-superexec") == 3


# --- run outcome -----------------------------------------------------------------------------
def test_run_outcome_parsing():
    assert parse_run_id("... Successfully started run 1234567\n") == 1234567
    with pytest.raises(RunFailedError, match="did not start a run"):
        parse_run_id("Connection to the SuperLink is unavailable")
    assert run_config_arg({"method": "fedavg", "num-rounds": 2, "lr": 0.1, "power-law": False}) == (
        'method="fedavg" num-rounds=2 lr=0.1 power-law=false')


def test_outcome_cli_fails_loudly_without_a_superlink(tmp_path):
    (tmp_path / "config.toml").write_text(
        '[superlink]\ndefault = "nowhere"\n[superlink.nowhere]\naddress = "127.0.0.1:9"\n'
        'insecure = true\n')
    result = subprocess.run([sys.executable, "-m", "server_app.harness.outcome", str(REPO), "nowhere",
                             "--timeout", "60"], capture_output=True, text=True, cwd=REPO,
                            env={**__import__("os").environ, "FLWR_HOME": str(tmp_path)})
    assert result.returncode == 3  # outcome's "the SuperLink cannot be reached"
    assert "the SuperLink cannot be reached: `flwr run` did not start a run" in result.stderr


# --- node data root and devices --------------------------------------------------------------
def test_a_node_data_root_overrides_the_run_config_root():
    cfg = RunConfig.from_flower({**default_run_config(), "data-root": "/shared"})
    ctx = Context(run_id=1, node_id=1, node_config={"data-root": "/local/data"}, state=RecordDict(),
                  run_config={})
    assert node_data_spec(cfg, ctx).data_root == "/local/data"
    assert node_data_spec(cfg, ctx).partition == cfg.data_spec.partition
    ctx_plain = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    assert node_data_spec(cfg, ctx_plain) is cfg.data_spec
    ctx_bad = Context(run_id=1, node_id=1, node_config={"data-root": 3}, state=RecordDict(),
                      run_config={})
    with pytest.raises(NodeConfigError, match="data-root"):
        node_data_spec(cfg, ctx_bad)


class _Reply:
    def __init__(self, metrics):
        self.content = RecordDict({"metrics": MetricRecord(metrics)})


def test_train_devices_counts_the_cuda_metric():
    replies = [_Reply({"num-examples": 5, "cuda": 1}), _Reply({"num-examples": 5, "cuda": 0}),
               _Reply({"num-examples": 5, "cuda": 0})]
    assert train_devices(replies) == {"trained-on": {"cpu": 2, "cuda": 1}}
    assert train_devices([_Reply({"num-examples": 5})]) == {}


@pytest.mark.federation
def test_clients_report_the_device_they_trained_on(tiny_run):
    simulate({**tiny_run, "num-clients": 2, "num-rounds": 1, "device": "auto"})
    rounds = [json.loads(line) for line in (Path(tiny_run["output-dir"]) / "run" / "rounds.jsonl")
              .read_text().splitlines()]
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert rounds[1]["trained-on"] == {expected: 2}


@pytest.mark.federation
def test_a_round_with_no_reachable_client_is_skipped_not_awaited(tiny_run):
    """Every SuperNode gone after round 0: each round waits `round-timeout` for one to come back,
    then is recorded as skipped (Flower's sampler alone would wait forever)."""
    from client_app.app import app as client_app
    from server_app.app import run
    from server_app.harness.local_grid import LocalGrid

    # unfused: round 0's evaluation is a message of its own, after which the nodes leave
    run_config = {**default_run_config(), **tiny_run, "method": "fedavg", "round-timeout": 1.0,
                  "fuse-evaluate": False}

    def vanishing(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == "evaluate":
            grid.offline.add(context.node_id)  # the node leaves after answering round 0
        return reply

    grid = LocalGrid(vanishing, 2, run_config)
    started = time.monotonic()
    summary = run(grid, RunConfig.from_flower(run_config))
    assert time.monotonic() - started < 60
    rounds = [json.loads(line) for line in
              (Path(tiny_run["output-dir"]) / "run" / "rounds.jsonl").read_text().splitlines()]
    assert [(r["round"], r["clients-trained"]) for r in rounds[1:]] == [(1, 0), (2, 0)]
    assert rounds[1]["unreachable-clients"] == [0, 1, 2, 3]
    assert summary["final"]["round"] == 0
