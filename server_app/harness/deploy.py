"""Deployment command lines: one SuperLink, N SuperNodes and their executors, TLS and SuperNode auth.

The single source of every deployment flag: the bare-metal commands (`python -m server_app.harness.deploy
commands`), the end-to-end tests (tests/test_deploy_e2e.py) and docker/compose.yml (`python -m
server_app.harness.deploy compose`, checked against the committed file by tests/test_deploy.py) are all built
from these functions, so the Docker demo runs exactly the flags the loopback tests exercise.

Layout (Flower 1.39): SuperNodes dial the SuperLink's Fleet API (gRPC, `FLEET_PORT`) with TLS and an
ECDSA key registered with `flwr supernode register`; `flwr` (CLI) and the ServerApp executor use the
SuperLink's HTTPS API (`CONTROL_PORT`). Apps run in `--isolation process`: one `flower-superexec` beside
the SuperLink (ServerApp) and one beside each SuperNode (ClientApp), each talking to its neighbour's
runtime API on loopback.

Only the Fleet port is exposed. The HTTPS API serves both the Control API (`flwr run`: whoever reaches
it runs code on every SuperNode; the open-source SuperLink checks no client certificate and has no
accounts) and the Runtime API, so it listens on 127.0.0.1 (`CONTROL_HOST`): runs are submitted on the
SuperLink machine or through an SSH tunnel (docs/runbook.md). With a SuperExec secret file
(`--superexec-auth-secret-file`, the same bytes on both sides) an executor's requests to a runtime API
are signed, so another local process cannot take a run's tasks.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

from datasets.export import client_folder_name

FLEET_PORT = 9092  # SuperLink Fleet API (gRPC-rere): SuperNodes connect here
CONTROL_PORT = 8000  # SuperLink Control + Runtime API (HTTPS): `flwr` CLI and the ServerApp executor
CONTROL_HOST = "127.0.0.1"  # where that API listens: the SuperLink machine only (SSH tunnel to submit)
CLIENTAPP_PORT = 9094  # a SuperNode's runtime API for its ClientApp executor (loopback only)
FLOWER_VERSION = "1.39.0"  # tag of the official flwr/* images (pyproject pins flwr>=1.39,<1.40)

# Environment of every `flower-superexec` (ServerApp and ClientApp executors). A Flower 1.39 setting:
# how often an executor asks its runtime API for a new task (default 1.0 s, allowed 0.01-60). Every
# message waits for that poll before its ClientApp process starts; benchmarks/studies/deploy_speed.py measures
# the default against this value (docs/deploy.md, "Deployment speed").
EXECUTOR_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}


@dataclass(frozen=True)
class Tls:
    """Where the TLS material lives on a host (docker/scripts/gen_certs.sh writes these files)."""

    ca_cert: str
    server_cert: str = ""  # SuperLink only
    server_key: str = ""  # SuperLink only

    @classmethod
    def in_dir(cls, directory: str) -> Tls:
        return cls(f"{directory}/ca.crt", f"{directory}/server.pem", f"{directory}/server.key")


def _secret(secret_file: str) -> list[str]:
    """Flower's SuperExec shared secret (a file of random bytes), when one is given."""
    return ["--superexec-auth-secret-file", secret_file] if secret_file else []


def superlink(tls: Tls, database: str, fleet_address: str = f"0.0.0.0:{FLEET_PORT}",
              host: str = CONTROL_HOST, port: int = CONTROL_PORT, secret_file: str = "",
              ) -> list[str]:
    """`flower-superlink` with TLS on every API, SuperNode authentication, registrations kept in
    `database`, apps run by a separate executor (`serverapp_executor`), and its Control + Runtime
    API on `host` (loopback unless a caller opens it)."""
    return [
        "flower-superlink",
        "--ssl-ca-certfile", tls.ca_cert,
        "--ssl-certfile", tls.server_cert,
        "--ssl-keyfile", tls.server_key,
        "--enable-supernode-auth",
        "--database", database,
        "--isolation", "process",
        "--fleet-api-address", fleet_address,
        "--host", host,
        "--port", str(port),
        *_secret(secret_file),
    ]


def serverapp_executor(tls: Tls, superlink_runtime: str = f"127.0.0.1:{CONTROL_PORT}",
                       secret_file: str = "") -> list[str]:
    """`flower-superexec` that starts the ServerApp of each run; it reaches the SuperLink's runtime
    API over TLS (the certificate's SANs include 127.0.0.1)."""
    return [
        "flower-superexec",
        "--root-certificates", tls.ca_cert,
        "--runtime-api-address", superlink_runtime,
        *_secret(secret_file),
    ]


