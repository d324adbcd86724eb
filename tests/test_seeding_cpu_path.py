"""`client_app.seeding.seed_torch`: torch.manual_seed's draws, without its accelerator half where no
accelerator is available (the per-message seeding of every ClientApp message)."""

from __future__ import annotations

import torch

import client_app.seeding as seeding


def _draws_after(seed_fn, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    seed_fn(seed)
    state = torch.get_rng_state()
    return state, torch.rand(5)


def test_seed_torch_leaves_the_same_generator_state_as_manual_seed():
    for seed in (0, 7, 2**62 + 12345):
        state, values = _draws_after(torch.manual_seed, seed)
        ours, our_values = _draws_after(seeding.seed_torch, seed)
        assert torch.equal(state, ours) and torch.equal(values, our_values)
    # and another seed gives other draws (the comparison can fail)
    assert not torch.equal(_draws_after(seeding.seed_torch, 1)[1], _draws_after(seeding.seed_torch, 2)[1])


def _spy(monkeypatch, available: bool) -> list[int]:
    calls: list[int] = []
    real = torch.manual_seed
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: available)
    monkeypatch.setattr(torch, "manual_seed", lambda seed: calls.append(seed) or real(seed))
    return calls


def test_seed_torch_seeds_every_device_where_an_accelerator_is_available(monkeypatch):
    calls = _spy(monkeypatch, available=True)
    seeding.seed_torch(42)
    assert calls == [42]


def test_seed_torch_skips_the_accelerator_queue_where_none_is_available(monkeypatch):
    calls = _spy(monkeypatch, available=False)
    seeding.seed_torch(42)
    assert calls == [] and torch.initial_seed() == 42
