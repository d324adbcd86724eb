"""FedCG (docs/methods/fedcg.md): the FedCG layer (eq. 4–5), the adjacency (eq. 6–7), teacher replacement
every T rounds, soft domain weights, V̂ precomputation, the held-out domains partition, config checks
and small whole federations."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from torch.nn import functional as F

from client_app.methods.fedcg import domain_probabilities
from datasets.partition import PartitionSpec, heldout_test_clients, make_partition
from models import build_model
from models.fedcg import DomainClassifier, FedCGConv, FedCGModel, FedCGSpec
from strategies.shared.settings import ConfigError
from strategies.shared.run_config import RunConfig
from server_app.harness.simulate import simulate
from strategies.shared.run_config import default_run_config
from strategies.methods.fedcg.server import fedcg_for
from strategies.methods.fedcg.domain_graph import inverse_distance_adjacency, random_adjacency, uniform_adjacency
from server_app.clients import TrainClients
from strategies.methods.fedcg.report import nmi_from_counts
from strategies.methods.fedcg.settings import STUDENT, FedCGTrainReply
from strategies.shared.messages import METRICS, MODEL

D = 4


def _model(name="cnn", shape=(1, 28, 28), seed=0, **spec) -> FedCGModel:
    torch.manual_seed(seed)
    return FedCGModel(build_model(name, shape, 10), FedCGSpec(num_domains=D, **spec))


def _dense_adjacency():
    rows = torch.randn(D, 50, generator=torch.Generator().manual_seed(3))
    return inverse_distance_adjacency(rows, 0.5)


def _literal_layer(layer: FedCGConv, x: torch.Tensor, weights: torch.Tensor, v_hat: torch.Tensor):
    """Eq. 4 written out: f(x; θ_a) + λ Σ_d w_d f(x; θ̂^d), every branch a separate conv."""
    conv = layer.agnostic
    out = conv(x) if layer.spec.residual else 0.0
    scale = layer.lambda_ if layer.spec.residual else 1.0
    for d in range(len(v_hat)):
        kernel = v_hat[d, : layer.kernel_size].reshape(conv.weight.shape)
        bias = v_hat[d, layer.kernel_size :] if conv.bias is not None else None
        branch = F.conv2d(x, kernel, bias, conv.stride, conv.padding)
        out = out + scale * weights[:, d, None, None, None] * branch
    return out


# --- eq. 6–7 ---------------------------------------------------------------------------------------
def test_adjacency_is_row_stochastic_with_diagonal_beta_and_favours_close_branches():
    rows = torch.zeros(4, 6)
    rows[1, 0] = 1.0  # close to row 0
    rows[2, 0] = 5.0
    rows[3, 0] = -9.0  # far from everyone
    for beta in (0.5, 0.2):
        a = inverse_distance_adjacency(rows, beta)
        np.testing.assert_allclose(a.sum(dim=1).numpy(), np.ones(4), atol=1e-6)
        np.testing.assert_allclose(a.diagonal().numpy(), np.full(4, beta), atol=1e-7)
    a = inverse_distance_adjacency(rows, 0.5)
    # h_01 = 1/1, h_02 = 1/5, h_03 = 1/9 → A_0j ∝ h_0j, summing to 1 − β
    h = np.array([1.0, 1 / 5, 1 / 9])
    np.testing.assert_allclose(a[0, 1:].numpy(), 0.5 * h / h.sum(), rtol=1e-5)
    assert a[0, 1] > a[0, 2] > a[0, 3]
    for other in (uniform_adjacency(4, 0.5), random_adjacency(4, 0.5, seed=1)):
        np.testing.assert_allclose(other.sum(dim=1).numpy(), np.ones(4), atol=1e-6)
        np.testing.assert_allclose(other.diagonal().numpy(), np.full(4, 0.5), atol=1e-7)
    np.testing.assert_allclose(uniform_adjacency(4, 0.5)[0, 1:].numpy(), np.full(3, 0.5 / 3), atol=1e-7)


# --- eq. 4–5 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [
    dict(), dict(gcn_layers=1, layers="last"), dict(use_w=False), dict(relu=False),
    dict(residual=False), dict(layers="all"),
])
def test_hard_and_soft_paths_equal_the_literal_equation(spec):
    if spec.get("gcn_layers") == 1:  # the 1-layer W needs a small layer: a custom 8-channel conv
        torch.manual_seed(0)
        layer = FedCGConv(torch.nn.Conv2d(2, 3, 3, padding=1), FedCGSpec(num_domains=D, gcn_layers=1))
        x = torch.randn(6, 2, 7, 7)
    else:
        model = _model(**spec)
        layer = list(model.fedcg_layers())[-1]
        x = torch.randn(6, layer.agnostic.in_channels, 14, 14)
    with torch.no_grad():
        layer.lambda_.fill_(0.7)
    a = _dense_adjacency()
    v_hat = layer.node_features(a)
    ids = torch.tensor([0, 2, 2, 3, 1, 0])
    layer.bind(a, ids)
    hard = layer(x)
    np.testing.assert_allclose(hard.detach().numpy(),
                               _literal_layer(layer, x, F.one_hot(ids, D).float(), v_hat).detach().numpy(),
                               atol=2e-5)
    soft_w = torch.softmax(torch.randn(6, D), dim=1)
    layer.bind(a, soft_w)
    np.testing.assert_allclose(layer(x).detach().numpy(),
                               _literal_layer(layer, x, soft_w, v_hat).detach().numpy(), atol=2e-5)
    layer.bind(a, F.one_hot(ids, D).float())  # soft path with one-hot weights = hard path
    np.testing.assert_allclose(layer(x).detach().numpy(), hard.detach().numpy(), atol=2e-5)


def test_gcn_forms_and_v_hat_rows_reshape_to_branch_tensors():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 5, 3)
    a = _dense_adjacency()
    one = FedCGConv(conv, FedCGSpec(num_domains=D, gcn_layers=1))
    np.testing.assert_allclose(one.node_features(a).detach().numpy(),
                               F.relu(a @ one.V @ one.W).detach().numpy(), atol=1e-6)
    two = FedCGConv(conv, FedCGSpec(num_domains=D, bottleneck=7))
    assert tuple(two.W1.shape) == (5 * 3 * 9 + 5, 7) and tuple(two.W2.shape) == (7, 5 * 3 * 9 + 5)
    expected = F.relu(a @ F.relu(a @ two.V @ two.W1) @ two.W2)
    v_hat = two.node_features(a)
    np.testing.assert_allclose(v_hat.detach().numpy(), expected.detach().numpy(), atol=1e-6)
    kernels, biases = two.branch_parameters(v_hat)
    assert tuple(kernels.shape) == (D, 5, 3, 3, 3) and tuple(biases.shape) == (D, 5)
    np.testing.assert_array_equal(kernels[2].reshape(-1).detach().numpy(),
                                  v_hat[2, :135].detach().numpy())
    np.testing.assert_array_equal(biases[2].detach().numpy(), v_hat[2, 135:].detach().numpy())
    free = FedCGConv(conv, FedCGSpec(num_domains=D, use_w=False, relu=False))
    np.testing.assert_allclose(free.node_features(a).detach().numpy(), (a @ a @ free.V).detach().numpy(),
                               atol=1e-6)
    with pytest.raises(ValueError, match="fedcg.gcn-layers=1"):
        FedCGConv(torch.nn.Conv2d(16, 32, 5), FedCGSpec(gcn_layers=1))


def test_scaled_gcn_init_keeps_the_branch_rows_scale_and_glorot_shrinks_them():
    """fedcg.gcn-init: `scaled` keeps V's second moment through the GCN (up to the final ReLU's
    half), Glorot (the spec's init) shrinks the cnn's last-layer branches ~20×."""
    a = torch.eye(D)
    ratios = {}
    for init in ("glorot", "scaled"):
        torch.manual_seed(0)
        layer = FedCGConv(torch.nn.Conv2d(16, 32, 5, padding=2), FedCGSpec(num_domains=D, gcn_init=init))
        v_hat = layer.node_features(a).detach()
        ratios[init] = float(v_hat.pow(2).mean() / layer.V.detach().pow(2).mean())
    assert 0.25 < ratios["scaled"] < 1.0, ratios  # E[relu(h)²] = E[h²]/2 with E[h²] = E[V²]
    assert ratios["glorot"] < 0.01, ratios
    one = FedCGConv(torch.nn.Conv2d(2, 3, 3), FedCGSpec(num_domains=D, gcn_layers=1, gcn_init="scaled"))
    assert abs(float(one.W.detach().var()) * one.q - 1.0) < 0.1
    with pytest.raises(ValueError, match="fedcg.gcn-init"):
        FedCGSpec(gcn_init="he")
    with pytest.raises(ConfigError, match="gcn.init"):
        RunConfig.from_flower({**default_run_config(), "method": "fedcg", "model": "cnn", "fedcg.gcn-init": "he"})


@pytest.mark.parametrize("gcn_layers", [1, 2])
def test_zero_gcn_init_starts_as_the_backbone_and_the_branches_then_learn(gcn_layers):
    """fedcg.gcn-init='zero' (linear GCN): V̂ = 0 at init, so the FedCG model computes exactly its
    backbone for any domain weights; one SGD step on one domain makes the branches differ from 0."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2, 3, 3, padding=1)
    spec = FedCGSpec(num_domains=D, gcn_layers=gcn_layers, gcn_init="zero", relu=False, lambda_init=1.0)
    layer = FedCGConv(conv, spec)
    a = _dense_adjacency()
    assert float(layer.node_features(a).detach().abs().max()) == 0.0
    x = torch.randn(6, 2, 5, 5)
    plain = conv(x).detach()
    for domains in (torch.tensor([0, 1, 2, 3, 0, 1]), torch.softmax(torch.randn(6, D), dim=1)):
        layer.bind(a, domains)
        np.testing.assert_allclose(layer(x).detach().numpy(), plain.numpy(), atol=1e-6)
    layer.bind(a, torch.full((6,), 2))
    layer(x).pow(2).sum().backward()
    last = layer.W if gcn_layers == 1 else layer.W2
    assert float(last.grad.abs().sum()) > 0
    with torch.no_grad():
        last -= 0.1 * last.grad
    assert float(layer.node_features(a).detach().abs().max()) > 0
    with pytest.raises(ValueError, match="fedcg.relu=false"):
        FedCGSpec(gcn_init="zero")  # a ReLU at 0 passes no gradient: the branches would stay 0
    with pytest.raises(ConfigError, match="fedcg.relu=false"):
        RunConfig.from_flower({**default_run_config(), "method": "fedcg", "model": "cnn",
                               "fedcg.gcn-init": "zero"})


@pytest.mark.parametrize("use_w,gcn_layers", [(True, 2), (False, 2), (False, 1)])
def test_loss_on_one_domain_reaches_every_branch_row_when_a_is_not_identity(use_w, gcn_layers):
    model = _model(use_w=use_w, gcn_layers=gcn_layers, relu=False)
    model.set_adjacency(_dense_adjacency())
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    F.cross_entropy(model(x, torch.full((8,), 2)), y).backward()
    layer = list(model.fedcg_layers())[-1]
    assert (layer.V.grad.abs().sum(dim=1) > 0).all()  # every row of V
    assert layer.lambda_.grad.abs().item() > 0
    model.zero_grad()
    model.set_adjacency(torch.eye(D))  # A = I: only the domain's own row learns
    F.cross_entropy(model(x, torch.full((8,), 2)), y).backward()
    norms = layer.V.grad.abs().sum(dim=1)
    assert norms[2] > 0 and float(norms[[0, 1, 3]].sum()) == 0.0


@pytest.mark.parametrize("name,shape,spec", [
    ("cnn", (1, 28, 28), dict(layers="all")),
    ("leaf-cnn", (1, 28, 28), dict(bottleneck=8)),
    ("resnet9", (3, 32, 32), dict(use_w=False)),
    ("resnet9", (3, 32, 32), dict(use_w=False, layers="all")),
])
def test_precomputed_branches_give_the_training_path_logits_on_every_backbone(name, shape, spec):
    model = _model(name, shape, **spec)
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in build_model(name, shape, 10).modules())
    assert len(model.layer_names) == (convs if spec.get("layers") == "all" else 1)
    model.set_adjacency(_dense_adjacency())
    model.eval()
    x = torch.randn(3, *shape)
    w = torch.softmax(torch.randn(3, D), dim=1)
    with torch.no_grad():
        live = model(x, w)
        model.precompute_branches()
        cached = model(x, w)
    assert tuple(live.shape) == (3, 10)
    np.testing.assert_allclose(cached.numpy(), live.numpy(), atol=1e-5)


