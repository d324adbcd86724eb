"""A real deployment on the nodes' own data: `flower-superlink` with TLS and SuperNode
authentication, 3 authenticated SuperNodes each given only its own folder (node_config `data-dir`),
of different sizes and formats (a .npz, an ImageFolder without some classes, LEAF JSON), and a server
with no data at all (no data root). FedAvg, SFL* and FLT complete through `flwr run`, the results name
the clients, and the server side (the SuperLink, its executor and the ServerApp processes it starts)
opened no file under the data folders and no built-in data set: every `open` of those processes is
recorded by an audit hook (`sys.addaudithook`, installed by a `sitecustomize` on their PYTHONPATH).

The command lines are `server_app.harness.deploy`'s (`supernode(..., data_dir=...)`), those of
docs/deploy.md; every process is started in its own session and stopped by its PID.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest

from server_app.harness import deploy
from server_app.harness.loopback import LoopbackFederation, free_port
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

AUDIT_HOOK = '''\
"""Test audit hook: record every path this process (and each Python child) opens."""
import os
import sys

_LOG = os.environ.get("BOUQUET_OPEN_LOG")
if _LOG:
    _FD = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _record(event, args):
        if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        try:
            path = os.path.abspath(os.fsdecode(args[0]))
        except Exception:  # noqa: BLE001 - never break the process being audited
            return
        os.write(_FD, f"{os.getpid()} {path}\\n".encode("utf-8", "replace"))

    sys.addaudithook(_record)
'''

JOB = {"dataset": "digits", "model": "mclr", "num-clients": 3, "num-rounds": 2, "eval-every": 2,
       "lr": 0.1, "finetune-epochs": 0, "client-threads": 1, "round-timeout": 120.0,
       "data-root": ""}  # the server has no data root: it needs none
METHODS = {
    "fedavg": {},
    # blends the label-sharing prior (sfl.graph default: from the reported label sets) in
    "sfl-star": {"sfl.gl-k": 1, "sfl.gl-steps": 5, "sfl.beta": 0.5},
    "flt": {"flt.latent-dim": 16, "flt.ae-epochs": 1},
}
NAMES = ["site-images", "site-npz", "writer-7"]  # sorted: client ids 0, 1, 2


def write_sites(root: Path) -> list[Path]:
    """Three sites, each a folder of its own: a .npz of 50 samples (every class, a `group` array),
    an ImageFolder of 20 PNGs of classes 0-4 only, and a LEAF JSON file of one user with 30 samples."""
    from PIL import Image

    rng = np.random.default_rng(0)
    npz = root / "site-npz"
    npz.mkdir(parents=True)
    np.savez(npz / "data.npz", x=rng.random((50, 1, 28, 28), dtype=np.float32),
             y=np.arange(50) % 10, group=np.zeros(50, dtype=np.int64))
    images = root / "site-images"
    for i in range(20):
        folder = images / str(i % 5)  # classes 5-9 missing: normal
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), "L").save(folder / f"{i}.png")
    leaf = root / "site-leaf"
    leaf.mkdir(parents=True)
    user = {"x": rng.random((30, 784)).round(3).tolist(), "y": [int(v) for v in np.arange(30) % 10]}
    (leaf / "data.json").write_text(json.dumps(
        {"users": ["writer-7"], "num_samples": [30], "user_data": {"writer-7": user}}))
    return [npz, images, leaf]


class OwnDataFederation(LoopbackFederation):
    """The loopback deployment with SuperNode i on its own folder `data_dirs[i]` (deploy.supernode's
    `data_dir`), and the server side's opened paths recorded into `open_log`."""

    data_dirs: list[Path]
    open_log: Path

    def env(self, home: str = "cli") -> dict[str, str]:
        env = super().env(home)
        if home == "superlink":  # the SuperLink, its executor and every ServerApp process
            hook = self.root / "audit"
            hook.mkdir(exist_ok=True)
            (hook / "sitecustomize.py").write_text(AUDIT_HOOK)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")]))
            env["BOUQUET_OPEN_LOG"] = str(self.open_log)
        return env

    def start_supernode(self, i: int, key: Path | None = None, prefix: list[str] | None = None):
        port = free_port()
        home = f"supernode-{i}"
        node = self.spawn(home, deploy.supernode(
            deploy.Tls(str(self.certs / "ca.crt")), f"{self.host}:{self.fleet_port}",
            str(key or self.keys / f"supernode-{i}"), i, self.num_supernodes, port=port,
            secret_file=self.secret(home), data_dir=str(self.data_dirs[i])), home, prefix)
        self._wait_port(port, node)
        self.spawn(f"superexec-clientapp-{i}", deploy.clientapp_executor(port, self.secret(home)),
                   home, prefix)
        return node


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    base = tmp_path_factory.mktemp("own-data")
    fed = OwnDataFederation(base / "federation", 3,
                            env_extra={"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"})
    fed.data_dirs = write_sites(base / "sites")
    fed.open_log = base / "server-opened.txt"
    try:
        fed.start()
        yield fed
    finally:
        processes = [p.process for p in fed.procs.values()]
        fed.stop()
        assert all(p.poll() is not None for p in processes)


def test_supernode_commands_name_only_their_own_folder(deployment):
    for i, folder in enumerate(deployment.data_dirs):
        command = deployment.procs[f"supernode-{i}"].process.args
        config = command[command.index("--node-config") + 1]
        assert config == f'data-dir="{folder}"'
        assert "partition-id" not in config and "data-root" not in " ".join(command)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_methods_complete_on_the_nodes_own_data_and_the_server_opens_none(deployment, method,
                                                                           tmp_path):
    outcome = deployment.run(REPO, {**JOB, **METHODS[method], "method": method,
                                    "output-dir": str(tmp_path), "run-name": method})
    assert outcome.completed, f"{outcome.status}: {outcome.details}\n{outcome.log[-3000:]}"
    out = tmp_path / method
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final"]["round"] == 2 and "left-out-clients" not in summary
    with (out / "clients.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["name"] for row in rows] == NAMES and all(row["accuracy"] for row in rows)
    if method == "sfl-star":  # the label-sharing prior of the reported label sets; no groups: no
        prior = np.load(out / "prior-graph.npy")  # share figures (site-images, writer-7 have none)
        assert prior.shape == (3, 3) and (prior > 0).all()  # every two sites share a label
        assert not [key for key in summary["sfl"] if "share" in key]

    opened = deployment.open_log.read_text(errors="replace").splitlines()
    paths = [line.split(" ", 1)[1] for line in opened if " " in line]
    assert any(p == str(out / "summary.json") for p in paths), "the audit hook recorded no write"
    sites = [str(folder) for folder in deployment.data_dirs]
    read = [p for p in paths if p.startswith(tuple(sites)) or "digits" in Path(p).name
            or "/datasets/data/" in p]
    assert read == [], f"the server side opened data files: {read[:5]}"
