"""FedCG client cost and teacher centering: the grouped one-hot path has the literal eq. 4's logits and
gradients, cached teacher logits give the same replies as fresh ones, and the teacher centre c is the
federated mean teacher logit (fedcg.teacher-centering)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict
from torch.nn import functional as F

from benchmarks.fedcg_cost import variant_messages
from client_app.app import app as client_app
from client_app.fedcg import domain_logits, pseudo_domains, record_fingerprint, teacher_logits
from client_app.runtime import client_runtime
from models import build_model
from models.fedcg import DomainClassifier, FedCGModel, FedCGSpec
from server_app.config import ConfigError, RunConfig
from server_app.simulate import default_run_config, simulate
from strategies.fedcg import FedCG, inverse_distance_adjacency
from strategies.messages import (
    CENTRE_C, METRICS, MODEL, QUERY_FEDCG_CENTRE, STUDENT, TEACHER, TEACHER_CENTRE, FedCGCentreReply,
    FedCGTrainReply, with_client,
)
from tests.test_fedcg import _literal_layer

D = 4


# --- eq. 4 with one-hot w: one conv per present domain = D branch convs over the whole batch -------
@pytest.mark.parametrize("spec", [dict(), dict(residual=False), dict(layers="all", use_w=False)])
def test_grouped_one_hot_path_has_the_literal_logits_and_gradients(spec):
    a = inverse_distance_adjacency(torch.randn(D, 50, generator=torch.Generator().manual_seed(3)), 0.5)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = FedCGModel(build_model("cnn", (1, 28, 28), 10), FedCGSpec(num_domains=D, **spec))
        model.set_adjacency(a)
        for layer in model.fedcg_layers():
            with torch.no_grad():
                layer.lambda_.fill_(0.7)
        models.append(model)
    grouped, literal = models
    x, y = torch.randn(12, 1, 28, 28), torch.randint(0, 10, (12,))
    ids = torch.tensor([3, 0, 2, 2, 0, 3, 3, 1, 0, 2, 3, 3])
    onehot = F.one_hot(ids, D).float()
    for layer in literal.fedcg_layers():  # every branch conv over the whole batch, weighted by w
        layer.forward = lambda z, layer=layer: _literal_layer(layer, z, onehot, layer.node_features(a))
    out_grouped, out_literal = grouped(x, ids), literal(x, ids)
    np.testing.assert_allclose(out_grouped.detach().numpy(), out_literal.detach().numpy(), atol=2e-5)
    F.cross_entropy(out_grouped, y).backward()
    F.cross_entropy(out_literal, y).backward()
    names = [n for n, p in grouped.named_parameters() if p.grad is not None]
    assert any(n.endswith(".V") for n in names)
    if spec.get("residual", True):  # θ_a and λ enter eq. 4 only with the residual
        assert any(n.endswith(".lambda") for n in names) and any(n.endswith("agnostic.weight") for n in names)
    if spec.get("use_w", True):
        assert any(n.endswith(".W1") for n in names) and any(n.endswith(".W2") for n in names)
    reference = dict(literal.named_parameters())
    for name, p in grouped.named_parameters():
        if p.grad is None:
            assert reference[name].grad is None, name
            continue
        scale = float(reference[name].grad.abs().max()) + 1e-12
        np.testing.assert_allclose(p.grad.numpy() / scale, reference[name].grad.numpy() / scale,
                                   atol=1e-4, err_msg=name)


# --- teacher logits cached per teacher in context.state ------------------------------------------
def _messages(**extra):
    overrides = {"method": "fedcg", "dataset": "digits", "partition": "domains", "num-clients": 4,
                 "max-samples-per-client": 40, "batch-size": 10, "fedcg.bottleneck": 8,
                 "fedcg.domain-stride": 2, "client-threads": 1, **extra}
    return variant_messages(overrides)


def _fresh(context: Context) -> Context:
    return Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config,
                   state=RecordDict(), run_config=context.run_config)


def _arrays(reply) -> dict[str, np.ndarray]:
    return {f"{name}/{k}": v.numpy() for name in (MODEL, STUDENT) for k, v in reply.content[name].items()}


def test_cached_teacher_logits_give_the_same_reply_and_a_new_teacher_replaces_them():
    _, messages, context = _messages()
    message = messages["fedcg"]
    first = client_app(message, _fresh(context))
    warm = _fresh(context)
    client_app(message, warm)  # fills the cache
    keys = [k for k in warm.state.keys() if k.startswith("fedcg.teacher.train.")]
    assert len(keys) == 2  # the logits and the teacher they belong to
    cached = client_app(message, warm)
    assert not first.has_error() and not cached.has_error()
    a, b = _arrays(first), _arrays(cached)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    m1, m2 = (FedCGTrainReply.read(r.content[METRICS]) for r in (first, cached))
    assert m1 == m2

    rt = client_runtime(message, warm)
    x, _ = rt.tensors("train")
    record = message.content[TEACHER]
    logits = teacher_logits(rt, warm, record, x, "train")  # the cached entry: the teacher's logits
    np.testing.assert_allclose(logits.numpy(), domain_logits(_classifier(record), x).numpy(), atol=1e-6)
    torch.manual_seed(5)
    other = ArrayRecord(DomainClassifier(1, D, 2).state_dict())  # a new teacher replaces the entry
    fresh = teacher_logits(rt, warm, other, x, "train")
    np.testing.assert_allclose(fresh.numpy(), domain_logits(_classifier(other), x).numpy(), atol=1e-6)
    assert not np.allclose(fresh.numpy(), logits.numpy())
    assert warm.state[next(k for k in keys if k.endswith(".id"))]["teacher"] == record_fingerprint(other)


def _classifier(record: ArrayRecord) -> DomainClassifier:
    g = DomainClassifier(1, D, 2)
    g.load_state_dict(record.to_torch_state_dict())
    return g


# --- teacher centering ---------------------------------------------------------------------------
def test_pseudo_domains_subtract_the_centre_before_the_argmax():
    logits = torch.tensor([[5.0, 1.0, 0.0], [5.0, 3.0, 0.0], [4.0, 1.0, 2.5]])
    assert pseudo_domains(logits, None).tolist() == [0, 0, 0]  # the collapse the option prevents
    assert pseudo_domains(logits, torch.tensor([4.5, 1.5, 1.0])).tolist() == [0, 1, 2]


def test_centre_query_reply_is_the_mean_teacher_logit_of_the_training_images():
    _, messages, context = _messages()
    message = messages["fedcg"]
    request = Message(with_client(RecordDict({TEACHER: message.content[TEACHER]}), 0), dst_node_id=1,
                      message_type=QUERY_FEDCG_CENTRE)
    request.metadata.__dict__["_message_id"] = "centre-query"
    reply = client_app(request, _fresh(context))
    assert not reply.has_error(), reply.error
    answer = FedCGCentreReply.read(reply.content[METRICS])
    rt = client_runtime(message, context)
    x, _ = rt.tensors("train")
    assert answer.num_examples == len(x)
    expected = domain_logits(_classifier(message.content[TEACHER]), x).mean(dim=0)
    np.testing.assert_allclose(answer.logit_mean, expected.numpy(), atol=1e-5)


def _centre_reply(n: int, mean):
    return SimpleNamespace(content=RecordDict({METRICS: FedCGCentreReply(
        num_examples=n, logit_mean=list(mean)).metrics()}))


def test_server_centre_is_the_weighted_mean_formed_once_per_teacher():
    cfg = RunConfig.from_flower({**default_run_config(), "method": "fedcg", "dataset": "digits",
                                 "fedcg.bottleneck": 4, "fedcg.teacher-centering": True})
    strategy = FedCG(cfg)
    asked = []

    def exchange(messages, timeout, phase):
        asked.append(sorted(m.metadata.dst_node_id for m in messages))
        assert all(TEACHER in m.content for m in messages)
        return [(0, _centre_reply(10, [1.0, 2.0, 3.0, 4.0])), (1, _centre_reply(30, [5.0, 6.0, 7.0, 8.0])),
                (2, _centre_reply(50, [1.0, float("nan"), 0.0, 0.0])),  # malformed: skipped
                (3, _centre_reply(50, [1.0, 2.0]))]

    grid = SimpleNamespace(get_node_ids=lambda: list(range(cfg.num_clients)), exchange=exchange)
    torch.manual_seed(0)
    strategy._bind(ArrayRecord(build_model("cnn", (1, 28, 28), 10).state_dict()), grid)
    strategy.update_centre(grid)
    np.testing.assert_allclose(strategy.centre.numpy(), [4.0, 5.0, 6.0, 7.0], atol=1e-6)
    records = strategy.teacher_records()
    np.testing.assert_allclose(records[TEACHER_CENTRE][CENTRE_C].numpy(), [4.0, 5.0, 6.0, 7.0])
    strategy.update_centre(grid)  # same teacher: no new query
    assert len(asked) == 1 and asked[0] == list(range(cfg.num_clients))
    strategy.teacher, strategy.teacher_version = strategy.student, 1  # φ ← ϕ (as aggregate_train)
    assert TEACHER_CENTRE not in strategy.teacher_records()
    strategy.update_centre(grid)
    assert len(asked) == 2 and TEACHER_CENTRE in strategy.teacher_records()


def test_config_rejects_centering_without_the_teacher():
    with pytest.raises(ConfigError, match="fedcg.teacher-centering"):
        RunConfig.from_flower({**default_run_config(), "method": "fedcg",
                               "fedcg.teacher-centering": True, "fedcg.clustering": "kmeans"})


def test_centered_federation_sends_the_centre_and_reports_it(tiny_run, tmp_path):
    summary = simulate({**tiny_run, "method": "fedcg", "model": "cnn", "partition": "domains",
                        "num-clients": 8, "num-rounds": 3, "max-samples-per-client": 40,
                        "batch-size": 10, "domain-test-clients": 0.5, "fedcg.teacher-period": 2,
                        "fedcg.adj-warmup": 2, "fedcg.bottleneck": 8, "fedcg.domain-stride": 2,
                        "fedcg.teacher-centering": True, "client-threads": 1}, num_nodes=2)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    centres = [r["fedcg"]["teacher-centre"] for r in rounds[1:]]  # c of each round's evaluation
    assert all(len(c) == D for c in centres)
    assert centres[0] != centres[1] == centres[2]  # φ ← ϕ after round 2: a new centre, then kept
    assert all(sum(r["fedcg"]["domain-histogram"]) == 4 * 40 for r in rounds[1:])
    assert summary["fedcg"]["settings"]["teacher-centering"] is True
    assert summary["fedcg"]["nmi"]["teacher-round-0"] is not None