def test_soft_domain_weights_sum_to_one_and_classifier_shape():
    torch.manual_seed(0)
    g = DomainClassifier((1, 28, 28), D)
    assert [type(m).__name__ for m in g] == ["Conv2d", "ReLU", "Conv2d", "ReLU", "AdaptiveAvgPool2d",
                                             "Flatten", "Linear"]
    assert (g[0].out_channels, g[2].out_channels, g[-1].out_features) == (32, 64, D)
    w = domain_probabilities(g, torch.randn(300, 1, 28, 28))
    assert tuple(w.shape) == (300, D)
    np.testing.assert_allclose(w.sum(dim=1).numpy(), np.ones(300), atol=1e-6)
    assert (w >= 0).all()


@pytest.mark.parametrize("pool, stride, features", [("global", 1, 64), ("avg2", 1, 256), ("avg2", 2, 256),
                                                    ("flatten", 1, 64 * 28 * 28), ("flatten", 2, 64 * 7 * 7)])
def test_classifier_pooling_sets_the_linear_layer_input(pool, stride, features):
    g = DomainClassifier((1, 28, 28), D, stride, pool)
    assert g[-1].in_features == features
    assert tuple(g(torch.randn(3, 1, 28, 28)).shape) == (3, D)
    assert ("AdaptiveAvgPool2d" in [type(m).__name__ for m in g]) == (pool != "flatten")
    with pytest.raises(ValueError, match="fedcg.classifier-pool"):
        DomainClassifier((1, 28, 28), D, 1, "max")