def node_config(partition_id: int, num_partitions: int, data_root: str = "",
                data_dir: str = "", client_name: str = "") -> str:
    """The `--node-config` of a SuperNode: which clients it hosts. With `data_dir`, the node's own
    data (`datasets.local`): the clients found in that folder on its machine (`client_name`: the
    name of the one client the folder is, where the folder's own name would not do). Else a
    partition slot (c ≡ partition-id mod num-partitions, see server_app/clients.py) of the run's data
    set and, optionally, where that data set lives (`data_root`)."""
    if data_dir:
        return f'data-dir="{data_dir}"' + (f' client-name="{client_name}"' if client_name else "")
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} must be in [0, num-partitions={num_partitions})")
    config = f"partition-id={partition_id} num-partitions={num_partitions}"
    return config + (f' data-root="{data_root}"' if data_root else "")


def supernode(tls: Tls, superlink_fleet: str, private_key: str, partition_id: int,
              num_partitions: int, data_root: str = "", port: int = CLIENTAPP_PORT,
              secret_file: str = "", data_dir: str = "", client_name: str = "") -> list[str]:
    """`flower-supernode` authenticated by `private_key`, trusting the CA, dialling the Fleet API;
    its runtime API stays on loopback for its executor (`clientapp_executor`). `data_dir`: the
    node's own data folder (its clients are the data sets found there; `client_name` names a
    folder that is one client), else a partition slot."""
    return [
        "flower-supernode",
        "--root-certificates", tls.ca_cert,
        "--superlink", superlink_fleet,
        "--auth-supernode-private-key", private_key,
        "--isolation", "process",
        "--port", str(port),
        "--node-config", node_config(partition_id, num_partitions, data_root, data_dir, client_name),
        *_secret(secret_file),
    ]


def clientapp_executor(port: int = CLIENTAPP_PORT, secret_file: str = "") -> list[str]:
    """`flower-superexec` that starts the ClientApp for each message its SuperNode receives."""
    return ["flower-superexec", "--insecure", "--runtime-api-address", f"127.0.0.1:{port}",
            *_secret(secret_file)]


# --- Docker Compose -------------------------------------------------------------------------------
CONTAINER_CERTS = "/app/certs"  # ca.crt, server.pem, server.key (read-only mount)
CONTAINER_KEYS = "/app/keys"  # one SuperNode's private key (read-only mount)
CONTAINER_DATA = "/data"  # a node's own data (read-only mount of its one folder) = its data-dir
CONTAINER_STATE = "/app/state"  # SuperLink database (named volume: registrations survive restarts)
CONTAINER_OUTPUTS = "/app/outputs"  # run results written by the ServerApp
CONTAINER_APP = "/src"  # the repository, read-only, in the `cli` service: what `flwr run` submits
COMPOSE_CONNECTION = "bouquet-docker"  # the `cli` service's SuperLink connection (docker/flwr-cli.toml)
# Where Flower's images come from: Docker Hub's `flwr` (default) or the local stand-ins of
# docker/scripts/build_images.sh --local-bases (FLWR_IMAGES=bouquet-base).
FLOWER_IMAGES = "${FLWR_IMAGES:-flwr}"


# The app image's torch: `cpu` (the Compose demo's default; docker/superexec.Dockerfile's TORCH=cpu) or
# `cuda` (BOUQUET_TORCH=cuda), tagged bouquet-superexec:<version>-cpu / -cuda.
APP_TORCH = "${BOUQUET_TORCH:-cpu}"
APP_IMAGE = f"bouquet-superexec:{FLOWER_VERSION}-{APP_TORCH}"


def flower_image(role: str) -> str:
    """A Flower 1.39 image (`superlink`, `supernode`, `superexec`) as Compose interpolates it."""
    return f"{FLOWER_IMAGES}/{role}:{FLOWER_VERSION}"


