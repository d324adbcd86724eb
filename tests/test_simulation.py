"""Whole federations in one process (real ClientApp and strategies over the in-process grid)."""

import csv
import json

import pytest
from flwr.app import Message

from client_app.app import app as client_app
from server_app.app import run
from strategies.shared.run_config import RunConfig
from server_app.harness.local_grid import LocalGrid
from server_app.harness.simulate import simulate
from strategies.shared.run_config import default_run_config
from strategies.shared.messages import CLIENT

pytestmark = pytest.mark.federation  # every test here runs whole in-process federations


def test_fedavg_accuracy_rises_above_round_zero_on_mnist(tmp_path):
    summary = simulate({
        "method": "fedavg", "dataset": "mnist", "partition": "iid", "model": "mclr",
        "num-clients": 5, "num-rounds": 3, "max-samples-per-client": 300, "finetune-epochs": 0,
        "output-dir": str(tmp_path), "run-name": "fedavg",
    }, num_nodes=2)
    assert summary["round-0"]["global-accuracy"] < 25.0  # an untrained 10-class model
    assert summary["final"]["global-accuracy"] > summary["round-0"]["global-accuracy"] + 40.0
    rounds = [json.loads(line) for line in (tmp_path / "fedavg" / "rounds.jsonl").open()]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert all(r["clients-trained"] == 5 for r in rounds[1:])


def test_local_beats_fedavg_global_model_on_shards_q2(tmp_path):
    common = {
        "dataset": "mnist", "partition": "shards", "shards-per-client": 2, "model": "mclr",
        "num-clients": 10, "num-rounds": 3, "max-samples-per-client": 300, "finetune-epochs": 0,
        "output-dir": str(tmp_path),
    }
    local = simulate({**common, "method": "local", "run-name": "local"}, num_nodes=2)
    fedavg = simulate({**common, "method": "fedavg", "run-name": "fedavg"}, num_nodes=2)
    assert "global-accuracy" not in local["final"]  # local has no global model
    assert local["final"]["personalized"]["mean"] > fedavg["final"]["global-accuracy"] + 20.0
    assert local["final"]["personalized"]["worst-5%"] > fedavg["final"]["personalized"]["worst-5%"]


def test_outputs_are_written(tiny_run, tmp_path):
    simulate({**tiny_run, "method": "ditto", "finetune-epochs": 1})
    out = tmp_path / "run"
    config = json.loads((out / "config.json").read_text())
    assert config["method"] == "ditto" and config["num-clients"] == 4
    assert len((out / "rounds.jsonl").read_text().splitlines()) == 3
    rows = list(csv.DictReader((out / "clients.csv").open()))
    assert [int(r["client-id"]) for r in rows] == [0, 1, 2, 3]
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 and int(r["bytes-down"]) > 0 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["final"]) >= {"personalized", "global-accuracy", "finetuned"}
    assert summary["bytes-per-round"] > 0 and summary["seconds-per-round"] > 0
    assert (out / "accuracy.png").stat().st_size > 1000


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "local", "ditto"])
def test_every_method_learns(method, tiny_run):
    summary = simulate({**tiny_run, "method": method, "num-rounds": 3})
    assert summary["final"]["personalized"]["mean"] > summary["round-0"]["personalized"]["mean"] + 20


def test_same_seed_same_numbers(tiny_run, tmp_path):
    first = simulate({**tiny_run, "method": "fedprox", "fraction-train": 0.5, "run-name": "a"})
    second = simulate({**tiny_run, "method": "fedprox", "fraction-train": 0.5, "run-name": "b"})
    assert first["final"] == second["final"]
    rounds = [(tmp_path / name / "rounds.jsonl").read_text().splitlines() for name in "ab"]
    strip = lambda line: {k: v for k, v in json.loads(line).items() if k != "seconds"}  # noqa: E731
    assert [strip(x) for x in rounds[0]] == [strip(x) for x in rounds[1]]


def test_bytes_are_counted_from_the_records_sent(tiny_run, tmp_path):
    simulate({**tiny_run, "method": "local", "num-clients": 2, "num-rounds": 1})
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").open()]
    # mclr on 1×28×28: 784·64 + 64 + 64·10 + 10 float32 = 50890 floats ≈ 203.6 kB per model
    model_bytes = 50890 * 4
    one = rounds[1]
    # down: personal model for train + personal model for evaluate; up: the trained model
    assert one["bytes-down-per-client"] == pytest.approx(2 * model_bytes, rel=0.01)
    assert one["bytes-up-per-client"] == pytest.approx(model_bytes, rel=0.01)


def test_a_crashing_client_is_skipped_and_the_run_completes(tiny_run, caplog):
    def flaky(message: Message, context):
        if message.metadata.message_type == "train" and message.content[CLIENT]["client-id"] == 1:
            raise RuntimeError("disk full")
        return client_app(message, context)

    run_config = {**default_run_config(), **tiny_run, "method": "fedavg"}
    summary = run(LocalGrid(flaky, 2, run_config), RunConfig.from_flower(run_config))
    assert summary["final"]["personalized"]["mean"] > 0
    rounds = [json.loads(line) for line in open(f"{tiny_run['output-dir']}/run/rounds.jsonl")]
    assert all(r["failed-clients"] == [1] and r["clients-trained"] == 3 for r in rounds[1:])
    assert "train: client 1 failed and is skipped" in caplog.text
    assert "disk full" in caplog.text