# --- server: FedAvg, teacher every T rounds, adjacency after the warm-up ---------------------------
def _reply(record: ArrayRecord, student: ArrayRecord, n: int, client: int):
    metrics = FedCGTrainReply(num_examples=n, train_loss=1.0, student_loss=0.5, student_agreement=0.5,
                              domain_counts=[n, 0, 0, 0], student_counts=[0, n, 0, 0]).metrics()
    return SimpleNamespace(has_error=lambda: False, client=client,
                           content=RecordDict({MODEL: record, STUDENT: student, METRICS: metrics}))


def _perturbed(record: ArrayRecord, seed: int) -> ArrayRecord:
    g = torch.Generator().manual_seed(seed)
    return ArrayRecord({k: (v + 0.01 * torch.randn(v.shape, generator=g)) if v.is_floating_point() else v
                        for k, v in record.to_torch_state_dict().items()})


def test_teacher_changes_exactly_at_multiples_of_t_and_adjacency_after_warmup():
    cfg = RunConfig.from_flower({**default_run_config(), "method": "fedcg", "model": "cnn", "dataset": "digits",
                                 "fedcg.teacher-period": 3, "fedcg.adj-warmup": 2, "fedcg.bottleneck": 4})
    strategy = fedcg_for(cfg)
    torch.manual_seed(0)
    strategy.bind(ArrayRecord(build_model("cnn", (1, 28, 28), 10).state_dict()))
    changed, identity = [], []
    for t in range(1, 8):
        before = strategy.teacher
        replies = [_reply(_perturbed(strategy.model, 10 * t + i), _perturbed(strategy.student, 10 * t + i + 5),
                          n=20 + i, client=i) for i in range(3)]
        # FedAvg (eq. 2) of the model rows, weighted by num-examples
        rows = torch.stack([strategy.model_layout.row(r.content[MODEL]) for r in replies])
        expected = (torch.tensor([20.0, 21.0, 22.0]) / 63.0) @ rows
        strategy.aggregate_train(t, [(r.client, r) for r in replies])
        np.testing.assert_allclose(strategy.model_layout.row(strategy.model).numpy(), expected.numpy(),
                                   atol=1e-6)
        same = all(np.array_equal(before[k].numpy(), strategy.teacher[k].numpy()) for k in before.keys())
        changed.append(not same)
        identity.append(bool(torch.equal(strategy.adjacency, torch.eye(D))))
        if not same:  # φ ← ϕ: the teacher is now exactly the aggregated student
            assert all(np.array_equal(strategy.teacher[k].numpy(), strategy.student[k].numpy())
                       for k in strategy.student.keys())
    assert changed == [False, False, True, False, False, True, False]
    assert identity == [True, False, False, False, False, False, False]
    np.testing.assert_allclose(strategy.adjacency.sum(dim=1).numpy(), np.ones(D), atol=1e-6)
    assert strategy.round_report(3)["fedcg"]["teacher-replaced"] is True


