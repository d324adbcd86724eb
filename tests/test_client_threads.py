"""client-threads=0 under `flwr run`: one torch thread per simulated SuperNode's ClientApp (a Ray
actor), torch's default elsewhere (client_app/runtime.py)."""

from __future__ import annotations

import sys
import types

import pytest

from client_app import runtime
from strategies.shared.run_config import RunConfig, default_run_config


def _cfg(threads: int) -> RunConfig:
    return RunConfig.from_flower({**default_run_config(), "client-threads": threads})


def _fake_ray(actor_id: str | None) -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: True
    context = types.SimpleNamespace(get_actor_id=lambda: actor_id)
    ray.get_runtime_context = lambda: context
    return ray


@pytest.fixture(autouse=True)
def _fresh_cache():
    runtime.in_simulation_actor.cache_clear()
    yield
    runtime.in_simulation_actor.cache_clear()


def test_outside_ray_zero_leaves_torch_default(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert not runtime.in_simulation_actor()
    assert runtime.client_threads(_cfg(0)) == 0
    assert runtime.client_threads(_cfg(3)) == 3


def test_in_a_ray_actor_zero_means_one_thread(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", _fake_ray("actor-1"))
    assert runtime.in_simulation_actor()
    assert runtime.client_threads(_cfg(0)) == 1
    assert runtime.client_threads(_cfg(2)) == 2  # an explicit setting wins


def test_a_ray_driver_is_not_an_actor(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(None))
    assert not runtime.in_simulation_actor()
    assert runtime.client_threads(_cfg(0)) == 0
