"""End to end through Flower's own runtime: `flwr run` against a simulation SuperLink we start.

The SuperLink is started here (its own FLWR_HOME, free ports) and stopped by the PID we started, so
the test neither depends on nor disturbs any SuperLink a user has running.
"""

import json

import pytest

from tests.simulation_superlink import flwr as _flwr
from tests.simulation_superlink import run_id as _run_id
from tests.simulation_superlink import run_status as _run_status
from tests.simulation_superlink import simulation_superlink

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    with simulation_superlink(tmp_path_factory.mktemp("flwr-home")) as env:
        yield env


def test_flwr_run_trains_and_writes_results(superlink, tmp_path):
    result = _flwr(
        superlink, "run", ".", "e2e", "--stream", "--federation-config", "num-supernodes=2",
        "--run-config",
        f"num-clients=4 num-rounds=2 dataset='digits' model='mclr' partition='iid' "
        f"max-samples-per-client=200 output-dir='{tmp_path}' run-name='e2e'",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    status = _run_status(superlink, _run_id(result.stdout))
    assert status["status"] == "finished:completed", status
    out = tmp_path / "e2e"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num-clients"] == 4
    assert summary["final"]["personalized"]["mean"] > summary["round-0"]["personalized"]["mean"]
    assert len((out / "rounds.jsonl").read_text().splitlines()) == 3
    assert "Bouquet run summary" in result.stdout


def test_invalid_run_config_fails_the_run_with_one_line(superlink, tmp_path):
    result = _flwr(
        superlink, "run", ".", "e2e", "--stream", "--federation-config", "num-supernodes=2",
        "--run-config", f"num-rounds=0 output-dir='{tmp_path}' run-name='bad'",
    )
    status = _run_status(superlink, _run_id(result.stdout))
    assert status["status"] == "finished:failed", status
    assert "run config: key 'num-rounds' = 0 is invalid" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr  # the one line, no traceback after it
    assert "run failed (Flower exit code 700): see the error above" in result.stdout
    assert not (tmp_path / "bad").exists()  # nothing was started or written