def test_nmi_from_counts():
    assert nmi_from_counts(np.diag([5, 7, 3])) == pytest.approx(1.0)
    assert nmi_from_counts(np.full((3, 3), 4)) == pytest.approx(0.0, abs=1e-12)
    assert nmi_from_counts(np.zeros((2, 2))) is None


def test_nmi_is_per_image_on_clients_that_hold_two_domains():
    """Two clients, each half domain 0 and half domain 1, and a discovery that finds exactly the
    domains: per image NMI = 1; adding each client's counts to its first domain would say 0."""
    labels = np.arange(400) % 10
    spec = PartitionSpec("domains", 2, family="styles", styles=("plain", "inverted"), domains_per_client=2,
                         test_fraction=0.0)
    truth = make_partition(labels, spec)
    cfg = RunConfig.from_flower({**default_run_config(), "method": "fedcg", "model": "cnn", "fedcg.domains": 2})
    strategy = fedcg_for(cfg, truth)
    per_image = []
    for c in range(2):  # discovered domain = true domain (labels 1 ↔ 0 swapped: NMI ignores names)
        true = truth.train_domains[c]
        joint = np.zeros((2, 2), dtype=np.int64)
        np.add.at(joint, (true, 1 - true), 1)
        per_image.append(joint.reshape(-1).tolist())
    counts = [np.asarray(t).reshape(2, 2).sum(axis=0).tolist() for t in per_image]
    assert counts == [[100, 100], [100, 100]]
    assert nmi_from_counts(strategy._truth_table([0, 1], counts, per_image)) == pytest.approx(1.0)
    assert nmi_from_counts(strategy._truth_table([0, 1], counts)) == pytest.approx(0.0, abs=1e-12)


