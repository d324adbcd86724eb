"""Deployment command lines: one SuperLink, N SuperNodes and their executors, TLS and SuperNode auth.

The single source of every deployment flag: the bare-metal commands (`python -m server_app.harness.deploy
commands`), the end-to-end tests (tests/test_deploy_e2e.py) and docker/compose.yml (`python -m
server_app.harness.deploy compose`, checked against the committed file by tests/test_deploy.py) are all built
from these functions, so the Docker demo runs exactly the flags the loopback tests exercise.

Layout (Flower 1.39): SuperNodes dial the SuperLink's Fleet API (gRPC, `FLEET_PORT`) with TLS and an
ECDSA key registered with `flwr supernode register`; `flwr` (CLI) and the ServerApp executor use the
SuperLink's HTTPS API (`CONTROL_PORT`). Apps run in `--isolation process`: one `flower-superexec` beside
the SuperLink (ServerApp) and one beside each SuperNode (ClientApp), each talking to its neighbour's
runtime API on loopback, so only the Fleet and Control ports are exposed.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

FLEET_PORT = 9092  # SuperLink Fleet API (gRPC-rere): SuperNodes connect here
CONTROL_PORT = 8000  # SuperLink Control + Runtime API (HTTPS): `flwr` CLI and the ServerApp executor
CLIENTAPP_PORT = 9094  # a SuperNode's runtime API for its ClientApp executor (loopback only)
FLOWER_VERSION = "1.39.0"  # tag of the official flwr/* images (pyproject pins flwr>=1.39,<1.40)

# Environment of every `flower-superexec` (ServerApp and ClientApp executors). A Flower 1.39 setting:
# how often an executor asks its runtime API for a new task (default 1.0 s, allowed 0.01-60). Every
# message waits for that poll before its ClientApp process starts; benchmarks/deploy_speed.py measures
# the default against this value (README "Deployment speed").
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


def superlink(tls: Tls, database: str, fleet_address: str = f"0.0.0.0:{FLEET_PORT}",
              host: str = "0.0.0.0", port: int = CONTROL_PORT) -> list[str]:
    """`flower-superlink` with TLS on every API, SuperNode authentication, registrations kept in
    `database`, and apps run by a separate executor (`serverapp_executor`)."""
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
    ]


def serverapp_executor(tls: Tls, superlink_runtime: str = f"127.0.0.1:{CONTROL_PORT}") -> list[str]:
    """`flower-superexec` that starts the ServerApp of each run; it reaches the SuperLink's runtime
    API over TLS (the certificate's SANs include 127.0.0.1)."""
    return [
        "flower-superexec",
        "--root-certificates", tls.ca_cert,
        "--runtime-api-address", superlink_runtime,
    ]


def node_config(partition_id: int, num_partitions: int, data_root: str = "") -> str:
    """The `--node-config` of a SuperNode: which clients it hosts (c ≡ partition-id mod
    num-partitions, see server_app/clients.py) and, optionally, where its data lives."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} must be in [0, num-partitions={num_partitions})")
    config = f"partition-id={partition_id} num-partitions={num_partitions}"
    return config + (f' data-root="{data_root}"' if data_root else "")


def supernode(tls: Tls, superlink_fleet: str, private_key: str, partition_id: int,
              num_partitions: int, data_root: str = "", port: int = CLIENTAPP_PORT) -> list[str]:
    """`flower-supernode` authenticated by `private_key`, trusting the CA, dialling the Fleet API;
    its runtime API stays on loopback for its executor (`clientapp_executor`)."""
    return [
        "flower-supernode",
        "--root-certificates", tls.ca_cert,
        "--superlink", superlink_fleet,
        "--auth-supernode-private-key", private_key,
        "--isolation", "process",
        "--port", str(port),
        "--node-config", node_config(partition_id, num_partitions, data_root),
    ]


def clientapp_executor(port: int = CLIENTAPP_PORT) -> list[str]:
    """`flower-superexec` that starts the ClientApp for each message its SuperNode receives."""
    return ["flower-superexec", "--insecure", "--runtime-api-address", f"127.0.0.1:{port}"]


# --- Docker Compose -------------------------------------------------------------------------------
CONTAINER_CERTS = "/app/certs"  # ca.crt, server.pem, server.key (read-only mount)
CONTAINER_KEYS = "/app/keys"  # one SuperNode's private key (read-only mount)
CONTAINER_DATA = "/data"  # data sets (read-only mount) = the node's data-root
CONTAINER_STATE = "/app/state"  # SuperLink database (named volume: registrations survive restarts)
CONTAINER_OUTPUTS = "/app/outputs"  # run results written by the ServerApp


def compose(num_supernodes: int) -> dict:
    """docker/compose.yml as a dict: the same command lines as bare metal, with container paths."""
    tls = Tls.in_dir(CONTAINER_CERTS)

    def app_image() -> dict:  # a fresh dict per service (no YAML anchors in the file)
        return {"build": {"context": "..", "dockerfile": "docker/superexec.Dockerfile"},
                "image": f"bouquet-superexec:{FLOWER_VERSION}"}

    services: dict = {
        "superlink": {
            "build": {"context": "..", "dockerfile": "docker/superlink.Dockerfile"},
            "image": f"bouquet-superlink:{FLOWER_VERSION}",
            "entrypoint": superlink(tls, f"{CONTAINER_STATE}/state.db")[:1],
            "command": superlink(tls, f"{CONTAINER_STATE}/state.db")[1:],
            "ports": [f"{FLEET_PORT}:{FLEET_PORT}", f"{CONTROL_PORT}:{CONTROL_PORT}"],
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
    }
    for i in range(num_supernodes):
        command = supernode(tls, f"superlink:{FLEET_PORT}", f"{CONTAINER_KEYS}/supernode-{i}", i,
                            num_supernodes, data_root=CONTAINER_DATA)
        services[f"supernode-{i}"] = {
            "image": f"flwr/supernode:{FLOWER_VERSION}",
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
            "network_mode": f"service:supernode-{i}",  # its SuperNode's runtime API on 127.0.0.1
            "volumes": [f"${{BOUQUET_DATA:-./data}}:{CONTAINER_DATA}:ro"],
            "shm_size": "1gb",  # torch worker shared memory (the 64 MB default is too small)
            "depends_on": [f"supernode-{i}"],
            "restart": "unless-stopped",
        }
    return {"name": "bouquet", "services": services,
            "volumes": {"superlink-state": {}, "outputs": {}}}


COMPOSE_HEADER = """\
# Bouquet multi-node demo: one SuperLink, {n} SuperNodes, their executors; TLS and SuperNode auth on.
# Generated by `python -m server_app.harness.deploy compose --supernodes {n} > docker/compose.yml` from the
# same functions the loopback end-to-end tests run (tests/test_deploy.py checks they agree).
# Before `docker compose -f docker/compose.yml up --build`: docker/scripts/gen_certs.sh and
# docker/scripts/gen_keys.sh (see README, "Deploy").
"""


def compose_yaml(num_supernodes: int) -> str:
    import yaml  # PyYAML ships with flwr[simulation] (ray)

    body = yaml.safe_dump(compose(num_supernodes), sort_keys=False, default_flow_style=False,
                          width=100)
    return COMPOSE_HEADER.format(n=num_supernodes) + body


def bare_metal(superlink_host: str, num_supernodes: int, certs: str, keys: str,
               data_root: str) -> str:
    """The commands to run on each machine, as shell lines."""
    tls = Tls.in_dir(certs)
    fleet = f"{superlink_host}:{FLEET_PORT}"
    settings = " ".join(f"{key}={shlex.quote(value)}" for key, value in EXECUTOR_ENV.items())
    lines = ["# SuperLink machine", shlex.join(superlink(tls, "state.db")),
             f"{settings} {shlex.join(serverapp_executor(tls))}"]
    for i in range(num_supernodes):
        lines += [f"# SuperNode machine {i}",
                  shlex.join(supernode(Tls(f"{certs}/ca.crt"), fleet, f"{keys}/supernode-{i}", i,
                                       num_supernodes, data_root)),
                  f"{settings} {shlex.join(clientapp_executor())}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m server_app.harness.deploy", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    cmd = sub.add_parser("commands", help="print the bare-metal commands for each machine")
    cmd.add_argument("--superlink-host", required=True, help="name or IP the SuperNodes dial")
    cmd.add_argument("--supernodes", type=int, default=3)
    cmd.add_argument("--certs", default="certs", help="directory of gen_certs.sh output")
    cmd.add_argument("--keys", default="keys", help="directory of gen_keys.sh output")
    cmd.add_argument("--data-root", default="", help="data directory on each SuperNode machine")
    comp = sub.add_parser("compose", help="print docker/compose.yml")
    comp.add_argument("--supernodes", type=int, default=3)
    args = parser.parse_args(argv)
    if args.what == "commands":
        print(bare_metal(args.superlink_host, args.supernodes, args.certs, args.keys, args.data_root))
    else:
        print(compose_yaml(args.supernodes), end="")


if __name__ == "__main__":
    main()
