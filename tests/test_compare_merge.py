"""`benchmarks.compare --config ... --methods`: a subset of a cell's methods adds to the cell's results
file (the methods it does not re-run are kept, in the cell's order), and is refused before it runs
when the file ran other settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.compare import main

CONFIG = """
methods = ["local", "fedavg", "fedprox"]
seeds = [0]
[common]
dataset = "digits"
model = "mclr"
partition = "label-clusters"
num-clusters = 2
labels-per-cluster = 5
num-clients = 4
num-rounds = 1
max-samples-per-client = 60
fraction-train = 1.0
[[cells]]
name = "small"
set = { lr = 0.05 }
"""


def _run(tmp_path: Path, methods: str, *extra: str, runs: str = "runs") -> dict:
    config = tmp_path / "table.toml"
    config.write_text(CONFIG)
    argv = ["--config", str(config), "--cells", "small", "--methods", methods,
            "--results-dir", str(tmp_path / "results"), "--runs-dir", str(tmp_path / runs), *extra]
    assert main(argv) == 0
    return json.loads((tmp_path / "results" / "table-small-seed0.json").read_text())


def test_a_method_subset_adds_to_the_cells_results_file(tmp_path: Path) -> None:
    first = _run(tmp_path, "fedprox")
    assert first["methods"] == ["fedprox"] and "parts" not in first
    both = _run(tmp_path, "local")
    assert both["methods"] == ["local", "fedprox"]  # the cell's order
    assert both["summaries"][1] == first["summaries"][0]  # kept as it was
    assert [p["methods"] for p in both["parts"]] == [["fedprox"], ["local"]]
    assert both["command"] == " && ".join(p["command"] for p in both["parts"])
    assert "--methods fedprox" in both["command"] and "--methods local" in both["command"]
    md = (tmp_path / "results" / "table-small-seed0.md").read_text()
    assert "| local |" in md and "| fedprox |" in md
    assert f"- run in parts: fedprox on {first['date']}" in md and f"; local on {both['date']}" in md
    # re-running a method replaces it (and its part) only
    again = _run(tmp_path, "fedprox,fedavg", runs="runs-again")
    assert again["methods"] == ["local", "fedavg", "fedprox"]
    assert [p["methods"] for p in again["parts"]] == [["local"], ["fedavg", "fedprox"]]
    assert again["summaries"][0] == both["summaries"][0]
    # the same method, the same settings and seed: the same numbers as its first run
    assert again["summaries"][2]["final"] == first["summaries"][0]["final"]


def test_other_settings_are_refused_before_running(tmp_path: Path, capsys) -> None:
    _run(tmp_path, "local")
    with pytest.raises(SystemExit):
        _run(tmp_path, "fedavg", "--set", "num-rounds=2")
    assert "num-rounds = 1 (now 2)" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "table-small-seed0" / "fedavg").exists()
