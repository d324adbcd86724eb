"""The graph methods' per-client safeguard (`client_app/safeguard.py`): held-out slice, own model,
mixing, its choice and its cost, through the real ClientApp handlers."""

from __future__ import annotations

import math
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict

from client_app import layers, safeguard, safeguard_consensus
from client_app.app import app as client_app
from client_app.runtime import ClientRuntime, client_runtime
from client_app.training import evaluate as evaluate_model
from models import build_model
from server_app.harness.local_grid import LocalGrid
from strategies.shared.evidence import (SAFEGUARD, SafeguardEvaluateReply, SafeguardInstructions,
                                        SafeguardTrainReply)
from strategies.shared.messages import (
    CONFIG, EVALUATE, GLOBAL, METRICS, PERSONAL, TRAIN_LOCAL, EvaluateInstructions, EvaluateReply,
    TrainInstructions,
    with_client
)
from strategies.shared.registry import METHODS
from strategies.shared.run_config import RunConfig, default_run_config
from tests.builders import (consensus_strategy, evaluate_config, safeguard_component,
                            train_config)

GUARD = {"safeguard_holdout": 0.25, "safeguard_grid": 5}
OVERRIDES = {"method": "fedu", "dataset": "digits", "model": "mclr", "partition": "label-clusters",
             "num-clusters": 2, "labels-per-cluster": 5, "num-clients": 2,
             "max-samples-per-client": 80, "client-threads": 1}


@pytest.fixture
def node():
    """A LocalGrid-backed node context hosting client 0, and the run config."""
    flat = {**default_run_config(), **OVERRIDES}
    grid = LocalGrid(client_app, 1, flat)  # sets the task identity Flower messages need
    context = next(iter(grid.contexts.values()))
    return RunConfig.from_flower(flat), context


def _message(records: dict, message_type: str) -> Message:
    message = Message(with_client(RecordDict(records), 0), dst_node_id=1, message_type=message_type)
    message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
    return message


def _model(cfg: RunConfig, seed: int) -> ArrayRecord:
    torch.manual_seed(seed)
    return ArrayRecord(build_model(cfg.model, (1, 28, 28), 10).state_dict())


def _held(context: Context) -> int:
    """The held-out count of client 0 under GUARD."""
    return math.ceil(GUARD["safeguard_holdout"] * len(_runtime(context).data.train_y))


def _runtime(context: Context) -> ClientRuntime:
    return client_runtime(_message({}, TRAIN_LOCAL), context)


def _split(fields: dict) -> tuple[dict, dict]:
    """(config fields, `safeguard` record fields) of test fields: `safeguard_<x>` is the record's `x`."""
    guard = {k.removeprefix("safeguard_"): v for k, v in fields.items() if k.startswith("safeguard_")}
    return {k: v for k, v in fields.items() if not k.startswith("safeguard_")}, guard


def _guard(**fields) -> SafeguardInstructions | None:
    """The `safeguard` record of test fields (None: none, the safeguard is off)."""
    guard = _split(fields)[1]
    return SafeguardInstructions(**guard) if guard else None


def _records(config, **fields) -> dict:
    """A request's `config` and, where the fields turn the safeguard on, its `safeguard` record."""
    plain, guard = _split(fields)
    return {CONFIG: config(**plain),
            **({SAFEGUARD: SafeguardInstructions(**guard).config()} if guard else {})}


def test_holdout_is_a_fixed_disjoint_slice_of_at_least_one_sample():
    train, held = safeguard.holdout_index(80, 0.1, 3, 5)
    assert len(held) == 8 and len(train) == 72
    assert set(train.tolist()).isdisjoint(held.tolist())
    assert sorted(train.tolist() + held.tolist()) == list(range(80))
    again = safeguard.holdout_index(80, 0.1, 3, 5)[1]
    assert torch.equal(held, again)  # the same slice every round
    assert not torch.equal(held, safeguard.holdout_index(80, 0.1, 3, 6)[1])  # its own per client
    assert len(safeguard.holdout_index(5, 0.01, 0, 0)[1]) == 1
    assert len(safeguard.holdout_index(2, 0.9, 0, 0)[0]) == 1  # never every sample
    assert len(safeguard.holdout_index(1, 0.5, 0, 0)[1]) == 0


def test_mix_is_the_linear_interpolation_and_keeps_integer_buffers():
    own = {"w": torch.zeros(3), "n": torch.tensor(1)}
    other = {"w": torch.ones(3) * 4, "n": torch.tensor(7)}
    mixed = safeguard.mix(own, other, 0.25)
    assert torch.allclose(mixed["w"], torch.ones(3)) and int(mixed["n"]) == 7
    assert torch.equal(safeguard.mix(own, other, 0.0)["w"], own["w"])
    assert safeguard.grid(5) == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_off_or_without_an_own_model_the_received_model_is_used_unchanged(node):
    cfg, context = node
    rt = _runtime(context)
    received = {PERSONAL: _model(cfg, 1)}
    from strategies.shared.messages import TrainInstructions
    ins, guard = TrainInstructions.read(train_config()), _guard(**GUARD)
    assert safeguard.choose(rt, context, ins, None, received)[0] is received[PERSONAL]
    assert safeguard.choose(rt, context, ins, guard, received)[0] is received[PERSONAL]  # no own yet
    assert layers.active().train_index(rt, ins) is None  # outside the layer: every sample
    assert len(safeguard.train_index(rt, ins, guard)) == len(rt.data.train_y) - _held(context)


