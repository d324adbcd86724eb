"""`flwr run` simulation on an existing two-node Ray cluster (loopback, one CPU per node).

Flower's simulation process (`flwr-simulation`, started by the SuperLink's SuperExec) calls `ray.init`
without an address, so it joins the cluster named by `RAY_ADDRESS` in its environment, which it inherits
from the SuperLink. With one CPU per node and `client-resources-num-cpus=1` Flower's actor pool holds one
ClientApp actor per node; the test reads Ray's task events to check that ClientApps ran on both nodes, and
that the run's numbers equal the same federation run in one process.
"""

import csv
import json
import subprocess
import sys

import pytest

from server_app.harness.simulate import simulate
from tests.ray_cluster import QUIET_ENV, LoopbackRayCluster
from tests.simulation_superlink import flwr, run_id, run_status, simulation_superlink

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN = {"num-clients": 4, "num-rounds": 2, "dataset": "digits", "model": "mclr", "partition": "iid",
       "max-samples-per-client": 200, "run-name": "ray"}

# a separate driver reads the GCS: per ClientApp call (Flower's `ClientAppActor.run` actor task),
# the node that ran it
NODES_OF_CLIENTAPP_CALLS = """
import collections, json, ray
from ray._private.state import state
from ray.core.generated import gcs_pb2
ray.init(logging_level="ERROR")
calls = collections.Counter()
for raw in state._connect_and_get_accessor().get_task_events():
    event = gcs_pb2.TaskEvents.FromString(raw)
    if event.task_info.func_or_class_name.endswith("ClientAppActor.run"):
        nodes = [u.node_id.hex() for u in [event.state_updates] if u.node_id]
        calls[(nodes or [event.task_info.node_id.hex()])[0]] += 1
print(json.dumps(calls))
"""


def _run_config(overrides: dict) -> str:
    return " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in overrides.items())


def test_flwr_run_on_a_two_node_ray_cluster_uses_both_nodes_and_matches_one_process(tmp_path):
    with LoopbackRayCluster(nodes=2, cpus_per_node=1) as cluster:
        nodes = {node["NodeID"] for node in cluster.alive_nodes()}
        assert len(nodes) == 2
        home = tmp_path / "flwr-home"
        home.mkdir()
        env_extra = {**QUIET_ENV, "RAY_ADDRESS": cluster.address,
                     "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
        with simulation_superlink(home, env_extra) as env:
            result = flwr(env, "run", ".", "e2e", "--stream", "--federation-config",
                          "num-supernodes=4 client-resources-num-cpus=1 client-resources-num-gpus=0",
                          "--run-config", _run_config({**RUN, "output-dir": str(tmp_path / "ray")}))
            assert result.returncode == 0, result.stderr[-3000:]
            status = run_status(env, run_id(result.stdout))
            assert status["status"] == "finished:completed", status
        calls = subprocess.run([sys.executable, "-W", "ignore", "-c", NODES_OF_CLIENTAPP_CALLS],
                               capture_output=True, text=True, timeout=120,
                               env={**cluster.env, "RAY_ADDRESS": cluster.address})
        assert calls.returncode == 0, calls.stderr[-2000:]
        per_node = json.loads(calls.stdout.strip().splitlines()[-1])
    assert set(per_node) == nodes, per_node  # ClientApps ran on both nodes, and only there
    assert all(count > 0 for count in per_node.values())

    one_process = simulate({**RUN, "output-dir": str(tmp_path / "local")})
    cluster_run = json.loads((tmp_path / "ray" / "ray" / "summary.json").read_text())
    for key in ("final", "round-0", "bytes-per-round"):
        assert cluster_run[key] == one_process[key], key
    assert cluster_run["final"]["personalized"]["mean"] > cluster_run["round-0"]["personalized"]["mean"]
    rows = [list(csv.reader((tmp_path / where / "ray" / "clients.csv").open()))
            for where in ("ray", "local")]
    assert rows[0] == rows[1] and len(rows[0]) == 1 + RUN["num-clients"]
