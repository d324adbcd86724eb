"""The per-client safeguard of the graph methods: no regret against training alone.

A graph method hands each client a model built from other clients (its graph aggregate, and for some
methods a global model too). Where clients share no structure that model can be worse than the
client's own. With the safeguard on (run config `safeguard = "mix"`; the instructions carry
`safeguard-holdout` and `safeguard-grid`), every client

1. holds out a fixed slice of its train split (`safeguard-holdout`, at least one sample; the same slice
   every round: a seeded permutation of (seed, client id)) and trains only on the rest;
2. keeps its own model, the one it last trained, in its node's `context.state`;
3. on receiving the method's model(s), tests the mixes (1 − a)·own + a·received for a on a grid of
   `safeguard-grid` points in [0, 1] (for each received model) on the held-out slice, and takes the
   best (accuracy, then loss; ties go to the larger a, toward the method's model). Training starts
   from that mix; evaluation tests it.

Before a client has trained once, or with the safeguard off, it uses the received model unchanged:
the paper's behaviour. The choice is computed once per received model: the evaluation that a fused
message carries and the training after it receive the same model and reuse it (cached by a digest
of the received records and the own model's version). The cost is the forward passes over the
held-out slice, `grid` per received model (default 10 % × 5 = half a pass over the train split),
once per client and round; no byte is added to what server and clients exchange.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context

from client_app.runtime import ClientRuntime, model_record
from client_app.training import evaluate, seeded_generator

_HOLDOUT_STREAM = 13  # seeded_generator purpose id of the held-out permutation
OWN = "safeguard.own.{}"  # context.state: the client's own (last trained) model
CHOICE = "safeguard.choice.{}"  # context.state: the last choice and what it was made for


@dataclass(frozen=True)
class Choice:
    """The chosen start: which received model was mixed in (`source`, "" = none) and its weight `a`
    (1 − a on the own model)."""

    source: str
    weight: float

    @property
    def own_weight(self) -> float:
        return 1.0 - self.weight if self.source else 0.0


def holdout_index(num_samples: int, fraction: float, seed: int, client: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train indices, held-out indices) of a train split of `num_samples`: a seeded permutation of
    (seed, client), the first ⌈fraction·n⌉ held out (at least 1, never all; none for n < 2)."""
    if num_samples < 2:
        return torch.arange(num_samples), torch.arange(0)
    order = torch.randperm(num_samples, generator=seeded_generator(seed, client, _HOLDOUT_STREAM))
    held = min(max(1, math.ceil(fraction * num_samples)), num_samples - 1)
    return torch.sort(order[held:]).values, torch.sort(order[:held]).values


def enabled(ins) -> bool:
    """Whether the instructions turn the safeguard on (they carry `safeguard-holdout`)."""
    return getattr(ins, "safeguard_holdout", None) is not None


def train_index(rt: ClientRuntime, ins) -> torch.Tensor | None:
    """The train-split indices a client trains on: all (None) with the safeguard off, the part
    outside the held-out slice with it on."""
    if not enabled(ins):
        return None
    return holdout_index(len(rt.data.train_y), ins.safeguard_holdout, ins.seed, rt.client_id)[0]


def training_tensors(rt: ClientRuntime, ins) -> tuple[torch.Tensor, torch.Tensor]:
    """The (x, y) a client trains on (`train_index`)."""
    x, y = rt.tensors("train")
    index = train_index(rt, ins)
    if index is None:
        return x, y
    index = index.to(x.device)
    return x[index], y[index]


def own_model(context: Context, client: int) -> ArrayRecord | None:
    """The client's own model: the one it last trained (None before its first training)."""
    key = OWN.format(client)
    return context.state[key] if key in context.state.array_records else None


def keep_own(context: Context, client: int, model: torch.nn.Module, ins) -> None:
    """Remember the model a client just trained as its own (only with the safeguard on)."""
    if not enabled(ins):
        return
    context.state[OWN.format(client)] = model_record(model)
    version = CHOICE.format(client) + ".version"
    previous = context.state.config_records.get(version)
    count = int(previous["n"]) + 1 if previous is not None else 1
    context.state[version] = ConfigRecord({"n": count})