def _train(context: Context, start: ArrayRecord, **fields) -> Message:
    reply = client_app(_message({PERSONAL: start, **_records(train_config, **fields)}, TRAIN_LOCAL),
                       context)
    assert not reply.has_error(), reply.error
    return reply


def test_training_keeps_the_own_model_and_uses_only_the_train_part(node):
    cfg, context = node
    reply = _train(context, _model(cfg, 1), **GUARD)
    n = len(_runtime(context).data.train_y)
    assert int(reply.content[METRICS]["num-examples"]) == n - _held(context)
    own = safeguard.own_model(context, 0)
    for key, array in reply.content[PERSONAL].items():
        np.testing.assert_array_equal(own[key].numpy(), array.numpy())
    off = _train(Context(run_id=1, node_id=context.node_id, node_config=context.node_config,
                         state=RecordDict(), run_config=context.run_config), _model(cfg, 1))
    assert int(off.content[METRICS]["num-examples"]) == n  # off: every sample, nothing kept


def _evaluate(context: Context, personal: ArrayRecord, **fields) -> SimpleNamespace:
    """The reply's `metrics` (`EvaluateReply`) and its `safeguard` record's fields as `safeguard_<x>`
    (None where absent)."""
    reply = client_app(_message({PERSONAL: personal, **_records(evaluate_config, **fields)},
                                EVALUATE), context)
    assert not reply.has_error(), reply.error
    guard = (dict(SafeguardEvaluateReply.read(reply.content[SAFEGUARD]))
             if SAFEGUARD in reply.content else {})
    return SimpleNamespace(**dict(EvaluateReply.read(reply.content[METRICS])),
                           **{f"safeguard_{k}": guard.get(k)
                              for k in SafeguardEvaluateReply.model_fields})


def test_a_useless_received_model_is_replaced_by_the_own_model(node):
    cfg, context = node
    for round_ in range(1, 6):  # a few epochs: the own model learns the client's labels
        start = safeguard.own_model(context, 0) or _model(cfg, 1)
        _train(context, start, server_round=round_, **GUARD)
    own = safeguard.own_model(context, 0).to_torch_state_dict()
    useless = {k: torch.zeros_like(v) for k, v in own.items()}
    bias = [k for k in useless if k.endswith("bias")][-1]  # the output layer's
    useless[bias][9] = 100.0  # always a label client 0 does not have: every mix with a > 0 says 9
    assert 9 not in _runtime(context).data.train_y.tolist()
    guarded = _evaluate(context, ArrayRecord(useless), **GUARD)
    paper = _evaluate(context, ArrayRecord(useless))
    assert guarded.safeguard_own == 1.0
    assert paper.accuracy == 0.0 and guarded.accuracy > 0.3
    own_alone = _evaluate(context, safeguard.own_model(context, 0))
    assert guarded.accuracy == own_alone.accuracy


def test_clearly_better_is_a_sign_test_in_standard_errors():
    assert safeguard.clearly_better(3.0, 3.0, 1.0)  # right on 3 more, wrong on none: 3 > 1·√3
    assert not safeguard.clearly_better(3.0, 3.0, 2.0)  # 3 < 2·√3
    assert not safeguard.clearly_better(1.0, 5.0, 1.0)  # +3 −2: a net 1 over 5 disagreements
    assert safeguard.clearly_better(1.0, 5.0, 0.0)  # margin 0: any gain
    assert not safeguard.clearly_better(0.0, 0.0, 0.0)  # no gain is no gain


def test_the_margin_keeps_the_received_model_unless_a_mix_is_clearly_better(node):
    cfg, context = node
    for round_ in range(1, 6):
        start = safeguard.own_model(context, 0) or _model(cfg, 1)
        _train(context, start, server_round=round_, **GUARD)
    own = safeguard.own_model(context, 0).to_torch_state_dict()
    useless = {k: torch.zeros_like(v) for k, v in own.items()}
    useless[[k for k in useless if k.endswith("bias")][-1]][9] = 100.0  # says 9, a label not held
    clear = _evaluate(context, ArrayRecord(useless), **GUARD, safeguard_margin=1.0)
    assert clear.safeguard_own == 1.0 and clear.accuracy > 0.3  # far better on the slice: taken
    held = _held(context)
    strict = _evaluate(context, ArrayRecord(useless), **GUARD, safeguard_margin=float(held))
    assert strict.safeguard_own == 0.0 and strict.accuracy == 0.0  # b − c ≤ held < held·√(b + c)