# --- data: whole held-out test clients with an unseen domain ----------------------------------------
def test_domains_partition_holds_out_whole_test_clients_with_an_unseen_rotation():
    labels = np.arange(2000) % 10
    spec = PartitionSpec("domains", 20, rotations=(0, 90, 180, 270), test_clients=0.25,
                         unseen_rotations=(45,))
    p = make_partition(labels, spec)
    test = set(heldout_test_clients(spec).tolist())
    assert test == set(range(15, 20)) and set(p.test_clients.tolist()) == test
    for c in range(20):
        if c in test:
            assert len(p.train_indices[c]) == 0 and len(p.test_indices[c]) > 0
        else:
            assert len(p.test_indices[c]) == 0 and len(p.train_indices[c]) > 0
    train_angles = {p.rotations[c] for c in range(20) if c not in test}
    assert train_angles == {0, 90, 180, 270}
    assert sorted(p.rotations[c] for c in sorted(test)) == [0, 45, 90, 180, 270]
    assert 45.0 not in train_angles
    everything = np.concatenate(p.train_indices + p.test_indices)
    assert len(np.unique(everything)) == len(everything)  # disjoint samples
    plain = make_partition(labels, PartitionSpec("domains", 20))
    assert plain.test_clients is None and all(len(t) for t in plain.test_indices)  # unchanged default