def _digest(record: ArrayRecord) -> str:
    h = hashlib.blake2b(digest_size=16)
    for key, array in record.items():
        h.update(key.encode())
        h.update(np.ascontiguousarray(array.numpy()).tobytes())
    return h.hexdigest()


def mix(own: Mapping[str, torch.Tensor], other: Mapping[str, torch.Tensor],
        weight: float) -> dict[str, torch.Tensor]:
    """(1 − weight)·own + weight·other for floating tensors; other tensors (counters) from `other`."""
    out = {}
    for key, value in other.items():
        base = own[key]
        if value.is_floating_point():
            out[key] = torch.lerp(base.to(value.dtype), value, weight)
        else:
            out[key] = value
    return out


def grid(points: int) -> list[float]:
    """The weights a of the received model: `points` evenly spaced in [0, 1]."""
    return [i / (points - 1) for i in range(points)]


def choose(rt: ClientRuntime, context: Context, ins,
           received: Mapping[str, ArrayRecord]) -> tuple[ArrayRecord, Choice]:
    """The model a client starts from / uses: the first of `received` (the method's model) with the
    safeguard off or no own model yet; otherwise the best mix on the held-out slice (module doc)."""
    first = next(iter(received))
    own = own_model(context, rt.client_id) if enabled(ins) else None
    if own is None:
        return received[first], Choice("", 1.0)
    choice = _search(rt, context, ins, own, received)
    if choice.weight == 1.0:
        return received[choice.source], choice
    mixed = mix(own.to_torch_state_dict(), received[choice.source].to_torch_state_dict(),
                choice.weight)
    return ArrayRecord(mixed), choice


def _search(rt: ClientRuntime, context: Context, ins, own: ArrayRecord,
            received: Mapping[str, ArrayRecord]) -> Choice:
    """Test the mixes on the held-out slice; the best by (accuracy, −loss; regression: −loss), ties
    to larger weights and to the earlier received model. Scores are cached in `context.state` per
    received model (by digest) until the own model changes, so a model received twice (a fused
    evaluation, then training) is tested once."""
    key = CHOICE.format(rt.client_id)
    version = context.state.config_records.get(key + ".version")
    version = int(version["n"]) if version is not None else 0
    cache = context.state.config_records.get(key)
    scores = dict(cache) if cache is not None and int(cache["version"]) == version else {}
    scores["version"] = version
    x, y = rt.tensors("train")
    _, held = holdout_index(len(y), ins.safeguard_holdout, ins.seed, rt.client_id)
    held = held.to(x.device)
    xv, yv = x[held], y[held]
    own_state = own.to_torch_state_dict()
    model = rt.model(own)

    def score(state: Mapping[str, torch.Tensor]) -> list[float]:
        model.load_state_dict(state)
        result = evaluate(model, xv, yv, ins.batch_size)
        return [-result.loss] if y.is_floating_point() else [result.accuracy, -result.loss]

    if "own" not in scores:
        scores["own"] = score(own_state)
    best, best_key = Choice(next(iter(received)), 0.0), (*scores["own"], 0.0)
    for name, record in received.items():
        digest = _digest(record)
        if digest not in scores:  # [a, score...] of the best weight for this model
            other = record.to_torch_state_dict()
            top = None
            for a in grid(ins.safeguard_grid)[1:]:
                candidate = (*score(mix(own_state, other, a)), a)
                if top is None or candidate > top:
                    top = candidate
            scores[digest] = [top[-1], *top[:-1]]
        a, *value = scores[digest]
        candidate = (*value, a)
        if candidate > best_key:  # strict: an equal key keeps the earlier model
            best, best_key = Choice(name, float(a)), candidate
    context.state[key] = ConfigRecord(scores)
    return best