@pytest.mark.parametrize("path", ["consensus", "own-model"])
def test_with_own_start_a_client_trains_from_its_own_model_unless_the_mix_is_clearly_better(node, path):
    """`safeguard-own-start`: where the record carries `own-start`, the start is the client's own
    model unless the chosen mix is that many standard errors better than it on the held-out slice;
    without it, the chosen mix. The same on the consensus path (the record's `margin`, once clients
    train from their mixes) and where the method hands each client its own model."""
    cfg, context = node
    for round_ in range(1, 6):  # a few epochs: an own model that knows client 0's labels
        start = safeguard.own_model(context, 0) or _model(cfg, 1)
        _train(context, start, server_round=round_, **GUARD)
    rt = _runtime(context)
    ins = TrainInstructions.read(train_config(server_round=6))
    own = safeguard.own_model(context, 0)
    state = own.to_torch_state_dict()
    # the own model nudged: the same answers on the slice, so the mix that ties is the received one
    nudged = ArrayRecord({k: v + 1e-6 if v.is_floating_point() else v for k, v in state.items()})
    off = {"safeguard_margin": 1.0} if path == "consensus" else {}
    on = {**off, "safeguard_own_start": 1.0}

    def start(received: ArrayRecord, **fields) -> dict[str, torch.Tensor]:
        guard = _guard(**GUARD, **fields)
        return safeguard.SafeguardLayer(context, guard).start(rt, ins, {PERSONAL: received}
                                                              ).to_torch_state_dict()

    kept = start(nudged, **on)
    assert all(torch.equal(kept[k], v) for k, v in state.items())  # no evidence: the own model
    taken = start(nudged, **off)
    assert any(not torch.equal(taken[k], v) for k, v in state.items())  # the chosen mix
    # a useless own model against a good received one: the received model is clearly better
    useless = {k: torch.zeros_like(v) for k, v in state.items()}
    useless[[k for k in useless if k.endswith("bias")][-1]][9] = 100.0  # says 9, a label not held
    context.state[safeguard.OWN.format(0)] = ArrayRecord(useless)
    clear = start(own, **on)
    assert all(torch.equal(clear[k], v) for k, v in state.items())


def test_the_own_start_margin_is_in_the_record_where_clients_train_from_their_mixes():
    consensus, off = consensus_strategy(), {"safeguard-own-start": False}
    records = lambda component: dict(component.request_records("train", 2)["safeguard"])
    mix = {"safeguard-start": "mix"}
    assert "own-start" not in records(safeguard_component("flt", consensus))  # from the consensus
    assert records(safeguard_component("flt", consensus, **mix))["own-start"] == 1.0
    assert "own-start" not in records(safeguard_component("flt", consensus, **mix, **off))
    # where the method hands each client its own model: the margin, unless off or zero
    assert records(safeguard_component("sfl", **{"safeguard-margin": 1.5}))["own-start"] == 1.5
    assert "own-start" not in records(safeguard_component("sfl", **off))
    assert "own-start" not in records(safeguard_component("sfl", **{"safeguard-margin": 0.0}))


def test_the_federation_weight_pools_what_no_single_client_can_show():
    from strategies.shared.evidence import family_margin, federation_weight

    weights = safeguard.grid(5)[:-1]  # 0, 0.25, 0.5, 0.75
    one = ([1.0, 2.0, 2.0, 1.0], [9.0, 4.0, 4.0, 3.0])  # a = 0.25, 0.5: +2 in 4 discordant samples
    # four weights: each tested at 2.13 standard errors, where the best of four passes on noise as
    # often as one test at 1.5 does
    assert family_margin(1.5, 4) == pytest.approx(2.128, abs=1e-3)
    assert family_margin(1.5, 1) == 1.5 and family_margin(0.0, 4) == 0.0
    assert federation_weight([one], weights, 1.5) == 1.0  # one client: 2 < 2.13·√4
    assert federation_weight([one] * 4, weights, 1.5) == 1.0  # 8 < 2.13·√16: not for the family
    assert federation_weight([one] * 5, weights, 1.5) == 0.25  # 10 > 2.13·√20; ties to the first
    worse = ([-3.0, -2.0, -1.0, 0.0], [3.0, 2.0, 1.0, 0.0])
    assert federation_weight([worse] * 10, weights, 1.0) == 1.0  # no mix helps: the received model
    assert federation_weight([], weights, 1.0) == 1.0


def test_without_clear_evidence_a_client_takes_the_federation_weight_and_reports_its_gains(node):
    cfg, context = node
    _train(context, _model(cfg, 1), **GUARD)
    own = safeguard.own_model(context, 0)
    same = _evaluate(context, own, **GUARD, safeguard_margin=1.0)  # every mix is the own model
    assert same.safeguard_own == 0.0  # no weight from the federation: the received model
    assert same.safeguard_gains == [0.0] * 4 and same.safeguard_squares == [0.0] * 4
    pooled = _evaluate(context, own, **GUARD, safeguard_margin=1.0, safeguard_weight=0.5)
    assert pooled.safeguard_own == 0.5  # nothing clearly better than the federation's mix
    plain = _evaluate(context, own, **GUARD)
    assert plain.safeguard_gains is None  # without a margin nothing is reported
    tuned = _evaluate(context, own, **GUARD, safeguard_margin=1.0, finetune_epochs=1)
    assert tuned.safeguard_finetuned is not None and tuned.safeguard_tuned_gain is None
    federation = _evaluate(context, safeguard.own_model(context, 0), **GUARD, safeguard_margin=1.0,
                           safeguard_finetune=False, finetune_epochs=1)
    assert federation.safeguard_tuned_gain is not None  # the federation's answer: reported
    assert abs(federation.safeguard_tuned_gain) <= federation.safeguard_tuned_square


