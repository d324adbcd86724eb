"""The safeguard's purely local candidate: a model each client trains on its own data alone.

Where the safeguard compares a client's models on its held-out slice (client_app/safeguard.py), every
candidate it has is pulled toward what the client received: the mixes of its own model with the
received one, and its own model, which each evaluation fine-tunes from the chosen mix. Where the
federation hands every client its consensus (FLT on the complete graph) and the clients' data
differ, that can leave a client below training alone, the Local baseline. This module adds the
candidate that is missing: a **local model**, kept in the node's `context.state`, that starts from the
run's initial model (the one every method starts from, `initial_record`), trains only on the client's
own train split outside its held-out slice, continuing from itself every round the client is sampled
for training, and never takes anything from the consensus.

Decision (`answer`). At each evaluation the client scores the local model on its held-out slice
against the model it would answer with otherwise (the chosen mix or its fine-tuned version). The
reference is that answer, or the local model where the server says the federation's pooled evidence
favours it (`SafeguardInstructions.local`); the client leaves the reference only where its own
per-sample gains are `margin` standard errors above zero (`clearly_better`, as every other departure
from the federation's model), and with no margin in the record where the other model scores better
(accuracy, then loss). It reports the local model's summed per-sample gains over the other answer,
and their squares, for the server to pool (`strategies.shared.local_evidence.LocalEvidence`), and
whether it answered with the local model.

Scope (run config `safeguard-local`): `consensus` (default), only where the record carries a margin,
which the server sends only while the strategy hands every client the consensus; `all`, every client
of a method with the safeguard on; `off`, never (the behaviour before this candidate).

Cost per client: one more model in `context.state`; `local-epochs` epochs on the train split less the
slice each round the client is sampled (the same local computation again: training cost doubles on
that path); one forward pass of the local model over the held-out slice and one over the test split (for the
reported `local-accuracy`) per evaluation. Nothing more
is downloaded; the model never leaves the client; the evaluate reply carries three more numbers
(the summed gains, their squares, which model answered, and the local model's test accuracy).
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context

import torch

from client_app import safeguard as sg
from client_app.safeguard_consensus import evidence
from client_app.runtime import ClientRuntime, model_record
from client_app.training import (LOCAL_TRAINER, Evaluation, seeded_generator,
                                 seeded_generator_seed, train_epochs)
from client_app.training import evaluate as test_model
from models import build_model
from strategies.shared.evidence import SafeguardInstructions, clearly_better

LOCAL = "safeguard.local.{}"  # context.state: the client's purely local model
_LOCAL_STREAM = 15  # seeded_generator purpose id of the local model's batch order


def active(rt: ClientRuntime, guard: SafeguardInstructions) -> bool:
    """Whether this request's client keeps and considers the local candidate (`safeguard-local`)."""
    scope = rt.cfg.safeguard_local
    return scope == "all" or (scope == "consensus" and guard.margin is not None)


def local_model(context: Context, client: int) -> ArrayRecord | None:
    """The client's local model (None before it first trained one)."""
    key = LOCAL.format(client)
    return context.state[key] if key in context.state.array_records else None


def initial_record(rt: ClientRuntime) -> ArrayRecord:
    """The run's round-0 model (the server's `initial_arrays`: the backbone built after
    `torch.manual_seed(seed)`), built without touching this process's random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rt.cfg.seed)
        model = build_model(rt.cfg.model, rt.data.input_shape, rt.data.num_classes)
    return model_record(model)


def train_local(rt: ClientRuntime, context: Context, ins, guard: SafeguardInstructions) -> bool:
    """Train the client's local model (from the initial model the first time) for `local-epochs`
    epochs on the train split outside the held-out slice, plain SGD (it is never released, so no
    DP-SGD layer trains it), on its own random stream, and keep it. False (nothing done) where the candidate is not active."""
    if not active(rt, guard):
        return False
    record = local_model(context, rt.client_id) or initial_record(rt)
    model = rt.model(record)
    x, y = sg.training_tensors(rt, ins, guard)
    parts = (ins.seed, rt.client_id, ins.server_round, _LOCAL_STREAM)
    token = LOCAL_TRAINER.set(None)
    # its own random stream (dropout draws from the global one): the method's training, fine-tuning
    # and everything after it draw exactly what they draw without the candidate
    devices = [rt.device] if rt.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seeded_generator_seed(*parts))
            train_epochs(model, x, y, epochs=ins.local_epochs, batch_size=ins.batch_size,
                         lr=ins.lr, momentum=ins.momentum, generator=seeded_generator(*parts))
    finally:
        LOCAL_TRAINER.reset(token)
    context.state[LOCAL.format(rt.client_id)] = model_record(model)
    return True


def answer(rt: ClientRuntime, context: Context, ins, guard: SafeguardInstructions,
           answered: torch.nn.Module | ArrayRecord, used: Evaluation, report: dict) -> Evaluation:
    """The test result the client answers with: `used` (of `answered`, the model the safeguard
    chose, or its record), or the local model's where the held-out slice prefers it (module doc). Adds `local`
    (1: answered with the local model), `local-gain` and `local-square` to `report`, and the local
    model's test accuracy (`local-accuracy`, classification), which decides nothing: it shows what
    the candidate would have scored."""
    record = local_model(context, rt.client_id) if active(rt, guard) else None
    if record is None:
        return used
    xv, yv = sg.held_out(rt, ins, guard)
    if len(yv) == 0:
        return used
    local = rt.model(record)
    mine = sg._per_sample(local, xv, yv, ins.batch_size)
    if isinstance(answered, ArrayRecord):
        answered = rt.model(answered)
    theirs = sg._per_sample(answered, xv, yv, ins.batch_size)
    total, squares = evidence(mine, theirs)
    margin = float(guard.margin or 0.0)
    if margin > 0.0:
        take = (not clearly_better(-total, squares, margin) if guard.local
                else clearly_better(total, squares, margin))
    else:
        take = tuple(sg._summary(mine)) > tuple(sg._summary(theirs))
    x_test, y_test = rt.tensors("test")
    tested = test_model(local, x_test, y_test, ins.batch_size, rt.data.target_scale)
    report.update(local=float(take), local_gain=total, local_square=squares)
    if tested.errors is None:  # what the candidate scores on the test split, answered or not
        report["local_accuracy"] = tested.accuracy
    return tested if take else used
