"""The accountant's cache (strategies/shared/privacy.py `epsilon`): ε is Opacus' `RDPAccountant.
get_epsilon` of the same history, bit for bit, whether the cache is cold or warm, and one step's RDP
is computed once per (noise multiplier, sampling rate), however many rounds and clients ask."""

from __future__ import annotations

import random

import pytest

from strategies.shared import privacy
from strategies.shared.privacy import epsilon, steps_within


def _opacus(history, delta: float) -> float:
    """ε as the accountant computed it before the cache: a fresh RDPAccountant per call."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(float(s), float(q), int(k)) for s, q, k in history if k > 0]
    return float(accountant.get_epsilon(delta=delta)) if accountant.history else 0.0


def _histories() -> list[tuple[list[tuple[float, float, int]], float]]:
    draw = random.Random(7)
    rates = [1.0, 0.5, 1 / 3, 1 / 7, 1 / 19, 0.013]
    out = [([(1.1, 0.5, 10)], 1e-3), ([(3.0 / 2, 1.0, 4)], 1e-5), ([], 1e-3),
           ([(1.0, 0.25, 0)], 1e-3),  # zero steps: no entry
           ([(1.0657, 1 / 7, 42), (1.0657, 1 / 7, 7), (0.5, 1.0, 3)], 1e-5)]  # unmerged, in order
    for _ in range(40):
        history = [(round(draw.uniform(0.4, 5.0), 4), draw.choice(rates), draw.randint(1, 400))
                   for _ in range(draw.randint(1, 3))]
        out.append((history, draw.choice([1e-3, 1e-5, 1e-6])))
    return out


def test_epsilon_is_opacus_get_epsilon_bit_for_bit_cold_and_warm():
    privacy._epsilon.cache_clear()
    privacy._step_rdp.cache_clear()
    cases = _histories()
    cold = [epsilon(history, delta) for history, delta in cases]
    warm = [epsilon(history, delta) for history, delta in cases]
    expected = [_opacus(history, delta) for history, delta in cases]
    assert cold == expected and warm == expected  # exact equality, not approx
    assert privacy._epsilon.cache_info().hits >= len(cases) - 2  # the warm pass (two are empty)
    # the same ledger grown by a round's steps: the one-step RDP is reused, the ε is exact
    grown = [(1.1, 0.5, 10 * r) for r in range(1, 30)]
    assert [epsilon([entry], 1e-3) for entry in grown] == [_opacus([entry], 1e-3) for entry in grown]


def test_one_steps_rdp_is_computed_once_per_noise_and_rate(monkeypatch):
    from opacus.accountants.analysis import rdp as analysis

    privacy._epsilon.cache_clear()
    privacy._step_rdp.cache_clear()
    calls = []
    original = analysis.compute_rdp

    def counting(**kwargs):
        calls.append((kwargs["noise_multiplier"], kwargs["q"], kwargs["steps"]))
        return original(**kwargs)

    monkeypatch.setattr(analysis, "compute_rdp", counting)
    for rounds in range(1, 11):  # ten rounds, twelve clients with two train sizes, a target search
        for client in range(12):
            rate = 1 / 7 if client % 2 else 1 / 5
            ledger = [(1.0657, rate, 7 * rounds), (0.53285, 1.0, rounds)]
            epsilon(ledger, 1e-5)
            steps_within(ledger, 1.0657, rate, 7, 1e-5, 8.0)
    assert sorted(set(calls)) == sorted(calls)  # no schedule computed twice
    assert sorted(calls) == sorted([(1.0657, 1 / 7, 1), (1.0657, 1 / 5, 1), (0.53285, 1.0, 1)])


@pytest.mark.parametrize("target", [0.0, 3.0, 8.0, 50.0])
def test_steps_within_a_target_are_those_of_the_uncached_accountant(target):
    history = [(1.0657, 1 / 7, 35), (0.53285, 1.0, 2)]
    found = steps_within(history, 1.0657, 1 / 7, 70, 1e-5, target)
    if target <= 0:
        assert found == 70
        return
    if found > 0:
        assert _opacus([*history, (1.0657, 1 / 7, found)], 1e-5) <= target
    if found < 70:
        assert _opacus([*history, (1.0657, 1 / 7, found + 1)], 1e-5) > target