def test_the_server_pools_the_reported_gains_into_the_next_instructions():
    component = safeguard_component("flt", consensus_strategy())
    plain = SafeguardEvaluateReply(own=0.0)
    assert not component.pool([plain]) and component.weight is None
    gain = SafeguardEvaluateReply(own=0.0, gains=[0.0, 1.0, 2.0, 1.0], squares=[4.0, 3.0, 2.0, 1.0])
    assert component.pool([gain] * 5)  # a = 0.5: 10 > 1.75·√10 (four weights, margin 1)
    assert component.weight == 0.5
    sent = SafeguardInstructions.read(component.request_records("train", 3)[SAFEGUARD])
    assert sent.weight == 0.5
    worse = SafeguardEvaluateReply(own=0.0, gains=[-2.0] * 4, squares=[2.0] * 4)
    assert component.pool([worse] * 5) and component.weight == 1.0


def test_the_start_switches_to_the_mix_once_the_own_models_are_clearly_better():
    from strategies.shared.evidence import StartEvidence

    federation = StartEvidence("federation")
    assert federation.from_consensus and federation.pooled.statistic is None
    federation.pool(2, [(3.0, 5.0), (-1.0, 3.0)], 1.0)  # 2 / √8 = 0.71 standard errors: not yet
    assert federation.from_consensus and federation.pooled.statistic == pytest.approx(2 / math.sqrt(8))
    federation.pool(3, [(4.0, 4.0), (float("nan"), 1.0), (1.0, -1.0)], 1.0)  # 6 / √12 = 1.73
    assert not federation.from_consensus and federation.switched == 3  # (malformed reports skipped)
    federation.pool(4, [(-50.0, 50.0)], 1.0)  # final: the consensus is not taken back
    assert not federation.from_consensus and federation.switched == 3
    always = StartEvidence("consensus")
    always.pool(2, [(9.0, 9.0)], 1.0)
    assert always.from_consensus and always.switched is None
    assert not StartEvidence("mix").from_consensus


def test_the_server_pools_the_start_evidence_of_the_train_replies(node):  # node: task identity
    from strategies.shared.messages import TrainReply

    def replies(*reports):
        return [(client, _message({
            METRICS: TrainReply(num_examples=10, train_loss=1.0).metrics(),
            SAFEGUARD: SafeguardTrainReply(start_gain=gain, start_square=square).config()},
            TRAIN_LOCAL)) for client, (gain, square) in enumerate(reports)]

    def start(component, server_round):
        records = component.request_records("train", server_round)
        return SafeguardInstructions.read(records[SAFEGUARD]).train_consensus if records else None

    component = safeguard_component("flt", consensus_strategy())
    assert start(component, 2)
    assert component.train_replies(2, replies((1.0, 4.0))) == {
        "safeguard-start": 1.0, "safeguard-start-evidence": 0.5}
    record = component.train_replies(3, replies((3.0, 3.0), (2.0, 2.0)))  # 6 / √9: 2 > 1
    assert record["safeguard-start-evidence"] == pytest.approx(2.0)
    assert start(component, 4) is None  # the own models are clearly better: the mix from now on
    assert component.train_replies(4, replies())["safeguard-start"] == 0.0
    mix = safeguard_component("flt", consensus_strategy(), **{"safeguard-start": "mix"})
    assert start(mix, 2) is None
    consensus = safeguard_component("flt", consensus_strategy(), **{"safeguard-start": "consensus"})
    consensus.train_replies(2, replies((9.0, 9.0)))
    assert start(consensus, 3)
    assert safeguard_component("flt").train_replies(2, replies((1.0, 1.0))) == {}  # no consensus
    for off in ({"safeguard": "off"}, {"safeguard-margin": 0.0}):
        component = safeguard_component("flt", consensus_strategy(), **off)
        assert component.train_replies(2, replies((1.0, 1.0))) == {} and not start(component, 2)


