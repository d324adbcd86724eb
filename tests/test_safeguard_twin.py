"""The own model's twin on the safeguard's consensus path (`client_app/safeguard_twin.py`): trained
like the own model on every train sample, it answers wherever the safeguard's choice holds the own
model; elsewhere nothing is kept. Through the real ClientApp handlers."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, RecordDict

from client_app import safeguard, safeguard_twin
from client_app.training import evaluate as evaluate_model
from tests.test_safeguard import GUARD, _evaluate, _model, _runtime, _train, node  # noqa: F401

CONSENSUS = dict(**GUARD, safeguard_margin=1.0, safeguard_twin=True)


def _fresh(context: Context) -> Context:
    return Context(run_id=1, node_id=context.node_id, node_config=context.node_config,
                   state=RecordDict(), run_config=context.run_config)


def test_the_twin_is_the_own_update_on_every_train_sample_and_only_on_the_consensus_path(node):
    cfg, context = node
    _train(context, _model(cfg, 1), **CONSENSUS)
    everything = _train(_fresh(context), _model(cfg, 1))  # safeguard off: every sample, same seed
    twin = context.state[safeguard_twin.TWIN.format(0)]
    for key, array in everything.content["personal"].items():
        np.testing.assert_array_equal(twin[key].numpy(), array.numpy())
    own = safeguard.own_model(context, 0)
    assert any(not np.array_equal(own[k].numpy(), twin[k].numpy()) for k in own)  # slice-free
    plain = _fresh(context)
    _train(plain, _model(cfg, 1), **GUARD)  # no margin: not the consensus path
    assert safeguard_twin.TWIN.format(0) not in plain.state.array_records


def test_where_the_choice_holds_the_own_model_the_twin_answers(node):
    cfg, context = node
    for round_ in range(1, 6):  # a few epochs: the own model learns the client's labels
        start = safeguard.own_model(context, 0) or _model(cfg, 1)
        _train(context, start, server_round=round_, **CONSENSUS)
    own = safeguard.own_model(context, 0)
    twin = context.state[safeguard_twin.TWIN.format(0)]
    useless = {k: torch.zeros_like(v) for k, v in own.to_torch_state_dict().items()}
    useless[[k for k in useless if k.endswith("bias")][-1]][9] = 100.0  # always says 9
    assert 9 not in _runtime(context).data.train_y.tolist()
    rt = _runtime(context)
    x, y = rt.tensors("test")
    own_accuracy = evaluate_model(rt.model(own), x, y, 32).accuracy
    twin_accuracy = evaluate_model(rt.model(twin), x, y, 32).accuracy
    assert own_accuracy != twin_accuracy  # the test tells them apart
    reply = _evaluate(context, ArrayRecord(useless), **CONSENSUS)
    assert reply.safeguard_own == 1.0  # the own model's evidence chose the own model
    assert reply.accuracy == twin_accuracy
    off_path = _evaluate(context, ArrayRecord(useless), **GUARD)  # no margin: the own model answers
    assert off_path.safeguard_own == 1.0 and off_path.accuracy == own_accuracy
