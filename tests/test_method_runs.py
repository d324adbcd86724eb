"""Every method's short fixed-seed run gives the recorded numbers, round by round, value for value
(see `tests/method_runs.py`): restructuring code must not move a result."""

import json

import pytest

from method_runs import CASES, GOLDEN, flatten, run_case

pytestmark = pytest.mark.federation

RECORDED = json.loads(GOLDEN.read_text())


def test_every_method_has_a_recorded_run():
    assert sorted(RECORDED) == sorted(CASES)


@pytest.mark.parametrize("method", sorted(CASES))
def test_short_run_reproduces_the_recorded_numbers(method, tmp_path):
    rounds = run_case(method, tmp_path)
    assert [r["round"] for r in rounds] == [r["round"] for r in RECORDED[method]]
    for got, want in zip(rounds, RECORDED[method]):
        assert flatten(got) == pytest.approx(flatten(want), rel=1e-6, abs=1e-9), f"{method} round {want['round']}"