def test_from_the_consensus_a_client_trains_it_and_keeps_the_better_of_it_and_its_own(node):
    """With `safeguard-train-consensus` a client that has an own model trains the received
    consensus itself (as a client without one does), keeps the trained model as its own only if it
    scores at least as well on its held-out slice (accuracy, then loss), and reports how much
    better its own model was there."""
    from strategies.shared.messages import TrainInstructions

    cfg, context = node
    for round_ in range(1, 6):  # a few epochs: an own model that knows client 0's labels
        start = safeguard.own_model(context, 0) or _model(cfg, 1)
        _train(context, start, server_round=round_, **GUARD)
    good = safeguard.own_model(context, 0)
    fields = dict(**GUARD, safeguard_margin=1.0, safeguard_train_consensus=True, server_round=6)
    ins = TrainInstructions.read(train_config(server_round=6))
    rt = _runtime(context)
    xv, yv = safeguard.held_out(rt, ins, _guard(**fields))

    def on_slice(record):
        return safeguard._per_sample(rt.model(record), xv, yv, ins.batch_size)

    def same(a, b):
        return all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)

    received = _model(cfg, 4)  # untrained: one short epoch from it is worse than the own model
    reply = _train(context, received, **fields)
    fresh = Context(run_id=1, node_id=context.node_id, node_config=context.node_config,
                    state=RecordDict(), run_config=context.run_config)
    alone = _train(fresh, received, **fields)  # no own model yet: it trains the received model
    assert same(reply.content[PERSONAL], alone.content[PERSONAL])
    assert SAFEGUARD not in alone.content
    gain = safeguard_consensus.gain(on_slice(good), on_slice(reply.content[PERSONAL]))
    evidence = reply.content[SAFEGUARD]
    assert evidence["start-gain"] == pytest.approx(float(gain.sum())) and gain.sum() > 0
    assert evidence["start-square"] == pytest.approx(float((gain**2).sum()))
    assert same(safeguard.own_model(context, 0), good)  # worse on the slice: the own model stays
    x, y = rt.tensors("train")
    strong = rt.model(good)
    from client_app.training import seeded_generator, train_epochs
    train_epochs(strong, x, y, epochs=30, batch_size=16, lr=0.1, momentum=0.0,
                 generator=seeded_generator(0))  # has seen the held-out slice too
    reply = _train(context, ArrayRecord({k: v.detach() for k, v in strong.state_dict().items()}),
                   **fields)
    trained = reply.content[PERSONAL]
    assert safeguard._summary(on_slice(trained)) >= safeguard._summary(on_slice(good))
    assert same(safeguard.own_model(context, 0), trained)  # at least as good: it is the own model
    assert reply.content[SAFEGUARD]["start-gain"] <= 0.0


def test_the_round_record_counts_the_clients_that_answered_fine_tuned(node):  # node: task identity
    component = safeguard_component("flt", consensus_strategy())
    replies = [(client, _message({METRICS: EvaluateReply(
        num_examples=10, correct=5, loss=1.0, accuracy=0.5, finetuned_accuracy=0.6).metrics(),
        SAFEGUARD: SafeguardEvaluateReply(own=own, finetuned=tuned).config()}, EVALUATE))
        for client, (own, tuned) in enumerate([(0.0, 1.0), (0.5, 0.0), (0.25, 1.0)])]
    record = component.evaluate_replies(2, replies)
    assert record["safeguard-finetuned"] == 2 and record["safeguard-mixed"] == 2
    assert record["safeguard-own"] == pytest.approx(0.25)


@pytest.mark.parametrize("mode", ["federation", "client"])
def test_the_federation_answers_fine_tuned_where_its_pooled_evidence_favours_it(node, mode):
    """`safeguard-finetune = "federation"`: the server pools the clients' held-out gains of their
    fine-tuned answers over their mixes since the start and sends `finetune`, true while the sum is
    above zero, taking it back when later reports outweigh it; `client` (the default) sends none,
    and pools nothing."""
    component = safeguard_component("flt", consensus_strategy(), **{"safeguard-finetune": mode})

    def evaluated(server_round, reports):
        replies = [(client, _message({METRICS: EvaluateReply(
            num_examples=10, correct=5, loss=1.0, accuracy=0.5).metrics(),
            SAFEGUARD: SafeguardEvaluateReply(own=0.0, tuned_gain=gain, tuned_square=square).config()},
            EVALUATE)) for client, (gain, square) in enumerate(reports)]
        record = component.evaluate_replies(server_round, replies)
        return record, component.instructions().finetune

    # each client's +1 in 3 discordant samples is no clear evidence (1 < √3); pooled, the sum favours
    # the fine-tuned answers (malformed reports skipped)
    record, finetune = evaluated(2, [(1.0, 3.0), (1.0, 3.0), (-1.0, 1.0), (float("nan"), 1.0)])
    if mode == "client":
        assert finetune is None and "safeguard-finetune-evidence" not in record
        assert component.tuned.square == 0.0
        return
    assert finetune is True and record["safeguard-finetune-evidence"] == pytest.approx(1 / math.sqrt(7))
    record, finetune = evaluated(3, [(-2.0, 2.0)])  # since the start: −1
    assert finetune is False and record["safeguard-finetune-evidence"] == pytest.approx(-1 / 3)
    record, finetune = evaluated(4, [])  # no report: the pooled evidence stands
    assert finetune is False and "safeguard-finetune-evidence" not in record
    fresh = safeguard_component("flt", consensus_strategy(), **{"safeguard-finetune": mode})
    assert fresh.instructions().finetune is False  # no evidence yet: the mixes answer
    graph = safeguard_component("flt", **{"safeguard-finetune": mode})  # each client its aggregate
    graph.tuned.add([(5.0, 5.0)])
    assert graph.instructions().finetune is None  # only where the consensus is handed out


