"""FedCG client cost and balanced pseudo-domains: the grouped one-hot path has the literal eq. 4's
logits and gradients, cached teacher logits give the same replies as fresh ones, and the federated
standardisation + Sinkhorn offsets equal a central Sinkhorn on the union of the clients' logits."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict
from torch.nn import functional as F

from benchmarks.studies.fedcg_cost import variant_messages
from client_app.app import app as client_app
from client_app.methods.fedcg import (
    SAMPLE_STREAM, domain_logits, pseudo_domains, record_fingerprint, teacher_logits,
)
from client_app.runtime import client_runtime
from client_app.training import seeded_generator
from models import build_model
from models.fedcg import DomainClassifier, FedCGModel, FedCGSpec
from strategies.shared.settings import ConfigError
from strategies.shared.run_config import RunConfig
from strategies.shared.run_config import default_run_config
from strategies.methods.fedcg.domain_balance import (
    Labelling, logit_moments, logit_sample, sampled_marginals, sinkhorn_labelling, soft_marginals,
    standardisation,
)
from strategies.methods.fedcg.server import FedCG, fedcg_for
from strategies.shared.phases import run_phases
from strategies.methods.fedcg.domain_graph import inverse_distance_adjacency
from strategies.methods.fedcg.settings import (
    QUERY_FEDCG_BALANCE, STUDENT, TEACHER, TEACHER_LABELLING, FedCGBalanceReply,
    FedCGBalanceRequest, FedCGTrainReply
)
from strategies.shared.messages import CONFIG, METRICS, MODEL, with_client
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
    overrides = {"method": "fedcg", "model": "cnn", "dataset": "digits", "partition": "domains", "num-clients": 4,
                 "max-samples-per-client": 40, "batch-size": 10, "fedcg.bottleneck": 8,
                 "fedcg.domain-stride": 2, "client-threads": 1, **extra}
    return variant_messages(overrides)


def _fresh(context: Context) -> Context:
    return Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config,
                   state=RecordDict(), run_config=context.run_config)


def _arrays(reply) -> dict[str, np.ndarray]:
    return {f"{name}/{k}": v.numpy() for name in (MODEL, STUDENT) for k, v in reply.content[name].items()}


def test_the_cost_benchmark_times_a_balanced_round_one_message():
    """`benchmarks.studies.fedcg_cost` drives the balancing queries through the client's real handler, so its
    FedCG message carries the Sinkhorn labelling (without it the timed epoch is the unbalanced one)."""
    _, messages, _ = _messages()
    assert TEACHER_LABELLING in messages["fedcg"].content
    _, unbalanced, _ = _messages(**{"fedcg.balance": "none"})
    assert TEACHER_LABELLING not in unbalanced["fedcg"].content


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
    logits = teacher_logits(rt, rt.cfg.fedcg, warm, record, x, "train")  # the cached entry: the teacher's logits
    np.testing.assert_allclose(logits.numpy(), domain_logits(_classifier(record), x).numpy(), atol=1e-6)
    torch.manual_seed(5)
    other = ArrayRecord(DomainClassifier((1, 28, 28), D, 2).state_dict())  # a new teacher replaces the entry
    fresh = teacher_logits(rt, rt.cfg.fedcg, warm, other, x, "train")
    np.testing.assert_allclose(fresh.numpy(), domain_logits(_classifier(other), x).numpy(), atol=1e-6)
    assert not np.allclose(fresh.numpy(), logits.numpy())
    assert warm.state[next(k for k in keys if k.endswith(".id"))]["teacher"] == record_fingerprint(other)


def _classifier(record: ArrayRecord) -> DomainClassifier:
    g = DomainClassifier((1, 28, 28), D, 2)
    g.load_state_dict(record.to_torch_state_dict())
    return g


# --- balanced pseudo-domains (§6.9) -----------------------------------------------------------------
def test_pseudo_domains_without_a_labelling_are_the_plain_argmax_bit_for_bit():
    """balance=none: no labelling travels, and d̂ is today's argmax of the teacher's logits."""
    logits = torch.randn(50, D, generator=torch.Generator().manual_seed(1)) + torch.tensor([3.0, 0, 0, 0])
    assert torch.equal(pseudo_domains(logits, None), logits.argmax(dim=1))
    centred = Labelling(np.array([4.5, 1.5, 1.0, 0.0]), np.ones(D), np.zeros(D), 1.0)
    rows = torch.tensor([[5.0, 1.0, 0.0, -9.0], [5.0, 3.0, 0.0, -9.0], [4.0, 1.0, 2.5, -9.0]])
    assert pseudo_domains(rows, None).tolist() == [0, 0, 0]  # the collapse balancing prevents
    assert pseudo_domains(rows, centred).tolist() == [0, 1, 2]  # centering: argmax(z − c)


class _FakeClients:
    """Train clients answering `query.fedcg_balance` from fixed teacher logits, with the client
    half's own functions (`label` drives the strategy's labelling step through them)."""

    def __init__(self, logits: list[torch.Tensor]):
        self.logits, self.asked = logits, []

    def get_node_ids(self):
        return list(range(len(self.logits)))

    def exchange(self, messages, timeout, phase):
        replies = []
        for m in messages:
            z = self.logits[m.metadata.dst_node_id]
            request = FedCGBalanceRequest.read(m.content[CONFIG])
            self.asked.append(request.statistic)
            if request.statistic in ("moments", "sample"):
                n, sums, squares = logit_moments(z)
                rows = None
                if request.statistic == "sample":
                    generator = seeded_generator(request.seed, m.metadata.dst_node_id,
                                                 request.teacher_version, SAMPLE_STREAM)
                    rows = logit_sample(z, request.sample_size, generator).reshape(-1).tolist()
                answer = FedCGBalanceReply(num_examples=n, logit_sum=sums, logit_square_sum=squares,
                                           logit_sample=rows)
            else:
                n, soft, hard = soft_marginals(z, Labelling.from_record(m.content[TEACHER_LABELLING], D))
                answer = FedCGBalanceReply(num_examples=n, soft_sum=soft, hard_counts=hard)
            replies.append((m.metadata.dst_node_id,
                            SimpleNamespace(content=RecordDict({METRICS: answer.metrics()}))))
        return replies

    def label(self, strategy: FedCG) -> None:
        run_phases(strategy.update_labelling(self.get_node_ids()),
                   lambda phase: self.exchange(phase.messages, 0.0, phase.name))


def _balanced_strategy(logits: list[torch.Tensor], **settings) -> tuple[FedCG, _FakeClients]:
    cfg = RunConfig.from_flower({**default_run_config(), "method": "fedcg", "model": "cnn", "dataset": "digits",
                                 "num-clients": len(logits), "fedcg.bottleneck": 4,
                                 **{f"fedcg.{k}": v for k, v in settings.items()}})
    strategy = fedcg_for(cfg)
    grid = _FakeClients(logits)
    torch.manual_seed(0)
    strategy.bind(ArrayRecord(build_model("cnn", (1, 28, 28), 10).state_dict()))
    grid.label(strategy)
    return strategy, grid


def _central_sinkhorn(z: np.ndarray, iters: int, final: float) -> tuple[np.ndarray, np.ndarray]:
    """Sinkhorn–Knopp column scaling on the union of the logits, written out here (float64): the
    standardised scores, and the offsets after `iters` steps with λ geometric from 1 to `final` and
    b carried along (b ← b·λ_i/λ_{i−1}) before each step."""
    zhat = (z - z.mean(axis=0)) / z.std(axis=0)
    b, previous = np.zeros(z.shape[1]), 1.0
    for lam in np.geomspace(1.0, final, iters):
        b = b * lam / previous
        previous = lam
        s = lam * zhat + b
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        b = b - np.log(z.shape[1] * p.mean(axis=0))
    return zhat, b


def test_federated_offsets_equal_a_central_sinkhorn_on_the_union_of_the_logits():
    g = torch.Generator().manual_seed(2)
    logits = [torch.randn(n, D, generator=g) * torch.tensor([1.0, 2.0, 0.5, 1.5]) + torch.tensor([4.0, 0, 1, -1])
              for n in (30, 55, 12, 41)]
    strategy, grid = _balanced_strategy(logits, **{"sinkhorn-iters": 12, "sinkhorn-temperature": 20.0,
                                                   "balance-schedule": "exchange"})
    assert grid.asked.count("moments") == 4 and grid.asked.count("marginals") == 4 * 12
    union = torch.cat(logits).double().numpy()
    zhat, b = _central_sinkhorn(union, 12, 20.0)
    labelling = strategy.labelling
    np.testing.assert_allclose(labelling.mean, union.mean(axis=0), atol=1e-9)
    np.testing.assert_allclose(labelling.scale, union.std(axis=0), atol=1e-9)
    np.testing.assert_allclose(labelling.offset, b, atol=1e-5)
    assert labelling.temperature == 20.0
    scores = labelling.scores(torch.from_numpy(union)).numpy()
    np.testing.assert_allclose(scores, 20.0 * zhat + b, atol=1e-5)
    records = strategy.teacher_records()  # the labelling travels with the teacher
    assert Labelling.from_record(records[TEACHER_LABELLING], D).offset.tolist() == labelling.offset.tolist()


def test_sinkhorn_labelling_over_client_sums_equals_a_central_sinkhorn_and_stops_without_answers():
    """The server's loop (strategies.methods.fedcg.domain_balance.sinkhorn_labelling) fed the clients' soft sums."""
    g = torch.Generator().manual_seed(5)
    logits = [torch.randn(n, D, generator=g) * torch.tensor([0.5, 1.0, 3.0, 1.0]) + torch.tensor([0, 2.0, 0, 1])
              for n in (25, 40, 17)]
    moments = [logit_moments(z) for z in logits]
    mean, sd = standardisation(*zip(*moments))
    asked = []

    def marginals(labelling):
        asked.append(labelling.temperature)
        answers = [soft_marginals(z, labelling) for z in logits]
        return [a[0] for a in answers], [a[1] for a in answers], [a[2] for a in answers]

    labelling, report = sinkhorn_labelling(mean, sd, 9, 50.0, marginals)
    union = torch.cat(logits).double().numpy()
    _, b = _central_sinkhorn(union, 9, 50.0)
    np.testing.assert_allclose(labelling.offset, b, atol=1e-5)
    np.testing.assert_allclose(asked, np.geomspace(1.0, 50.0, 9))
    assert labelling.temperature == 50.0 and sum(report["hard-histogram"]) == len(union)
    silent, report = sinkhorn_labelling(mean, sd, 9, 50.0, lambda labelling: None)
    assert silent.offset.tolist() == [0.0] * D and silent.temperature == 1.0 and report == {}


def test_sampled_schedule_is_one_exchange_and_with_every_row_equals_the_exchange_schedule():
    """balance-schedule=sampled: one `sample` query per client; when the sample holds every row
    (balance-sample ≥ n_k) the labelling is the per-scaling exchange schedule's; with fewer rows the
    n_k/m_k-scaled sample marginals still balance the hard labels of all the images."""
    g = torch.Generator().manual_seed(7)
    logits = [torch.randn(n, D, generator=g) * torch.tensor([1.0, 2.0, 0.5, 1.5]) + torch.tensor([4.0, 0, 1, -1])
              for n in (30, 55, 12, 41)]
    settings = {"sinkhorn-iters": 12, "sinkhorn-temperature": 20.0}
    exchange, grid = _balanced_strategy(logits, **settings, **{"balance-schedule": "exchange"})
    assert len(grid.asked) == 4 * 13
    whole, grid = _balanced_strategy(logits, **settings, **{"balance-sample": 55})
    assert grid.asked == ["sample"] * 4 and whole.balance_report["sampled-rows"] == 30 + 55 + 12 + 41
    for field in ("mean", "scale", "offset"):
        np.testing.assert_allclose(getattr(whole.labelling, field), getattr(exchange.labelling, field),
                                   rtol=1e-9, atol=1e-9)
    assert whole.labelling.temperature == exchange.labelling.temperature == 20.0
    few, grid = _balanced_strategy(logits, **settings, **{"balance-sample": 8})
    assert grid.asked == ["sample"] * 4 and few.balance_report["sampled-rows"] == 4 * 8
    np.testing.assert_allclose(few.labelling.mean, exchange.labelling.mean, atol=1e-9)  # exact moments
    assert not np.allclose(few.labelling.offset, exchange.labelling.offset)  # estimated from 32 rows
    hist = np.bincount(few.labelling.pseudo_domains(torch.cat(logits)).numpy(), minlength=D)
    assert hist.max() / hist.sum() <= 0.4, hist


def test_sampled_marginals_weigh_each_client_by_its_images_and_stop_without_samples():
    z = [torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64), torch.tensor([[2.0, 0.0]], dtype=torch.float64)]
    labelling = Labelling(np.zeros(2), np.ones(2), np.zeros(2), 1.0)
    counts, soft, hard = sampled_marginals([(10, z[0]), (3, z[1]), (5, z[0][:0])])(labelling)
    assert counts == [10, 3] and hard == [[1, 1], [1, 0]]
    np.testing.assert_allclose(soft[0], [5.0, 5.0])  # (10/2)·(softmax rows summed = [1, 1])
    np.testing.assert_allclose(soft[1], 3.0 * torch.softmax(z[1][0], 0).numpy())
    assert sampled_marginals([(4, z[0][:0])])(labelling) is None


def test_a_teacher_with_every_image_in_one_domain_still_gives_balanced_hard_labels():
    g = torch.Generator().manual_seed(4)
    logits = [torch.randn(n, D, generator=g) * 0.3 + torch.tensor([6.0, 0.0, 0.0, 0.0]) for n in (80, 120, 60)]
    assert all(bool((z.argmax(dim=1) == 0).all()) for z in logits)  # collapsed without balancing
    for schedule in ("exchange", "sampled"):  # shipped defaults: 30 steps to λ = 100
        strategy, _ = _balanced_strategy(logits, **{"balance-schedule": schedule})
        hist = np.bincount(strategy.labelling.pseudo_domains(torch.cat(logits)).numpy(), minlength=D)
        assert hist.max() / hist.sum() <= 1 / D + (0.05 if schedule == "exchange" else 0.1), (schedule, hist)
        assert strategy.balance_report["hard-histogram"] is not None
    centred, grid = _balanced_strategy(logits, balance="centering")
    assert grid.asked == ["moments"] * 3 and centred.labelling.temperature == 1.0
    plain, grid = _balanced_strategy(logits, balance="none")
    assert grid.asked == [] and plain.labelling is None and TEACHER_LABELLING not in plain.teacher_records()


def test_labelling_is_formed_once_per_teacher():
    logits = [torch.randn(20, D, generator=torch.Generator().manual_seed(c)) for c in range(3)]
    strategy, grid = _balanced_strategy(logits, **{"sinkhorn-iters": 3})
    asked = len(grid.asked)
    grid.label(strategy)  # same teacher: no new query
    assert len(grid.asked) == asked
    strategy.teacher, strategy.teacher_version = strategy.student, 1  # φ ← ϕ (as aggregate_train)
    assert TEACHER_LABELLING not in strategy.teacher_records()
    grid.label(strategy)
    assert len(grid.asked) == 2 * asked and TEACHER_LABELLING in strategy.teacher_records()


def test_balance_query_reply_sums_the_teacher_logits_of_the_training_images():
    _, messages, context = _messages()
    message = messages["fedcg"]
    rt = client_runtime(message, context)
    x, _ = rt.tensors("train")
    z = domain_logits(_classifier(message.content[TEACHER]), x).double()
    labelling = Labelling(np.zeros(D), np.ones(D), np.array([0.5, 0.0, -0.5, 0.0]), 3.0)
    for statistic in ("moments", "marginals", "sample"):
        request = FedCGBalanceRequest(statistic=statistic)
        if statistic == "sample":
            request = FedCGBalanceRequest(statistic=statistic, sample_size=5, seed=3, teacher_version=2)
        content = {TEACHER: message.content[TEACHER], TEACHER_LABELLING: labelling.record(),
                   CONFIG: request.config()}
        request = Message(with_client(RecordDict(content), 0), dst_node_id=1, message_type=QUERY_FEDCG_BALANCE)
        request.metadata.__dict__["_message_id"] = f"balance-{statistic}"
        reply = client_app(request, _fresh(context))
        assert not reply.has_error(), reply.error
        answer = FedCGBalanceReply.read(reply.content[METRICS])
        assert answer.num_examples == len(x)
        if statistic in ("moments", "sample"):
            np.testing.assert_allclose(answer.logit_sum, z.sum(dim=0).numpy(), rtol=1e-5)
            np.testing.assert_allclose(answer.logit_square_sum, (z * z).sum(dim=0).numpy(), rtol=1e-5)
        if statistic == "sample":  # 5 of the client's rows, drawn by (seed, client, teacher version)
            rows = torch.tensor(answer.logit_sample, dtype=torch.float64).reshape(5, D)
            picked = torch.randperm(len(x), generator=seeded_generator(3, rt.client_id, 2, SAMPLE_STREAM))[:5]
            np.testing.assert_allclose(rows.numpy(), z[picked].numpy(), rtol=1e-6)
        if statistic == "marginals":
            p = torch.softmax(3.0 * z + torch.tensor([0.5, 0.0, -0.5, 0.0], dtype=torch.float64), dim=1)
            np.testing.assert_allclose(answer.soft_sum, p.sum(dim=0).numpy(), rtol=1e-5)
            assert sum(answer.hard_counts) == len(x)


def test_config_balance_modes_and_the_centering_alias():
    base = {**default_run_config(), "method": "fedcg", "model": "cnn"}
    assert RunConfig.from_flower(base).fedcg.balance == "sinkhorn"  # the shipped default
    assert RunConfig.from_flower(base).fedcg.balance_schedule == "sampled"
    alias = RunConfig.from_flower({**base, "fedcg.teacher-centering": True})
    assert alias.fedcg.balance == "centering" and alias.flat()["fedcg.balance"] == "centering"
    with pytest.raises(ConfigError, match="fedcg.teacher-centering"):
        RunConfig.from_flower({**base, "fedcg.teacher-centering": True, "fedcg.clustering": "kmeans"})
    with pytest.raises(ConfigError, match="fedcg.balance = 'none' is set"):
        RunConfig.from_flower({**base, "fedcg.teacher-centering": True, "fedcg.balance": "none"})
    with pytest.raises(ConfigError, match="fedcg.balance"):
        RunConfig.from_flower({**base, "fedcg.balance": "kmeans"})
