"""Every method's short fixed-seed run gives the recorded numbers, round by round, value for value
(see `tests/method_runs.py`): restructuring code must not move a result."""

import json

import pytest

from method_runs import CASES, GOLDEN, differences, run_case

pytestmark = pytest.mark.federation

RECORDED = json.loads(GOLDEN.read_text())


def test_every_method_has_a_recorded_run():
    assert sorted(RECORDED) == sorted(CASES)


@pytest.mark.parametrize("method", sorted(CASES))
def test_short_run_reproduces_the_recorded_numbers(method, tmp_path):
    rounds = run_case(method, tmp_path)
    assert [r["round"] for r in rounds] == [r["round"] for r in RECORDED[method]]
    for got, want in zip(rounds, RECORDED[method]):
        problems = differences(got, want)
        assert not problems, f"{method} round {want['round']}: " + "; ".join(problems)


def test_the_comparison_tells_numbers_from_ids():
    """Floats compare within tolerance; counts, names and client-id lists compare exactly."""
    want = {"round": 1, "personalized": {"mean": 50.0}, "failed-clients": [], "phases": 1}
    assert differences({**want, "personalized": {"mean": 50.0 + 1e-8}}, want) == []
    assert differences({**want, "personalized": {"mean": 50.1}}, want) == ["personalized/mean: 50.1 != 50.0"]
    assert differences({**want, "failed-clients": [3]}, want) == ["failed-clients: [3] != []"]
    assert differences({**want, "phases": 2}, want) == ["phases: 2 != 1"]
    assert differences({**want, "phases": 1.0}, want) == ["phases: 1.0 != 1"]
    losses = {**want, "loss": [0.5, 0.25]}
    assert differences({**losses, "loss": [0.5, 0.25 + 1e-9]}, losses) == []
    assert differences({**losses, "loss": [0.5, 0.26]}, losses) == ["loss: [0.5, 0.26] != [0.5, 0.25]"]
    assert differences({**losses, "loss": [0.5]}, losses) == ["loss: [0.5] != [0.5, 0.25]"]
    offsets = {**want, "fedcg": {"balance": {"offset": [-0.3056, 0.340346]}}}
    assert differences({**offsets, "fedcg": {"balance": {"offset": [-0.30561, 0.340356]}}}, offsets) == []
    assert differences({**offsets, "fedcg": {"balance": {"offset": [-0.3056, 0.3404]}}}, offsets) == [
        "fedcg/balance/offset: [-0.3056, 0.3404] != [-0.3056, 0.340346]"]  # 1.6e-4: beyond LOOSE
    assert differences({"round": 1}, want) == ["failed-clients: missing", "personalized/mean: missing",
                                               "phases: missing"]