def test_config_rejects_fedcg_without_conv_layers_and_bad_held_out_settings():
    base = default_run_config()
    with pytest.raises(ConfigError, match="method 'fedcg' needs a model with convolutional layers"):
        RunConfig.from_flower({**base, "method": "fedcg", "model": "mlp"})
    with pytest.raises(ConfigError, match="fedcg.gcn-layers=1"):
        RunConfig.from_flower({**base, "method": "fedcg", "model": "cnn", "fedcg.gcn-layers": 1})
    with pytest.raises(ConfigError, match="partition 'domains' only"):
        RunConfig.from_flower({**base, "domain-test-clients": 0.2})
    with pytest.raises(ConfigError, match="set domain-test-clients > 0"):
        RunConfig.from_flower({**base, "partition": "domains", "domain-unseen-rotations": "45"})
    with pytest.raises(ConfigError, match="fedcg.adjacency"):
        RunConfig.from_flower({**base, "fedcg.adjacency": "learned"})


# --- whole federations -----------------------------------------------------------------------------
def _fedcg_run(tiny_run, **extra):
    return simulate({**tiny_run, "method": "fedcg", "model": "cnn", "partition": "domains",
                     "num-clients": 10, "num-rounds": 4, "max-samples-per-client": 40,
                     "batch-size": 10, "domain-test-clients": 0.5, "domain-unseen-rotations": "45",
                     "fedcg.teacher-period": 2, "fedcg.adj-warmup": 2, "fedcg.bottleneck": 8,
                     "fedcg.domain-stride": 2, "client-threads": 1, **extra}, num_nodes=2)


def test_fedcg_federation_trains_train_clients_and_tests_held_out_clients(tiny_run, tmp_path):
    summary = _fedcg_run(tiny_run)
    out = tmp_path / "run"
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert all(r["evaluated-clients"] == 5 for r in rounds)  # clients 5..9
    assert all(r["clients-trained"] == 5 for r in rounds[1:])
    block = [r["fedcg"] for r in rounds[1:]]
    assert [b["teacher-replaced"] for b in block] == [False, True, False, True]
    assert np.allclose(block[0]["adjacency"], np.eye(4))
    a = np.array(block[-1]["adjacency"])
    assert not np.allclose(a, np.eye(4)) and np.allclose(a.sum(axis=1), 1.0, atol=1e-5)
    assert np.allclose(np.diag(a), 0.5)
    assert sum(block[0]["domain-histogram"]) == 5 * 40  # every train image of the round
    fedcg = summary["fedcg"]
    assert all(abs(v) > 0 for v in fedcg["lambda"].values())
    assert set(fedcg["accuracy"]["by-domain"]) == {"0", "90", "180", "270", "45"}
    assert "unseen" in fedcg["accuracy"] and "seen" in fedcg["accuracy"]
    assert 0.0 <= fedcg["nmi"]["student-final"] <= 1.0 and fedcg["nmi"]["teacher-round-0"] is not None
    assert summary["final"]["global-accuracy"] == pytest.approx(summary["final"]["personalized"]["weighted-mean"])
    assert summary["final"]["global-accuracy"] == pytest.approx(fedcg["global-accuracy-soft"])
    assert 0.0 <= fedcg["global-accuracy-hard"] <= 100.0 and "seen" in fedcg["accuracy-hard"]
    assert np.load(out / "adjacencies.npy").shape == (5, 4, 4)
    for name in ("adjacency.png", "adjacency.npy", "adjacency-rounds.png", "fedcg.png"):
        assert (out / name).exists(), name


def test_fedcg_kmeans_clustering_assigns_one_domain_per_train_client(tiny_run):
    summary = _fedcg_run(tiny_run, **{"num-rounds": 1, "fedcg.clustering": "kmeans",
                                      "fedcg.adjacency": "uniform", "fedcg.soft": False})
    domains = summary["fedcg"]["client-domain"]
    assert sorted(int(c) for c in domains) == list(range(5))
    assert set(domains.values()) <= set(range(4)) and len(set(domains.values())) > 1
    assert summary["final"]["global-accuracy"] == pytest.approx(summary["fedcg"]["global-accuracy-hard"])


