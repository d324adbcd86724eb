"""Nodes with their own data (node_config `data-dir`, datasets/local.py): the formats, named clients,
the export of a built-in partition (a run on the exported folders gives the partitioned run's numbers
bit for bit) and bad data (the client is left out, the run goes on, the summary says why)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict

from client_app.identify import identify
from datasets.export import export
from datasets.federated import load_client_data
from datasets.local import (
    Expected,
    LocalDataError,
    discover,
    load_local,
    local_split,
    read_road_graph,
)
from server_app.harness.local_grid import set_task_identity
from server_app.harness.simulate import simulate
from strategies.shared.messages import CONFIG, IDENTIFY, IdentifyReply
from strategies.shared.run_config import RunConfig, default_run_config
from tests.method_runs import BASE, CASES


def config(**overrides: Any) -> RunConfig:
    return RunConfig.from_flower({**default_run_config(), **overrides})


DIGITS = config(dataset="digits", partition="iid", **{"num-clients": 2, "model": "mclr"})
EXPECTED = Expected.of(DIGITS)


def write_npz(path: Path, n: int, labels: list[int] | None = None, **extra: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(n)
    y = np.array(labels if labels is not None else [i % 10 for i in range(n)])
    np.savez(path, x=rng.random((len(y), 1, 28, 28), dtype=np.float32), y=y, **extra)


def write_image(path: Path, value: int, size: tuple[int, int] = (28, 28), mode: str = "L") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode == "L" else (value, value, value)).save(path)


# --- formats ---------------------------------------------------------------------------------------

def test_npz_split_by_files_keeps_every_array_exactly(tmp_path):
    write_npz(tmp_path / "site" / "train.npz", 20, domain=np.arange(20) % 2)
    write_npz(tmp_path / "site" / "test.npz", 5, domain=np.arange(5) % 2)
    [client] = discover(str(tmp_path / "site"))
    assert (client.name, client.kind) == ("site", "npz")
    data = load_local(client, EXPECTED)
    with np.load(tmp_path / "site" / "train.npz") as raw:
        assert np.array_equal(data.train_x, raw["x"]) and np.array_equal(data.train_y, raw["y"])
    assert data.test_x.shape == (5, 1, 28, 28) and list(data.train_domains[:4]) == [0, 1, 0, 1]


def test_one_npz_is_split_locally_from_the_seed_and_the_name(tmp_path):
    write_npz(tmp_path / "a" / "all.npz", 50)
    [client] = discover(str(tmp_path / "a"), client_name="hospital-a")
    assert client.name == "hospital-a"  # node_config client-name names a one-client folder
    data = load_local(client, EXPECTED)
    assert (len(data.train_y), len(data.test_y)) == (40, 10)  # test-fraction 0.2
    train, test = local_split(50, 0.2, 0, "hospital-a")
    assert np.array_equal(train, local_split(50, 0.2, 0, "hospital-a")[0])
    assert not set(train) & set(test)
    assert not np.array_equal(test, local_split(50, 0.2, 1, "hospital-a")[1])  # the seed matters


def test_image_folder_reads_class_subfolders_by_declared_class_names(tmp_path):
    cfg = config(dataset="cifar10", model="cnn", **{"class-names": "cat,dog,bird"})
    expected = Expected.of(cfg)
    for i in range(4):
        write_image(tmp_path / "site" / "dog" / f"{i}.png", 200, size=(64, 48), mode="RGB")
    write_image(tmp_path / "site" / "cat" / "0.jpg", 10, mode="RGB")  # bird missing: normal
    [client] = discover(str(tmp_path / "site"))
    assert client.kind == "images"
    data = load_local(client, expected)
    x = np.concatenate([data.train_x, data.test_x])
    y = np.concatenate([data.train_y, data.test_y])
    assert x.shape == (5, 3, 32, 32) and sorted(y.tolist()) == [0, 1, 1, 1, 1]
    assert np.allclose(x[y == 1], 200 / 255)


def test_image_folder_with_train_and_test_subfolders(tmp_path):
    write_image(tmp_path / "s" / "train" / "3" / "a.png", 255)
    write_image(tmp_path / "s" / "train" / "7" / "b.png", 0)
    write_image(tmp_path / "s" / "test" / "7" / "c.png", 0)
    data = load_local(discover(str(tmp_path / "s"))[0], EXPECTED)
    assert sorted(data.train_y.tolist()) == [3, 7] and data.test_y.tolist() == [7]


def test_leaf_json_hosts_one_client_per_user(tmp_path):
    def shard(users: dict[str, int]) -> dict:
        return {"users": list(users), "num_samples": list(users.values()),
                "user_data": {u: {"x": [[0.5] * 784] * n, "y": [1] * n} for u, n in users.items()}}

    (tmp_path / "leaf" / "train").mkdir(parents=True)
    (tmp_path / "leaf" / "test").mkdir()
    (tmp_path / "leaf" / "train" / "a.json").write_text(json.dumps(shard({"w1": 3, "w2": 4})))
    (tmp_path / "leaf" / "test" / "a.json").write_text(json.dumps(shard({"w1": 1, "w2": 2})))
    clients = discover(str(tmp_path / "leaf"))
    assert [(c.name, c.kind) for c in clients] == [("w1", "leaf"), ("w2", "leaf")]
    data = load_local(clients[1], EXPECTED)
    assert data.train_x.shape == (4, 1, 28, 28) and len(data.test_y) == 2


def test_traffic_series_one_client_per_sensor_and_road_graph_by_name(tmp_path):
    cfg = config(dataset="traffic-synthetic", partition="sensors", model="gru")
    folder = tmp_path / "road"
    folder.mkdir()
    steps = np.arange(288 * 2)
    for name, phase in (("s-1", 0.0), ("s-2", 1.0)):
        speeds = 60 + 10 * np.sin(steps / 40 + phase)
        (folder / f"{name}.csv").write_text("speed\n" + "\n".join(f"{v:.3f}" for v in speeds))
    (folder / "road-graph.csv").write_text("from,to,weight\ns-1,s-2,0.5\n")
    clients = discover(str(folder))
    assert [c.name for c in clients] == ["s-1", "s-2"]
    data = load_local(clients[0], Expected.of(cfg))
    assert data.train_x.shape[1:] == (12, 2) and data.train_y.shape[1:] == (12,)
    assert 50 < data.target_mean < 70
    graph = read_road_graph(folder / "road-graph.csv", [c.name for c in clients])
    assert graph.tolist() == [[1.0, 0.5], [0.5, 1.0]]


def test_one_subfolder_per_client(tmp_path):
    write_npz(tmp_path / "root" / "b" / "data.npz", 10)
    write_image(tmp_path / "root" / "a" / "5" / "x.png", 3)
    write_image(tmp_path / "root" / "a" / "5" / "y.png", 3)
    clients = discover(str(tmp_path / "root"))
    assert [(c.name, c.kind) for c in clients] == [("a", "images"), ("b", "npz")]


# --- bad data: the error names the file and what is allowed ----------------------------------------

def test_a_corrupt_image_names_the_file(tmp_path):
    write_image(tmp_path / "s" / "1" / "good.png", 9)
    (tmp_path / "s" / "1" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(LocalDataError, match=r"bad\.png: not a readable image.*allowed"):
        load_local(discover(str(tmp_path / "s"))[0], EXPECTED)


def test_a_wrong_shape_names_the_file_and_the_declared_shape(tmp_path):
    np.savez(tmp_path / "data.npz", x=np.zeros((4, 3, 28, 28), np.float32), y=np.zeros(4, int))
    with pytest.raises(LocalDataError, match=r"data\.npz: x has shape \[4, 3, 28, 28\].*"
                                             r"allowed: x \[n, 1, 28, 28\]"):
        load_local(discover(str(tmp_path))[0], EXPECTED)


def test_labels_outside_the_declared_classes(tmp_path):
    write_npz(tmp_path / "n" / "data.npz", 3, labels=[0, 12, 3])
    with pytest.raises(LocalDataError, match=r"labels \[12\] are outside the declared classes; "
                                             r"allowed: class indices 0\.\.9"):
        load_local(discover(str(tmp_path / "n"))[0], EXPECTED)
    write_image(tmp_path / "i" / "horse" / "a.png", 1)
    with pytest.raises(LocalDataError, match=r"'horse' is not a declared class.*class-names"):
        load_local(discover(str(tmp_path / "i"))[0], EXPECTED)


def test_an_empty_folder_is_a_client_without_data(tmp_path):
    (tmp_path / "empty").mkdir()
    [client] = discover(str(tmp_path / "empty"))
    assert (client.name, client.kind) == ("empty", "empty")
    with pytest.raises(LocalDataError, match=r"no data found for client 'empty'; allowed: "):
        load_local(client, EXPECTED)


def test_identify_reports_the_bad_client_with_node_file_and_reason(tmp_path):
    write_npz(tmp_path / "node" / "good" / "data.npz", 10)
    write_npz(tmp_path / "node" / "bad" / "data.npz", 3, labels=[0, 1, 99])
    set_task_identity()
    run_config = {**default_run_config(), "dataset": "digits", "model": "mclr"}
    context = Context(run_id=1, node_id=7, node_config={"data-dir": str(tmp_path / "node")},
                      state=RecordDict(), run_config=run_config)
    request = Message(RecordDict(), dst_node_id=7, message_type=IDENTIFY)
    reply = IdentifyReply.read(identify(request, context).content[CONFIG])
    assert reply.client_names == ["good"] and reply.train_sizes == [8]
    assert reply.failed_names == ["bad"]
    assert "node 7, client 'bad'" in reply.failed_reasons[0]
    assert "data.npz: labels [99]" in reply.failed_reasons[0]


# --- runs ------------------------------------------------------------------------------------------

def comparable(value: Any) -> Any:
    """A summary or round record without wall-clock times and client names."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if "seconds" not in k and k != "name"}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def rounds(directory: Path) -> list[dict]:
    return [comparable(json.loads(line)) for line in (directory / "rounds.jsonl").open()]


