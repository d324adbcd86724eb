"""The server-memory benchmark's arithmetic (benchmarks/studies/server_memory.py)."""

import pytest

from benchmarks.studies.server_memory import limit, status_bytes


def test_the_budget_is_reached_where_the_fitted_curve_crosses_it():
    curve = lambda n: 1.0 + 0.002 * n + 1e-7 * n * n  # noqa: E731
    points = [{"clients": n, "peak-gib": curve(n)} for n in (100, 1000, 3000)]
    coeffs, largest = limit(points, 24.0)
    assert coeffs == pytest.approx([1e-7, 0.002, 1.0], rel=1e-6)
    assert curve(largest) <= 24.0 < curve(largest + 1)


def test_status_fields_are_read_in_bytes():
    assert status_bytes("VmHWM") >= status_bytes("RssAnon") > 0
    with pytest.raises(KeyError):
        status_bytes("NoSuchField")