def test_style_domains_two_per_client_report_per_image_nmi_and_balanced_histograms(tiny_run, tmp_path):
    """Style domains, two per train client, sinkhorn balancing (the default): every round's hard
    pseudo-domain histogram is balanced, the per-image tables cover every train image."""
    summary = _fedcg_run(tiny_run, **{"num-rounds": 3, "domain-family": "styles", "domains-per-client": 2,
                                      "domain-unseen-rotations": "", "domain-unseen-styles": "blurred",
                                      "fedcg.sinkhorn-iters": 20})
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    for r in rounds[1:]:
        block = r["fedcg"]
        assert sum(block["domain-histogram"]) == 5 * 40
        assert block["largest-domain-share"] <= 0.4, block["domain-histogram"]
        assert 0.0 <= block["pseudo-domain-nmi"] <= 1.0 and block["balance"]["temperature"] == 100.0
    fedcg = summary["fedcg"]
    assert set(fedcg["accuracy"]["by-domain"]) == {"plain", "inverted", "noisy", "thick", "blurred"}
    assert fedcg["accuracy"]["unseen"] == fedcg["accuracy"]["by-domain"]["blurred"]
    assert fedcg["settings"]["balance"] == "sinkhorn" and fedcg["nmi"]["pseudo-domain-final"] is not None
    assert 0.25 <= fedcg["largest-domain-share"] <= 0.4


@pytest.mark.parametrize("extra", [{"fedcg.domains": 1}, {"fedcg.clustering": "oracle"}])
def test_controls_one_domain_and_the_true_domains(tiny_run, tmp_path, extra):
    summary = _fedcg_run(tiny_run, **{"num-rounds": 1, "fedcg.adjacency": "uniform", **extra})
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    block = rounds[1]["fedcg"]
    if extra.get("fedcg.domains") == 1:
        assert block["domain-histogram"] == [5 * 40] and np.allclose(block["adjacency"], [[1.0]])
    else:  # oracle: train client c holds rotation c mod 4, so the pseudo-domains are exactly the truth
        assert block["domain-histogram"] == [80, 40, 40, 40] and block["pseudo-domain-nmi"] == pytest.approx(1.0)
    assert 0.0 <= summary["final"]["global-accuracy"] <= 100.0


def test_resume_right_after_a_teacher_replacement_is_bit_identical(tiny_run, tmp_path):
    """T = 2: round 2 replaces the teacher, the run stops there; the resumed run forms the new
    teacher's Sinkhorn labelling at round 3 exactly as the uninterrupted one does."""
    short = {"num-rounds": 3, "fedcg.sinkhorn-iters": 5}
    full = _fedcg_run({**tiny_run, "output-dir": str(tmp_path / "full")}, **short)
    _fedcg_run({**tiny_run, "output-dir": str(tmp_path / "cut")}, **{**short, "num-rounds": 2})
    resumed = _fedcg_run({**tiny_run, "output-dir": str(tmp_path / "cut")}, **short, resume=True)
    assert resumed["final"] == full["final"]
    assert resumed["fedcg"]["balance"] == full["fedcg"]["balance"]
    assert resumed["fedcg"]["balance"]["teacher-version"] == 1
    assert resumed["fedcg"]["lambda"] == full["fedcg"]["lambda"]


@pytest.mark.federation
@pytest.mark.parametrize("method", ["fedavg", "sfl"])
def test_training_samples_only_the_train_clients_when_test_clients_are_held_out(method, tiny_run,
                                                                                 tmp_path):
    """The runner offers every strategy only the clients with training data for training: ⌊0.6 · 5
    train clients⌋ = 3 train each round (not ⌊0.6 · 10⌋), and no held-out test client is asked."""
    simulate({**tiny_run, "method": method, "partition": "domains", "num-clients": 10,
              "num-rounds": 2, "max-samples-per-client": 20, "domain-test-clients": 0.5,
              "fraction-train": 0.6, "client-threads": 1}, num_nodes=2)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert all(r["clients-trained"] == 3 for r in rounds[1:])
    cfg = RunConfig.from_flower({**default_run_config(), "method": method, "partition": "domains",
                                 "num-clients": 10, "domain-test-clients": 0.5})
    held_out = set(heldout_test_clients(cfg.data_spec.partition).tolist())
    grid = TrainClients(SimpleNamespace(get_node_ids=lambda: list(range(10))),
                        [c for c in range(10) if c not in held_out])
    assert set(grid.get_node_ids()) == set(range(10)) - held_out and len(held_out) == 5