def compose(num_supernodes: int) -> dict:
    """docker/compose.yml as a dict: the same command lines as bare metal, with container paths.

    Only the Fleet port is published. The SuperLink's HTTP API (Control + Runtime, `CONTROL_PORT`)
    listens on 127.0.0.1 inside its container: its executor and the `cli` service share the
    SuperLink's network namespace and reach it there; SuperNode containers and other hosts cannot.
    Valid for Compose v1 (1.27+) and v2: no top-level `name:`, the project is named with `-p bouquet`."""
    tls = Tls.in_dir(CONTAINER_CERTS)
    link = superlink(tls, f"{CONTAINER_STATE}/state.db", host="127.0.0.1")

    def build(dockerfile: str, role: str) -> dict:
        # BOUQUET_BUILD_NETWORK / BOUQUET_PIP_OPTIONS: a local wheelhouse (docker/scripts/build_images.sh)
        return {"context": "..", "dockerfile": f"docker/{dockerfile}",
                "network": "${BOUQUET_BUILD_NETWORK:-default}",
                "args": {"BASE": flower_image(role), "PIP_OPTIONS": "${BOUQUET_PIP_OPTIONS:-}"}}

    def app_image() -> dict:  # a fresh dict per service (no YAML anchors in the file)
        spec = build("superexec.Dockerfile", "superexec")
        # BOUQUET_TORCH: the CPU image (no CUDA packages, no torchvision) unless `cuda` is asked for
        spec["args"].update({"TORCH": APP_TORCH, "TORCH_CPU_OPTIONS": "${BOUQUET_TORCH_CPU_OPTIONS:-}"})
        return {"build": spec, "image": APP_IMAGE}

    services: dict = {
        "superlink": {
            "build": build("superlink.Dockerfile", "superlink"),
            "image": f"bouquet-superlink:{FLOWER_VERSION}",
            "entrypoint": link[:1],
            "command": link[1:],
            # The Fleet API only; BOUQUET_FLEET_PUBLISH=127.0.0.1:9092 keeps it on this host.
            "ports": [f"${{BOUQUET_FLEET_PUBLISH:-{FLEET_PORT}}}:{FLEET_PORT}"],
            "volumes": [f"./certs:{CONTAINER_CERTS}:ro", f"superlink-state:{CONTAINER_STATE}"],
            "restart": "unless-stopped",
        },
        "superexec-serverapp": {
            **app_image(),
            "entrypoint": serverapp_executor(tls)[:1],
            "command": serverapp_executor(tls)[1:],
            "environment": dict(EXECUTOR_ENV),
            "network_mode": "service:superlink",  # the SuperLink's runtime API on 127.0.0.1
            "volumes": [f"./certs:{CONTAINER_CERTS}:ro", f"outputs:{CONTAINER_OUTPUTS}"],
            "depends_on": ["superlink"],
            "restart": "unless-stopped",
        },
        # `docker compose -p bouquet -f docker/compose.yml run --rm cli flwr run /src bouquet-docker`:
        # the `flwr` CLI inside the SuperLink's network namespace (the Control API is on its loopback).
        "cli": {
            "image": APP_IMAGE,
            "profiles": ["cli"],
            "entrypoint": [],
            "command": ["flwr", "--help"],
            "network_mode": "service:superlink",
            "working_dir": CONTAINER_APP,
            "volumes": [f"./certs/ca.crt:{CONTAINER_CERTS}/ca.crt:ro", f"./keys:{CONTAINER_KEYS}:ro",
                        f"./flwr-cli.toml:/app/.flwr/config.toml:ro",
                        f"${{BOUQUET_APP:-..}}:{CONTAINER_APP}:ro"],
            "depends_on": ["superlink"],
        },
    }
    for i in range(num_supernodes):
        # each site's own data only: the folder ${BOUQUET_DATA}/client-00<i> (the layout of
        # `python -m client_app.export`), mounted for its executor, is the node's one client
        site = client_folder_name(i, num_supernodes)
        command = supernode(tls, f"superlink:{FLEET_PORT}", f"{CONTAINER_KEYS}/supernode-{i}", i,
                            num_supernodes, data_dir=CONTAINER_DATA, client_name=site)
        services[f"supernode-{i}"] = {
            "image": flower_image("supernode"),
            "entrypoint": command[:1],
            "command": command[1:],
            "volumes": [f"./certs/ca.crt:{CONTAINER_CERTS}/ca.crt:ro",
                        f"./keys/supernode-{i}:{CONTAINER_KEYS}/supernode-{i}:ro"],
            "depends_on": ["superlink"],
            # An unregistered key is refused (exit 305): retry until `flwr supernode register` ran.
            "restart": "unless-stopped",
        }
        services[f"superexec-clientapp-{i}"] = {
            **app_image(),
            "entrypoint": clientapp_executor()[:1],
            "command": clientapp_executor()[1:],
            "environment": dict(EXECUTOR_ENV),
            # its SuperNode's runtime API on 127.0.0.1; restart it with its SuperNode (a restarted
            # SuperNode has a new network namespace)
            "network_mode": f"service:supernode-{i}",
            "volumes": [f"${{BOUQUET_DATA:-./data}}/{site}:{CONTAINER_DATA}:ro"],
            "shm_size": "1gb",  # torch worker shared memory (the 64 MB default is too small)
            "depends_on": [f"supernode-{i}"],
            "restart": "unless-stopped",
        }
    return {"services": services, "volumes": {"superlink-state": {}, "outputs": {}}}