def test_a_better_received_model_is_taken_whole(node):
    cfg, context = node
    _train(context, _model(cfg, 1), **GUARD)  # one short epoch from a random start: a weak own model
    strong = safeguard.own_model(context, 0)
    rt = _runtime(context)
    x, y = rt.tensors("train")
    model = rt.model(strong)
    from client_app.training import seeded_generator, train_epochs
    train_epochs(model, x, y, epochs=30, batch_size=16, lr=0.1, momentum=0.0,
                 generator=seeded_generator(0))  # has seen the held-out slice too: clearly better
    better = ArrayRecord({k: v.detach() for k, v in model.state_dict().items()})
    guarded = _evaluate(context, better, **GUARD)
    assert guarded.safeguard_own == 0.0


def test_a_received_model_is_scored_once_per_own_model(node, monkeypatch):
    """A fused round evaluates and then trains with the same received model: the held-out slice is
    scored for it once. Cost: at most (1 + grid − 1) passes over the slice per received model."""
    cfg, context = node
    _train(context, _model(cfg, 1), **GUARD)
    calls = []
    original = safeguard._per_sample
    monkeypatch.setattr(safeguard, "_per_sample",
                        lambda m, x, *a, **k: calls.append(len(x)) or original(m, x, *a, **k))
    received = _model(cfg, 3)
    _evaluate(context, received, server_round=1, **GUARD)
    first = list(calls)
    assert first == [_held(context)] * 5  # the received model, 3 mixes and the own model, on the held-out slice
    _evaluate(context, received, server_round=1, **GUARD)
    assert calls == first  # cached
    _train(context, received, server_round=2, **GUARD)
    assert calls == first  # training from the same received model: cached too
    _evaluate(context, received, server_round=2, **GUARD)
    assert len(calls) == 10  # a new own model: scored again
    # so a received model costs grid × holdout passes over the train split: half a pass by default
    defaults = RunConfig.from_flower(default_run_config())
    assert defaults.safeguard_grid * defaults.safeguard_holdout == pytest.approx(0.5)


def test_the_server_sends_the_safeguard_only_to_graph_methods():
    graph = {name for name, m in METHODS.items() if m.safeguard}
    assert graph == {"flt", "sfl", "sfl-star", "fedska", "fedu"}
    for method, expected in (("sfl", True), ("fedavg", False), ("local", False)):
        for kind in ("train", "evaluate"):
            records = safeguard_component(method).request_records(kind, 2)
            assert bool(records) == expected
            if expected:
                assert dict(records[SAFEGUARD]) == {"holdout": 0.1, "grid": 5, "own-start": 1.0}
    assert safeguard_component("sfl", weight=0.5, safeguard="off").request_records("train", 2) == {}