def partitioned_and_local(tmp_path: Path, case: str, layout: str) -> tuple[dict, dict]:
    """The same job partitioned (2 nodes) and on its exported folders, hosted as `layout` says: one
    node per client folder, one node with every folder, or two nodes sharing them."""
    keys = {**BASE, **CASES[case], "num-rounds": 2, "output-dir": str(tmp_path)}
    if "method" not in keys:
        keys["method"] = case
    partitioned = simulate({**keys, "run-name": "partitioned"}, num_nodes=2)
    data = tmp_path / "data"
    folders = export(config(**keys), data)
    if layout == "per-client":
        nodes = [{"data-dir": str(folder)} for folder in reversed(folders)]
    elif layout == "one-node":
        nodes = [{"data-dir": str(data)}]
    else:  # two nodes, each with some of the client folders as subfolders
        for i, folder in enumerate(folders):
            shutil.move(folder, tmp_path / f"node-{i % 2}" / folder.name)
        nodes = [{"data-dir": str(tmp_path / f"node-{i}")} for i in range(2)]
    local = simulate({**keys, "run-name": "local"}, node_configs=nodes)
    assert rounds(tmp_path / "local") == rounds(tmp_path / "partitioned")
    return partitioned, local


@pytest.mark.parametrize("case, layout", [
    ("fedavg", "per-client"), ("sfl-star", "two-nodes"), ("flt", "one-node"),
    ("fedska", "two-nodes"), ("fedcg", "per-client")])
