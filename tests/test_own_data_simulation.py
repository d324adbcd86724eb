"""A simulation over one's own federated data: the run config's `data-dir` (one subfolder per client)
shared by every simulated SuperNode, each hosting the subfolders at its partition slot. The same job
on the exported folders of a built-in partition gives the partitioned run's numbers bit for bit, in
process and through `flwr run` with any number of simulated SuperNodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from client_app.node import local_clients
from datasets.export import export
from server_app.cli import CheckFailed, check_data
from server_app.harness.simulate import simulate
from strategies.shared.run_config import RunConfig, default_run_config
from tests.method_runs import BASE
from tests.test_determinism import _untimed, _value

# FedAvg with the MLP (dropout) on 5 clients in 2 label clusters, every client sampled
JOB = {**BASE, "method": "fedavg", "model": "mlp", "num-clients": 5, "num-rounds": 2,
       "fraction-train": 1.0}


def exported(tmp_path: Path, job: dict) -> Path:
    folder = tmp_path / "export"
    export(RunConfig.from_flower({**default_run_config(), **job}), folder)
    return folder


def comparable(summary: dict) -> dict:
    """A summary without timings and without the per-client names own data adds."""
    return _untimed(summary)


def rounds(directory: Path) -> list[dict]:
    return [_untimed(json.loads(line)) for line in (directory / "rounds.jsonl").read_text().splitlines()]


def context(run_config: dict, partition_id: int, num_partitions: int, **node) -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": partition_id,
                                                      "num-partitions": num_partitions, **node},
                   state=RecordDict(), run_config=run_config)


def test_each_simulated_node_hosts_the_subfolders_at_its_slot(tmp_path):
    folder = exported(tmp_path, JOB)
    run_config = {**default_run_config(), **JOB, "data-dir": str(folder)}
    hosted = [[c.name for c in local_clients(context(run_config, p, 2))] for p in range(2)]
    assert hosted == [["client-000", "client-002", "client-004"], ["client-001", "client-003"]]
    # a node's own data-dir (a deployment) wins over the run's, and is hosted whole
    own = local_clients(context(run_config, 1, 2, **{"data-dir": str(folder / "client-003")}))
    assert [c.name for c in own] == ["client-003"]


def test_bouquet_check_counts_the_clients_of_data_dir(tmp_path):
    folder = exported(tmp_path, JOB)
    check_data(RunConfig.from_flower({**default_run_config(), **JOB, "data-dir": str(folder)}))
    with pytest.raises(CheckFailed, match="holds 5 clients .* but num-clients = 4; set num-clients=5"):
        check_data(RunConfig.from_flower({**default_run_config(), **JOB, "num-clients": 4,
                                          "data-dir": str(folder)}))


@pytest.mark.federation
def test_the_run_config_data_dir_gives_the_partitioned_numbers_in_process(tmp_path):
    folder = exported(tmp_path, JOB)
    partitioned = simulate({**JOB, "output-dir": str(tmp_path), "run-name": "partitioned"}, num_nodes=2)
    own = simulate({**JOB, "data-dir": str(folder), "output-dir": str(tmp_path), "run-name": "own"},
                   num_nodes=2)
    assert rounds(tmp_path / "own") == rounds(tmp_path / "partitioned")
    assert comparable(own["final"]) == comparable(partitioned["final"])


@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    from tests.simulation_superlink import simulation_superlink
    with simulation_superlink(tmp_path_factory.mktemp("flwr-home")) as env:
        yield env


@pytest.mark.e2e
@pytest.mark.parametrize("nodes", [2, 5])
def test_flwr_run_on_the_exported_folders_gives_the_partitioned_numbers(superlink, tmp_path, nodes):
    from tests.simulation_superlink import flwr

    folder = exported(tmp_path, JOB)
    partitioned = simulate({**JOB, "output-dir": str(tmp_path), "run-name": "partitioned"}, num_nodes=1)
    overrides = " ".join(f"{key}={_value(value)}" for key, value in
                         {**JOB, "data-dir": str(folder), "output-dir": str(tmp_path),
                          "run-name": "flwr"}.items())
    result = flwr(superlink, "run", ".", "e2e", "--stream", "--federation-config",
                  f"num-supernodes={nodes}", "--run-config", overrides, timeout=600)
    assert (tmp_path / "flwr" / "summary.json").exists(), result.stdout[-3000:] + result.stderr[-2000:]
    assert rounds(tmp_path / "flwr") == rounds(tmp_path / "partitioned")
    names = (tmp_path / "flwr" / "clients.csv").read_text()
    assert all(f"client-00{i}" in names for i in range(5))