def test_the_client_layer_is_named_by_the_record_it_reads():
    """The ClientApp enters the safeguard's layer for requests carrying its record, and imports
    nothing of it for others (FedAvg's path)."""
    assert layers.LAYERS[SAFEGUARD] == "client_app.safeguard:around"
    assert sum(target.startswith("client_app.safeguard:") for target in layers.LAYERS.values()) == 1
    import subprocess
    import sys
    code = ("import sys, client_app.app, client_app.methods.fedavg, client_app.local_update, "
            "client_app.evaluation; print('client_app.safeguard' in sys.modules, "
            "'strategies.shared.evidence' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_bad_safeguard_settings_fail_naming_the_key():
    with pytest.raises(ValueError, match="safeguard"):
        RunConfig.from_flower({**default_run_config(), "safeguard": "always"})
    with pytest.raises(ValueError, match="safeguard-holdout"):
        RunConfig.from_flower({**default_run_config(), "safeguard-holdout": 0.7})


def test_evaluation_fine_tunes_the_used_model_and_keeps_it_as_the_own_model(node):
    cfg, context = node
    _train(context, _model(cfg, 1), **GUARD)
    before = safeguard.own_model(context, 0).to_torch_state_dict()
    reply = _evaluate(context, _model(cfg, 4), finetune_epochs=1, **GUARD)
    assert reply.finetuned_accuracy is not None and reply.global_accuracy is None
    after = safeguard.own_model(context, 0).to_torch_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    fresh = Context(run_id=1, node_id=context.node_id, node_config=context.node_config,
                    state=RecordDict(), run_config=context.run_config)
    paper = _evaluate(fresh, _model(cfg, 4), finetune_epochs=1)  # off: personal is only tested
    assert paper.finetuned_accuracy is None and safeguard.own_model(fresh, 0) is None


def test_the_fine_tuned_model_answers_exactly_where_the_held_out_slice_prefers_it(node):
    cfg, context = node
    rt = _runtime(context)
    ins, guard = EvaluateInstructions.read(evaluate_config()), _guard(**GUARD)
    mixed = _model(cfg, 3)
    tuned = rt.model(_model(cfg, 2))
    xv, yv = safeguard.held_out(rt, ins, guard)
    assert len(yv) == _held(context)
    score = tuple(safeguard._summary(safeguard._per_sample(tuned, xv, yv, ins.batch_size)))
    assert len(score) == 2 and 0.0 <= score[0] <= 1.0  # [accuracy, −loss]

    def prefers(score: tuple[float, ...]) -> bool:
        answer, gains = safeguard.prefers_finetuned(rt, ins, guard,
                                                    safeguard.Choice(PERSONAL, 0.5, score=score),
                                                    mixed, tuned)
        assert gains is None  # no margin: nothing for the server to pool
        return answer

    assert not prefers(())  # nothing tested (no own model yet): the received model answers
    assert prefers(score)  # a tie goes to the fine-tuned model
    assert not prefers((score[0], score[1] + 1e-6))  # the mix: same accuracy, lower loss
    assert prefers((score[0] - 0.01, 0.0))  # the mix: lower accuracy, whatever its loss


def test_with_a_margin_the_fine_tuned_model_answers_only_if_clearly_better(node):
    cfg, context = node
    for round_ in range(1, 6):  # a few epochs: a model that knows client 0's labels
        start = safeguard.own_model(context, 0) or _model(cfg, 1)
        _train(context, start, server_round=round_, **GUARD)
    rt = _runtime(context)
    good = safeguard.own_model(context, 0)
    useless = {k: torch.zeros_like(v) for k, v in good.to_torch_state_dict().items()}
    useless[[k for k in useless if k.endswith("bias")][-1]][9] = 100.0  # always says 9
    assert 9 not in _runtime(context).data.train_y.tolist()
    ins, consensus = EvaluateInstructions.read(evaluate_config()), _guard(safeguard_margin=1.0, **GUARD)
    anything = safeguard.Choice(PERSONAL, 1.0, score=(1.0, 0.0))  # its score is not the test here
    xv, yv = safeguard.held_out(rt, ins, consensus)
    useless_held = safeguard._per_sample(rt.model(ArrayRecord(useless)), xv, yv, 32)
    good_held = safeguard._per_sample(rt.model(good), xv, yv, 32)
    better = safeguard_consensus.gain(good_held, useless_held)
    assert safeguard.prefers_finetuned(rt, ins, consensus, anything, ArrayRecord(useless),
                                       rt.model(good)) == (True, None)  # nothing reported
    # the same model on both sides: no sample differs, no evidence, the mix answers
    assert not safeguard.prefers_finetuned(rt, ins, consensus, anything, good, rt.model(good))[0]
    # the useless model fine-tuned against a good mix: worse, so the mix answers
    assert not safeguard.prefers_finetuned(rt, ins, consensus, anything, good,
                                           rt.model(ArrayRecord(useless)))[0]
    # the mix's per-sample result that the choice carries is used, not counted again
    carried = safeguard.Choice(PERSONAL, 1.0, score=(1.0, 0.0), held=useless_held)
    assert safeguard.prefers_finetuned(rt, ins, consensus, carried, good, rt.model(good))[0]
    # with the federation's answer (`safeguard-finetune = "federation"`) the client reports the
    # gains of its fine-tuned model over its mix for the server to pool, and takes that answer
    # unless the other model is clearly better: the mix where it is false, as without it ...
    mixes = _guard(safeguard_margin=1.0, safeguard_finetune=False, **GUARD)
    answer, gains = safeguard.prefers_finetuned(rt, ins, mixes, anything, ArrayRecord(useless),
                                                rt.model(good))
    assert answer and gains == (pytest.approx(float(better.sum())), pytest.approx(float((better**2).sum())))
    assert gains[0] > 0
    assert safeguard.prefers_finetuned(rt, ins, mixes, anything, good, rt.model(good)) == (False, (0.0, 0.0))
    answer, gains = safeguard.prefers_finetuned(rt, ins, mixes, anything, good,
                                                rt.model(ArrayRecord(useless)))
    assert not answer and gains[0] == pytest.approx(-float(better.sum()))
    # ... and the fine-tuned model where it is true: on a tie, not against a clearly better mix
    favoured = _guard(safeguard_margin=1.0, safeguard_finetune=True, **GUARD)
    assert safeguard.prefers_finetuned(rt, ins, favoured, anything, good, rt.model(good))[0]
    assert not safeguard.prefers_finetuned(rt, ins, favoured, anything, good,
                                           rt.model(ArrayRecord(useless)))[0]
    assert safeguard.prefers_finetuned(rt, ins, favoured, anything, ArrayRecord(useless),
                                       rt.model(good))[0]


@pytest.mark.parametrize("prefers", [True, False])
def test_the_evaluation_reports_the_model_the_held_out_slice_chose(node, monkeypatch, prefers):
    cfg, context = node
    _train(context, _model(cfg, 1), **GUARD)
    seen = []

    def decide(rt, ins, guard, choice, mixed, tuned):
        seen.append(choice)
        return prefers, None

    monkeypatch.setattr(safeguard, "prefers_finetuned", decide)
    own, received = safeguard.own_model(context, 0), _model(cfg, 4)
    reply = _evaluate(context, received, finetune_epochs=1, **GUARD)
    assert len(seen) == 1 and len(seen[0].score) == 2  # the chosen mix's held-out score
    assert seen[0].held is not None and len(seen[0].held[0]) == _held(context)  # tested just now
    assert reply.safeguard_finetuned == float(prefers)
    rt = _runtime(context)
    mixed = rt.model(ArrayRecord(safeguard.mix(own.to_torch_state_dict(),
                                               received.to_torch_state_dict(), seen[0].weight)))
    x, y = rt.tensors("test")
    mix_accuracy = evaluate_model(mixed, x, y, 32).accuracy
    assert reply.accuracy == pytest.approx(reply.finetuned_accuracy if prefers else mix_accuracy)
    after = safeguard.own_model(context, 0).to_torch_state_dict()  # fine-tuned either way: the own
    assert any(not torch.equal(own.to_torch_state_dict()[k], after[k]) for k in after)  # model


def test_the_sent_model_also_learns_the_held_out_slice_and_the_own_model_does_not(node):
    """With `safeguard-send-slice` a trained client keeps the model trained outside its slice as its
    own, then trains it on the slice too and sends that, counting every train sample."""
    cfg, context = node
    n = len(_runtime(context).data.train_y)
    fresh = Context(run_id=1, node_id=context.node_id, node_config=context.node_config,
                    state=RecordDict(), run_config=context.run_config)
    plain = _train(fresh, _model(cfg, 1), **GUARD, safeguard_margin=1.0)
    sent = _train(context, _model(cfg, 1), **GUARD, safeguard_margin=1.0, safeguard_send_slice=True)
    assert int(plain.content[METRICS]["num-examples"]) == n - _held(context)
    assert int(sent.content[METRICS]["num-examples"]) == n
    own, plain_own = safeguard.own_model(context, 0), safeguard.own_model(fresh, 0)
    for key, array in plain_own.items():  # the own model never saw the slice
        np.testing.assert_array_equal(own[key].numpy(), array.numpy())
    assert any(not np.array_equal(sent.content[PERSONAL][k].numpy(), own[k].numpy()) for k in own)
    kept = context.state[safeguard_consensus.SENT.format(0)]
    for key, array in sent.content[PERSONAL].items():
        np.testing.assert_array_equal(kept[key].numpy(), array.numpy())
    assert safeguard_consensus.SENT.format(0) not in fresh.state.array_records  # nothing kept without it


def test_a_client_scores_with_the_consensus_less_its_own_update(node):
    """The consensus of round t is Σ n_j w_j / Σ n_j over the clients trained in t; a client that
    sent w_k in t recovers the others' mean exactly, and otherwise uses what it received."""
    cfg, context = node
    n = len(_runtime(context).data.train_y)
    sent = _train(context, _model(cfg, 1), server_round=3, **GUARD, safeguard_margin=1.0,
                  safeguard_send_slice=True).content[PERSONAL].to_torch_state_dict()
    others = _model(cfg, 5).to_torch_state_dict()  # the other clients' mean, 3n examples
    consensus = ArrayRecord({k: (n * sent[k] + 3 * n * others[k]) / (4 * n) for k in sent})

    def loo(**fields):
        guard = _guard(**GUARD, safeguard_margin=1.0, **fields)
        return safeguard.without_own_update(context, 0, guard, consensus).to_torch_state_dict()

    held = {"safeguard_consensus_clients": [0, 2, 5]}  # whose replies the consensus averaged
    for key, value in loo(safeguard_consensus_round=3, safeguard_consensus_examples=4.0 * n,
                          **held).items():
        torch.testing.assert_close(value, others[key], rtol=1e-5, atol=1e-5)
    unchanged = consensus.to_torch_state_dict()
    for fields in ({}, {"safeguard_consensus_round": 2, "safeguard_consensus_examples": 4.0 * n, **held},
                   {"safeguard_consensus_round": 3, "safeguard_consensus_examples": float(n), **held},
                   {"safeguard_consensus_round": 3, "safeguard_consensus_examples": 3.0 * n,
                    "safeguard_consensus_clients": [2, 5]}):
        # not its round, it was the only one trained, or its reply was dropped (not in the mean)
        for key, value in loo(**fields).items():
            assert torch.equal(value, unchanged[key])
    # the choice tests the mixes with it: a consensus that is only its own update plus the others'
    # mean scores as the others' mean (the own model and the others' mean: the same mix choice)
    ins = EvaluateInstructions.read(evaluate_config())
    guard = _guard(**GUARD, safeguard_margin=1.0, safeguard_consensus_round=3,
                   safeguard_consensus_examples=4.0 * n, safeguard_consensus_clients=[0, 2, 5])
    rt = _runtime(context)
    _, with_loo = safeguard.choose(rt, context, ins, guard, {PERSONAL: consensus})
    fresh = _guard(**GUARD, safeguard_margin=1.0)
    _, direct = safeguard.choose(rt, context, ins, fresh, {PERSONAL: ArrayRecord(others)})
    assert with_loo.weight == direct.weight and with_loo.gains == pytest.approx(direct.gains)
