"""The safeguard's purely local candidate (client_app/local_candidate.py) and the server's pooling of
its evidence (strategies/shared/local_evidence.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from client_app import local_candidate, safeguard
from client_app.training import evaluate as evaluate_model
from client_app.training import seeded_generator, seeded_generator_seed, train_epochs
from strategies.shared.evidence import SAFEGUARD, SafeguardEvaluateReply, SafeguardInstructions
from strategies.shared.local_evidence import LocalEvidence
from strategies.shared.messages import EvaluateInstructions, TrainInstructions
from strategies.shared.run_config import RunConfig
from tests.builders import consensus_strategy, evaluate_config, safeguard_component, train_config
from tests.test_safeguard import GUARD, _evaluate, _guard, _held, _model, _runtime, _train, node  # noqa: F401

MARGIN = {**GUARD, "safeguard_margin": 1.0}  # the record the server sends on the consensus path


def _trained_local(cfg, context, rounds: int) -> None:
    """`rounds` sampled rounds on the consensus path (each trains the local model once)."""
    for round_ in range(1, rounds + 1):
        start = safeguard.own_model(context, 0) or _model(cfg, 1)
        _train(context, start, server_round=round_, **MARGIN)


def test_the_local_model_starts_from_the_runs_initial_model_without_touching_the_random_state(node):
    from server_app.app import initial_arrays

    cfg, context = node
    rt = _runtime(context)
    before = torch.get_rng_state()
    record = local_candidate.initial_record(rt)
    assert torch.equal(torch.get_rng_state(), before)
    server = initial_arrays(RunConfig.from_flower({**dict(context.run_config)}))
    assert list(record.keys()) == list(server.keys())
    for key in server.keys():
        np.testing.assert_array_equal(record[key].numpy(), server[key].numpy())


def test_only_the_consensus_path_keeps_a_local_model_by_default(node):
    cfg, context = node
    _train(context, _model(cfg, 1), **GUARD)  # a graph aggregate: no margin in the record
    assert safeguard.own_model(context, 0) is not None
    assert local_candidate.local_model(context, 0) is None
    _train(context, _model(cfg, 1), server_round=2, **MARGIN)
    assert local_candidate.local_model(context, 0) is not None
    rt = _runtime(context)
    scopes = {scope: RunConfig.from_flower({**dict(context.run_config), "safeguard-local": scope})
              for scope in ("consensus", "all", "off")}
    with_margin, without = _guard(**MARGIN), _guard(**GUARD)
    active = {(scope, margin): local_candidate.active(
        type(rt)(cfg, rt.client_id, rt.data, rt.device), guard)
        for scope, cfg in scopes.items() for margin, guard in ((True, with_margin), (False, without))}
    assert active == {("consensus", True): True, ("consensus", False): False,
                      ("all", True): True, ("all", False): True,
                      ("off", True): False, ("off", False): False}


def test_the_local_model_continues_from_itself_on_its_own_stream_and_never_from_the_received(node):
    cfg, context = node
    rt = _runtime(context)
    _train(context, _model(cfg, 1), server_round=1, **MARGIN)
    _train(context, _model(cfg, 2), server_round=2, **MARGIN)  # another received model
    # the same two rounds by hand: from the initial model, on the train part, round 1 then 2
    expected = rt.model(local_candidate.initial_record(rt))
    x, y = safeguard.training_tensors(rt, TrainInstructions.read(train_config()), _guard(**MARGIN))
    for round_ in (1, 2):
        parts = (0, 0, round_, local_candidate._LOCAL_STREAM)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seeded_generator_seed(*parts))
            train_epochs(expected, x, y, epochs=1, batch_size=32, lr=0.1, momentum=0.0,
                         generator=seeded_generator(*parts))
    kept = local_candidate.local_model(context, 0)
    for key, value in expected.state_dict().items():
        np.testing.assert_allclose(kept[key].numpy(), value.detach().numpy(), rtol=0, atol=0)
    # and it draws nothing from the process's random stream
    before = torch.get_rng_state()
    local_candidate.train_local(rt, context, TrainInstructions.read(train_config(server_round=3)),
                                _guard(**MARGIN))
    assert torch.equal(torch.get_rng_state(), before)


def _mlp_context():
    """A node context hosting client 0 as `node`'s, with the MLP (dropout: its training draws
    random numbers)."""
    from client_app.app import app as client_app
    from server_app.harness.local_grid import LocalGrid
    from strategies.shared.run_config import default_run_config
    from tests.test_safeguard import OVERRIDES

    grid = LocalGrid(client_app, 1, {**default_run_config(), **OVERRIDES, "model": "mlp"})
    return next(iter(grid.contexts.values()))


def test_with_dropout_the_local_model_is_the_same_whatever_the_process_drew_before():
    models = []
    for seed in (123, 456):  # two nodes whose processes drew different numbers before
        context = _mlp_context()
        rt = _runtime(context)
        torch.manual_seed(seed)
        before = torch.get_rng_state()
        assert local_candidate.train_local(rt, context, TrainInstructions.read(train_config()),
                                           _guard(**MARGIN))
        assert torch.equal(torch.get_rng_state(), before)
        models.append(local_candidate.local_model(context, 0))
    for key in models[0].keys():
        np.testing.assert_array_equal(models[0][key].numpy(), models[1][key].numpy())


def test_a_client_answers_with_its_local_model_only_where_its_slice_clearly_prefers_it(node):
    cfg, context = node
    _trained_local(cfg, context, 5)  # a few epochs: the local model learns the client's labels
    rt = _runtime(context)
    local = local_candidate.local_model(context, 0)
    useless = {k: torch.zeros_like(v) for k, v in local.to_torch_state_dict().items()}
    useless[[k for k in useless if k.endswith("bias")][-1]][9] = 100.0  # says 9, a label not held
    assert 9 not in rt.data.train_y.tolist()
    ins = EvaluateInstructions.read(evaluate_config())
    x_test, y_test = rt.tensors("test")
    answered = rt.model(ArrayRecord(useless))
    used = evaluate_model(answered, x_test, y_test, 32)
    alone = evaluate_model(rt.model(local), x_test, y_test, 32)
    report: dict = {}
    got = local_candidate.answer(rt, context, ins, _guard(**MARGIN), answered, used, report)
    assert report["local"] == 1.0 and got == alone and used.accuracy == 0.0 < alone.accuracy
    assert report["local_gain"] > 0 and report["local_square"] >= report["local_gain"]
    assert report["local_accuracy"] == alone.accuracy
    held = _held(context)  # b − c ≤ held < held·√(b + c): never clearly better at this margin
    strict: dict = {}
    got = local_candidate.answer(rt, context, ins, _guard(**GUARD, safeguard_margin=float(held)),
                                 answered, used, strict)
    assert strict["local"] == 0.0 and got is used
    # where the federation favours the local models, the client leaves its local model only on
    # its own clear evidence: an answer that equals it on the slice does not take it back
    same: dict = {}
    got = local_candidate.answer(rt, context, ins, _guard(**MARGIN, safeguard_local=True),
                                 rt.model(local), alone, same)
    assert same["local"] == 1.0 and same["local_gain"] == 0.0
    assert local_candidate.answer(rt, context, ins, _guard(**GUARD), answered, used, {}) is used


def test_the_evaluate_reply_carries_the_local_evidence_on_the_consensus_path_only(node):
    cfg, context = node
    _trained_local(cfg, context, 3)
    own = safeguard.own_model(context, 0)
    on_path = _evaluate(context, own, **MARGIN)
    assert on_path.safeguard_local in (0.0, 1.0) and on_path.safeguard_local_gain is not None
    assert on_path.safeguard_local_accuracy is not None
    graph = _evaluate(context, own, **GUARD)  # no margin: the default scope does not apply
    assert graph.safeguard_local is None and graph.safeguard_local_gain is None


def test_the_server_pools_the_local_evidence_into_the_next_instructions():
    evidence = LocalEvidence()
    assert not evidence.pool([], 1.0) and not evidence.favoured and evidence.statistic is None
    assert evidence.pool([(1.0, 3.0, 0.0)] * 2, 1.0)  # 2 / √6 = 0.82 standard errors: not yet
    assert not evidence.favoured
    assert evidence.pool([(1.0, 3.0, 1.0)] * 9 + [(float("nan"), 1.0, 0.0)], 1.0)  # 9 / √27 = 1.73
    assert evidence.favoured and evidence.answered == 9
    assert evidence.statistic == pytest.approx(9 / math.sqrt(27))
    assert evidence.pool([(-1.0, 1.0, 0.0)] * 4, 1.0) and not evidence.favoured  # revisited

    component = safeguard_component("flt", consensus_strategy())
    favoured = SafeguardEvaluateReply(own=0.0, local=1.0, local_gain=3.0, local_square=3.0,
                                      local_accuracy=0.75)
    plain = SafeguardEvaluateReply(own=0.0)
    fields = component.evaluate_replies(4, [(0, _reply(favoured)), (1, _reply(plain))])
    assert fields["safeguard-local"] == 1 and fields["safeguard-local-accuracy"] == 75.0
    sent = SafeguardInstructions.read(component.request_records("train", 5)[SAFEGUARD])
    assert sent.local is True
    fields = component.evaluate_replies(5, [(0, _reply(SafeguardEvaluateReply(
        own=0.0, local=0.0, local_gain=-3.0, local_square=3.0)))])
    assert fields["safeguard-local"] == 0
    assert SafeguardInstructions.read(component.request_records("train", 6)[SAFEGUARD]).local is None
    # a checkpoint written before the candidate existed restores with no evidence
    state = component.state()
    del state["local"]
    component.restore(state)
    assert component.local == LocalEvidence()


def _reply(record: SafeguardEvaluateReply):
    from types import SimpleNamespace

    return SimpleNamespace(content={SAFEGUARD: record.config()})
