"""Benchmarks on Ray workers (`--workers` / `--ray`): every number equals the serial run's, bit for bit."""

import dataclasses
import json

import pytest

from benchmarks.compare import compare
from benchmarks.compare import main as compare_main
from benchmarks.parallel import Placement, without_timings
from benchmarks.suite import SETTINGS, run_suite

TINY = {"dataset": "digits", "model": "mclr", "num-clients": 4, "num-rounds": 2,
        "max-samples-per-client": 100, "finetune-epochs": 0, "checkpoint-every": 0}


def test_without_timings_drops_wall_times_and_keeps_every_number():
    summary = {"final": {"mean": 50.0}, "wall-seconds": 1.2, "seconds-per-round": 0.3,
               "curve": [{"round": 1, "seconds": 0.1, "personalized-mean": 40.0}],
               "sfl-aggregation-seconds": 0.01}
    assert without_timings(summary) == {"final": {"mean": 50.0},
                                        "curve": [{"round": 1, "personalized-mean": 40.0}]}


def test_placement_flags_are_exclusive_and_checked(capsys):
    with pytest.raises(SystemExit):
        compare_main(["--methods", "fedavg", "--name", "x", "--workers", "2", "--ray", "auto"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare_main(["--methods", "fedavg", "--name", "x", "--workers", "-1"])
    assert "--workers must be >= 0, got -1" in capsys.readouterr().err
    assert Placement().serial and not Placement(workers=2).serial


@pytest.mark.slow
@pytest.mark.federation
def test_compare_and_suite_on_two_ray_workers_equal_the_serial_runs(tmp_path):
    overrides = {**TINY, "partition": "iid"}
    methods = ["fedavg", "sfl"]
    serial = compare(methods, overrides, "tiny", results_dir=tmp_path / "s", runs_dir=tmp_path / "sr")
    ray = compare(methods, overrides, "tiny", results_dir=tmp_path / "r", runs_dir=tmp_path / "rr",
                  placement=Placement(workers=2))
    assert [s["method"] for s in ray] == methods
    assert without_timings(ray) == without_timings(serial)
    assert ray[1]["final"]["personalized"]["mean"] > ray[1]["round-0"]["personalized"]["mean"]
    for method in methods:  # every client's final numbers, byte for byte
        assert ((tmp_path / "rr" / method / "clients.csv").read_bytes()
                == (tmp_path / "sr" / method / "clients.csv").read_bytes())

    grid = ([SETTINGS["shards"]], [1.0, 0.5], [0], ["fedavg", "local"], TINY)
    cells = run_suite(*grid, tmp_path / "suite-s", tmp_path / "runs-s", "serial", fedcg=False)
    on_ray = run_suite(*grid, tmp_path / "suite-r", tmp_path / "runs-r", "ray", fedcg=False,
                       placement=Placement(workers=2))
    assert [(c.rho, c.label) for c in on_ray] == [(1.0, "fedavg"), (1.0, "local"),
                                                   (0.5, "fedavg"), (0.5, "local")]
    assert ([without_timings(dataclasses.asdict(c)) for c in on_ray]
            == [without_timings(dataclasses.asdict(c)) for c in cells])
    stored = json.loads((tmp_path / "suite-r" / "suite.json").read_text())
    assert len(stored["results"]) == 4