def test_exported_folders_give_the_partitioned_numbers_bit_for_bit(tmp_path, case, layout):
    partitioned, local = partitioned_and_local(tmp_path, case, layout)
    assert comparable(local) == comparable(partitioned)
    with (tmp_path / "local" / "clients.csv").open() as handle:
        names = [row["name"] for row in csv.DictReader(handle)]
    assert names == [f"client-{i:03d}" for i in range(BASE["num-clients"])]


def test_export_writes_the_clients_arrays_and_domains_exactly(tmp_path):
    keys = {**BASE, **CASES["fedcg"]}
    cfg = config(**keys)
    folders = export(cfg, tmp_path)
    data = load_client_data(cfg.data_spec, 1)
    with np.load(folders[1] / "train.npz") as raw:
        assert np.array_equal(raw["x"], data.train_x.numpy())
        assert np.array_equal(raw["domain"], data.train_domains.numpy())
        assert raw["group"].shape == raw["y"].shape


def test_a_bad_client_is_left_out_and_the_run_goes_on(tmp_path, tiny_run, caplog):
    root = tmp_path / "site"
    for name in ("a", "b"):
        write_npz(root / name / "data.npz", 30)
    (root / "c").mkdir()
    np.savez(root / "c" / "data.npz", x=np.zeros((5, 28, 28), np.float32), y=np.zeros(5, int))
    (root / "d").mkdir()  # empty
    summary = simulate({**tiny_run, "num-clients": 4}, node_configs=[{"data-dir": str(root)}])
    left = {row["name"]: row for row in summary["left-out-clients"]}
    assert sorted(left) == ["c", "d"] and left["c"]["client-id"] == 2
    assert "x has shape [5, 28, 28]" in left["c"]["reason"] and "node 1000" in left["c"]["reason"]
    assert summary["final"]["round"] == 2  # the others trained and were evaluated to the end
    assert "cannot use the data of client 'c'" in caplog.text
    with (Path(tiny_run["output-dir"]) / tiny_run["run-name"] / "clients.csv").open() as handle:
        rows = {row["name"]: row for row in csv.DictReader(handle)}
    assert rows["a"]["accuracy"] and not rows["d"]["accuracy"]
    assert "no data found for client 'd'" in rows["d"]["left-out"] and not rows["a"]["left-out"]


def test_more_names_than_num_clients_is_an_error_naming_them(tmp_path, tiny_run):
    from server_app.clients import ClientSetError

    for name in ("a", "b", "c"):
        write_npz(tmp_path / "s" / name / "d.npz", 10)
    with pytest.raises(ClientSetError, match=r"announced 3 clients \(a, b, c\) but num-clients = 2"):
        simulate({**tiny_run, "num-clients": 2}, node_configs=[{"data-dir": str(tmp_path / "s")}])


def test_the_export_command_takes_run_config_keys(tmp_path, capsys):
    from client_app.export import main

    assert main(["--dataset", "digits", "--partition", "label-clusters", "--num-clients", "3",
                 "--num-clusters", "2", "--seed", "1", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bouquet-export.json", "client-000", "client-001", "client-002"]
    assert json.loads((tmp_path / "bouquet-export.json").read_text())["seed"] == 1
    assert [c.name for c in discover(str(tmp_path))] == ["client-000", "client-001", "client-002"]
    with pytest.raises(SystemExit):
        main(["--num-clients", "0", "--out", str(tmp_path / "x")])
    assert "num-clients" in capsys.readouterr().err