COMPOSE_HEADER = """\
# Bouquet multi-node demo: one SuperLink, {n} SuperNodes, their executors; TLS and SuperNode auth on.
# Generated by `python -m server_app.harness.deploy compose --supernodes {n} > docker/compose.yml` from the
# same functions the loopback end-to-end tests run (tests/test_deploy.py checks they agree).
# Works with Compose v1 (docker-compose 1.29) and v2; name the project: `-p bouquet`. The whole
# sequence (certificates, keys, build, up, key registration, a run): docs/deploy-compose.md.
"""


def compose_yaml(num_supernodes: int) -> str:
    import yaml  # PyYAML ships with flwr[simulation] (ray)

    body = yaml.safe_dump(compose(num_supernodes), sort_keys=False, default_flow_style=False,
                          width=100)
    return COMPOSE_HEADER.format(n=num_supernodes) + body


SECRET_FILE = "superexec.secret"  # per machine: shared by its SuperLink/SuperNode and executor
MAKE_SECRET = f"[ -s {SECRET_FILE} ] || (umask 077 && openssl rand -out {SECRET_FILE} 32)"


def node_data_dir(data_dir: str, i: int) -> str:
    """SuperNode i's own data folder: `data_dir` with `{i}` replaced by i (the same path on every
    machine when it has no `{i}`)."""
    return data_dir.replace("{i}", str(i))


def bare_metal(superlink_host: str, num_supernodes: int, certs: str, keys: str,
               data_root: str, data_dir: str = "") -> str:
    """The commands to run on each machine, as shell lines. Each machine makes its own SuperExec
    secret; the SuperLink's Control API is reached on its machine or through an SSH tunnel. With
    `data_dir`, every SuperNode hosts the clients of its own data folder (`node_data_dir`) and the
    SuperLink machine needs no data at all; else SuperNode i hosts partition slot i of the run's
    data set (under `data_root`)."""
    tls = Tls.in_dir(certs)
    fleet = f"{superlink_host}:{FLEET_PORT}"
    settings = " ".join(f"{key}={shlex.quote(value)}" for key, value in EXECUTOR_ENV.items())
    lines = ["# SuperLink machine", MAKE_SECRET,
             shlex.join(superlink(tls, "state.db", secret_file=SECRET_FILE)),
             f"{settings} {shlex.join(serverapp_executor(tls, secret_file=SECRET_FILE))}",
             f"# submit runs on this machine (address 127.0.0.1:{CONTROL_PORT}), or elsewhere "
             f"through a tunnel: ssh -N -L {CONTROL_PORT}:127.0.0.1:{CONTROL_PORT} {superlink_host}"]
    for i in range(num_supernodes):
        lines += [f"# SuperNode machine {i}", MAKE_SECRET,
                  shlex.join(supernode(Tls(f"{certs}/ca.crt"), fleet, f"{keys}/supernode-{i}", i,
                                       num_supernodes, data_root, secret_file=SECRET_FILE,
                                       data_dir=node_data_dir(data_dir, i) if data_dir else "")),
                  f"{settings} {shlex.join(clientapp_executor(secret_file=SECRET_FILE))}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m server_app.harness.deploy", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    cmd = sub.add_parser("commands", help="print the bare-metal commands for each machine")
    cmd.add_argument("--superlink-host", required=True, help="name or IP the SuperNodes dial")
    cmd.add_argument("--supernodes", type=int, default=3)
    cmd.add_argument("--certs", default="certs", help="directory of gen_certs.sh output")
    cmd.add_argument("--keys", default="keys", help="directory of gen_keys.sh output")
    cmd.add_argument("--data-root", default="",
                     help="partitioned: where each SuperNode machine keeps the run's data set")
    cmd.add_argument("--data-dir", default="",
                     help="own data: each SuperNode machine's own data folder, whose clients it "
                          "hosts ({i} is replaced by the SuperNode's number, e.g. /data/site-{i})")
    comp = sub.add_parser("compose", help="print docker/compose.yml")
    comp.add_argument("--supernodes", type=int, default=3)
    args = parser.parse_args(argv)
    if args.what == "commands":
        if args.data_dir and args.data_root:
            parser.error("give --data-dir (each node's own data) or --data-root (a partition of "
                         "one data set on every node), not both")
        print(bare_metal(args.superlink_host, args.supernodes, args.certs, args.keys, args.data_root,
                         args.data_dir))
    else:
        print(compose_yaml(args.supernodes), end="")


if __name__ == "__main__":
    main()
