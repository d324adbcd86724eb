"""SFL / SFL* (docs/methods/sfl.md): the GCN aggregation, graph sources and their checks, the graph
learner, the client pulls, the strategy's server step, and small whole federations."""

import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, MetricRecord, RecordDict

from client_app.methods.sfl import sfl_penalty
from builders import train_config
from strategies.shared.settings import ConfigError
from strategies.shared.run_config import RunConfig
from server_app.harness.simulate import simulate
from strategies.shared.run_config import default_run_config
from strategies.methods.sfl.gcn import GCNPropagation, gcn_operator
from benchmarks.studies.sfl_scale import knn_graph
from strategies.shared.graph import row_normalize, structure_share, top_k_per_row
from strategies.shared.priors import check_adjacency, read_adjacency
from strategies.methods.sfl.graph_learner import GraphConstructor, GraphLearner, blend, graph_target
from strategies.methods.sfl.settings import TRAIN_SFL
from strategies.shared.messages import CONFIG, GLOBAL, METRICS, MODEL, PERSONAL
from strategies.shared.params import ParameterLayout
from strategies.shared.registry import build_strategy
from strategies.methods.sfl.server import SFL, prior_graph

PLANS = [("graph-first", True), ("graph-first", False), ("rows-first", True), ("rows-first", False)]


def gcn_propagate(adjacency, rows, hops=3, alpha=1.0, order="auto"):
    """SFL's server step: U = α·Â^L·V + (1−α)·V with Â = row_normalize(A)."""
    return GCNPropagation(row_normalize(adjacency), hops, alpha, order).apply(rows)


def _random_graph(n, density=0.4, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.random((n, n)) * (rng.random((n, n)) < density)
    np.fill_diagonal(a, 1.0)
    return a.astype(np.float32)


# --- U = α·Â^L·V + (1−α)·V ------------------------------------------------------------------------
@pytest.mark.parametrize("hops,alpha", [(3, 1.0), (2, 0.6), (1, 0.0), (0, 1.0)])
@pytest.mark.parametrize("order,sparse", PLANS)
def test_propagation_equals_the_dense_reference(hops, alpha, order, sparse):
    a = _random_graph(9)
    v = torch.randn(9, 23, generator=torch.Generator().manual_seed(1))
    a_hat = a.astype(np.float64) / a.sum(axis=1, keepdims=True)
    expected = alpha * np.linalg.matrix_power(a_hat, hops) @ v.double().numpy() \
        + (1 - alpha) * v.double().numpy()
    u = GCNPropagation(row_normalize(a), hops, alpha, order, sparse).apply(v)
    np.testing.assert_allclose(u.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gcn_propagate(a, v, hops, alpha).numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("hops,alpha", [(1, 1.0), (3, 0.7)])
def test_sparse_kernel_crosses_column_blocks_and_threads_and_writes_into_out(hops, alpha):
    from strategies.methods.sfl import spmm

    n = 37
    columns = 2 * spmm.block_columns(n) + 45  # two threads, several blocks, a ragged last block
    a = _random_graph(n)
    v = torch.randn(n, columns, generator=torch.Generator().manual_seed(2))
    expected = gcn_operator(row_normalize(a).double(), hops, alpha).double() @ v.double()
    out = torch.full_like(v, float("nan"))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        u = GCNPropagation(row_normalize(a), hops, alpha, "rows-first", True).apply(v, out=out)
    finally:
        torch.set_num_threads(threads)
    assert u is out
    np.testing.assert_allclose(u.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="float32 rows"):
        GCNPropagation(row_normalize(a), hops, alpha, "rows-first", True).apply(v.double())


def test_rows_of_a_hat_sum_to_one_and_an_empty_row_becomes_a_self_loop():
    a = _random_graph(7)
    a[3] = 0.0
    a_hat = row_normalize(a)
    np.testing.assert_allclose(a_hat.sum(dim=1).numpy(), np.ones(7), atol=1e-6)
    assert a_hat[3, 3] == 1.0 and a_hat[3].sum() == 1.0
    np.testing.assert_allclose(a_hat[0].numpy(), a[0] / a[0].sum(), rtol=1e-6)


def test_uniform_graph_gives_every_client_the_plain_mean():
    v = torch.randn(6, 11)
    u = gcn_propagate(np.full((6, 6), 1 / 6), v, hops=3, alpha=1.0)
    np.testing.assert_allclose(u.numpy(), v.mean(dim=0, keepdim=True).expand(6, -1).numpy(),
                               atol=1e-6)


def test_identity_graph_keeps_every_client_model():
    v = torch.randn(5, 8)
    for order, sparse in PLANS:
        u = GCNPropagation(row_normalize(np.eye(5)), 3, 1.0, order, sparse).apply(v)
        np.testing.assert_allclose(u.numpy(), v.numpy(), atol=1e-7)


def test_auto_plan_is_graph_first_for_dense_and_rows_first_for_a_sparse_knn_graph():
    dense = GCNPropagation(row_normalize(np.ones((50, 50))), 3, 1.0)
    assert dense.describe() == "graph-first/dense"
    points = np.random.default_rng(0).random((400, 2))
    knn = GCNPropagation(row_normalize(knn_graph(points, 5)), 3, 1.0)
    assert knn.order == "rows-first" and knn.sparse
    assert knn.nnz_operator > 3 * knn.nnz_adjacency  # Â^L is denser than L hops of Â


# --- graph files ----------------------------------------------------------------------------------
@pytest.mark.parametrize("matrix,message", [
    (np.ones((3, 4)), "shape (3, 4)"),
    (np.ones((5, 5)), "shape (5, 5) but num-clients = 4"),
    (-np.eye(4), "negative entries"),
    (np.where(np.eye(4) > 0, np.nan, 1.0), "non-finite entries"),
    (np.ones(4), "shape (4,)"),
])
def test_graph_file_is_checked(tmp_path, matrix, message):
    for suffix in (".npy", ".csv"):
        path = tmp_path / f"graph{suffix}"
        if suffix == ".npy":
            np.save(path, matrix)
        else:
            np.savetxt(path, np.atleast_2d(matrix), delimiter=",")
            if matrix.ndim == 1:
                continue  # a CSV line is a 1×4 matrix, reported as such
        with pytest.raises(ValueError) as err:
            read_adjacency(str(path), num_clients=4)
        text = str(err.value)
        assert message in text and str(path) in text
        assert "allowed: a square [num-clients, num-clients] = [4, 4]" in text


def test_graph_file_missing_or_with_a_bad_extension(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_adjacency(str(tmp_path / "nope.npy"), 4)
    (tmp_path / "graph.txt").write_text("1,0\n0,1\n")
    with pytest.raises(ValueError, match=r"extension '\.txt'; allowed: \.npy, \.csv"):
        read_adjacency(str(tmp_path / "graph.txt"), 2)
    (tmp_path / "bad.csv").write_text("1,a\n0,1\n")
    with pytest.raises(ValueError, match="could not be read"):
        read_adjacency(str(tmp_path / "bad.csv"), 2)


def test_valid_graph_files_load_as_float32(tmp_path):
    graph = _random_graph(4)
    np.save(tmp_path / "g.npy", graph)
    np.savetxt(tmp_path / "g.csv", graph, delimiter=",")
    for name in ("g.npy", "g.csv"):
        loaded = read_adjacency(str(tmp_path / name), 4)
        assert loaded.dtype == np.float32
        np.testing.assert_allclose(loaded, graph, rtol=1e-6)


def _cfg(tiny_run, **overrides):
    return RunConfig.from_flower({**default_run_config(), **tiny_run, **overrides})


def test_bad_graph_file_fails_when_the_strategy_is_built_naming_the_key(tmp_path, tiny_run):
    np.save(tmp_path / "g.npy", np.ones((3, 3)))
    cfg = _cfg(tiny_run, method="sfl", **{"sfl.graph": "file", "sfl.graph-file": str(tmp_path / "g.npy")})
    with pytest.raises(ConfigError) as err:
        build_strategy(cfg)
    assert str(err.value).startswith(f"run config: key 'sfl.graph-file' = '{tmp_path / 'g.npy'}'")
    assert "shape (3, 3) but num-clients = 4" in str(err.value)


class _UntouchableGrid:
    def __getattr__(self, name):
        raise AssertionError(f"a client was contacted ({name}) before the graph was checked")


def test_bad_graph_file_stops_the_server_app_before_any_client_is_contacted(tmp_path, tiny_run):
    from server_app.app import main

    (tmp_path / "g.csv").write_text("1,0,0,0\n0,1,-1,0\n0,0,1,0\n0,0,0,1\n")
    run_config = {**default_run_config(), **tiny_run, "method": "sfl", "sfl.graph": "file",
                  "sfl.graph-file": str(tmp_path / "g.csv")}
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                      run_config=run_config)
    with pytest.raises(ConfigError, match="negative entries"):
        main(_UntouchableGrid(), context)


def test_graph_and_graph_file_keys_must_agree(tiny_run):
    with pytest.raises(ConfigError, match="key 'sfl.graph-file' = '' is invalid: sfl.graph='file' needs"):
        _cfg(tiny_run, **{"sfl.graph": "file"})
    with pytest.raises(ConfigError, match="only read with sfl.graph='file'"):
        _cfg(tiny_run, **{"sfl.graph-file": "g.npy"})
    with pytest.raises(ConfigError, match="key 'sfl.graph' = 'grid' is invalid"):
        _cfg(tiny_run, **{"sfl.graph": "grid"})


def test_methods_that_need_a_prior_reject_graph_none(tiny_run):
    with pytest.raises(ConfigError, match="method 'sfl' needs a prior client graph"):
        build_strategy(_cfg(tiny_run, method="sfl", **{"sfl.graph": "none"}))
    with pytest.raises(ConfigError, match="set sfl.beta=1.0 to learn the graph alone"):
        build_strategy(_cfg(tiny_run, method="sfl-star", **{"sfl.graph": "none", "sfl.beta": 0.05}))
    star = build_strategy(_cfg(tiny_run, method="sfl-star", **{"sfl.graph": "none", "sfl.beta": 1.0}))
    assert star.prior is None and star.learner is not None


def test_label_sharing_prior_is_the_partition_ground_truth_from_the_clients_reports(tiny_run):
    """The server builds the label-sharing graph from the label sets the clients report (it reads
    no data): for a partition's clients, exactly the partition's label graph."""
    from datasets.federated import load_partition
    from strategies.shared.priors import ClientReport, ClientReports, given_graph

    cfg = _cfg(tiny_run, method="sfl", partition="shards")
    assert prior_graph(cfg) is None  # built once the clients have reported their label sets
    source, partition = load_partition(cfg.data_spec)
    reports = ClientReports(cfg.num_clients, {
        c: ClientReport(labels=tuple(np.unique(source.labels[partition.train_indices[c]])))
        for c in range(cfg.num_clients)})
    np.testing.assert_array_equal(given_graph(cfg, "label-sharing", "", "sfl.graph", reports),
                                  partition.label_graph)
    with pytest.raises(ConfigError, match="clients \\[1\\] reported none"):
        given_graph(cfg, "label-sharing", "", "sfl.graph", ClientReports(
            cfg.num_clients, {c: r for c, r in reports.reports.items() if c != 1}))


def test_road_prior_comes_from_the_traffic_data_set(tiny_run):
    from datasets import traffic
    from models import SEQUENCE_MODELS

    cfg = _cfg(tiny_run, method="sfl", dataset="traffic-synthetic", partition="sensors",
               model=SEQUENCE_MODELS[0], **{"sfl.graph": "road", "num-clients": 6})
    expected = traffic.road_graph("traffic-synthetic", None, 6, cfg.data_spec.traffic_days)
    np.testing.assert_array_equal(prior_graph(cfg), expected)
    with pytest.raises(ConfigError, match="road graph comes with the traffic data sets"):
        prior_graph(_cfg(tiny_run, method="sfl", **{"sfl.graph": "road"}))


def test_check_adjacency_accepts_integers_and_rejects_strings():
    assert check_adjacency(np.eye(3, dtype=np.int64), 3).dtype == np.float32
    with pytest.raises(ValueError, match="dtype"):
        check_adjacency(np.array([["a", "b"], ["c", "d"]]), 2)


# --- SFL* graph learner ---------------------------------------------------------------------------
def test_top_k_keeps_the_k_largest_of_every_row():
    m = torch.tensor([[0.1, 0.5, 0.3, 0.9], [4.0, 3.0, 2.0, 1.0]])
    out = top_k_per_row(m, 2)
    assert torch.equal(out, torch.tensor([[0.0, 0.5, 0.0, 0.9], [4.0, 3.0, 0.0, 0.0]]))


def _groups(n=12, num_groups=2, p=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    groups = torch.arange(n) % num_groups
    centres = torch.randn(num_groups, p, generator=g) * 3
    rows = centres[groups] + 0.3 * torch.randn(n, p, generator=g)
    same = (groups[:, None] == groups[None, :]).numpy().astype(np.float32)
    return rows, same


def test_graph_constructor_is_nonnegative_antisymmetric_with_zero_diagonal():
    torch.manual_seed(0)
    a = GraphConstructor(10, dim=8)().detach()
    assert (a >= 0).all()
    assert torch.all(a.diagonal() == 0)
    assert not torch.any((a > 0) & (a.T > 0))  # at most one direction per pair


def test_learned_graph_is_top_k_per_row_nonnegative_and_row_stochastic():
    rows, _ = _groups()
    learner = GraphLearner(12, k=3, steps=20, seed=1, symmetric=False, self_loops=False)
    a = learner.fit(rows)  # the reference export: rownorm(topk(A_L))
    assert (a >= 0).all()
    assert ((a > 0).sum(dim=1) <= 3).all()
    np.testing.assert_allclose(a.sum(dim=1).numpy(), np.ones(12), atol=1e-6)
    scores = learner.scores()
    np.testing.assert_allclose(a.numpy(), row_normalize(top_k_per_row(scores, 3)).numpy(), atol=1e-6)
    assert learner.k == 3 and len(learner.losses) == 1


def test_default_export_is_the_symmetrised_top_k_graph_with_self_loops():
    rows, _ = _groups()
    learner = GraphLearner(12, k=3, steps=20, seed=1)
    a = learner.fit(rows)
    top = top_k_per_row(learner.scores(), 3)
    expected = row_normalize(top + top.T + torch.eye(12))
    np.testing.assert_allclose(a.numpy(), expected.numpy(), atol=1e-6)
    assert torch.all(a.diagonal() > 0) and torch.equal(a > 0, a.T > 0)


def test_learner_k_is_capped_at_n_minus_one():
    assert GraphLearner(4, k=10).k == 3


def test_similarity_target_puts_the_learned_weight_on_close_models():
    rows, same = _groups(n=24, num_groups=3)  # random top-3 edges: 7/23 = 30% inside a group
    learner = GraphLearner(24, k=3, steps=50, seed=0)
    shares = [structure_share(learner.fit(rows).numpy(), same) for _ in range(8)]
    assert shares[0] < 0.5 and shares[-1] > 0.75  # persistent: keeps improving across rounds
    assert learner.losses[-1] < learner.losses[0]


def test_reference_initialisation_saturates_and_learns_nothing():
    rows, same = _groups(n=24, num_groups=3)
    learner = GraphLearner(24, k=3, steps=50, seed=0, init_std=1.0)
    shares = [structure_share(learner.fit(rows).numpy(), same) for _ in range(8)]
    assert max(shares) < 0.5


def test_distance_target_is_the_row_normalised_distance_and_similarity_its_complement():
    d = torch.tensor([[0.0, 1.0, 3.0], [1.0, 0.0, 2.0], [3.0, 2.0, 0.0]])
    np.testing.assert_allclose(graph_target(d, "distance")[0].numpy(),
                               np.array([0, 1, 3]) / np.sqrt(10), atol=1e-6)
    np.testing.assert_allclose(graph_target(d, "similarity")[0].numpy(),
                               np.array([3, 2, 0]) / np.sqrt(13), atol=1e-6)


def test_reference_learner_starts_fresh_every_round():
    rows, _ = _groups()
    learner = GraphLearner(12, k=3, steps=10, persist=False, optimizer="sgd", weight_decay=1e-4,
                           target="distance", seed=0)
    learner.fit(rows)
    first = learner.module
    learner.fit(rows)
    assert learner.module is not first and isinstance(learner.optimizer, torch.optim.SGD)


def test_blend_mixes_prior_and_learned_with_beta():
    prior, learned = torch.eye(3), torch.full((3, 3), 1 / 3)
    np.testing.assert_allclose(blend(prior, learned, 0.25).numpy(),
                               (0.75 * torch.eye(3) + 0.25 / 3).numpy())
    assert blend(None, learned, 0.05) is learned
    assert blend(prior, learned, 1.0) is learned


# --- client pulls ---------------------------------------------------------------------------------
def _pull_setup():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    u = {k: v + 1.0 for k, v in model.state_dict().items()}
    w = {k: v - 0.5 for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(0.2)
    return model, u, w


def _flat(model, state=None):
    if state is None:
        return torch.cat([p.reshape(-1) for p in model.parameters()])
    return torch.cat([state[n].reshape(-1) for n, _ in model.named_parameters()])


def test_pulls_are_non_squared_l2_distances_with_gradients():
    model, u, w = _pull_setup()
    value = sfl_penalty(model, u, w, 0.3, 0.2, reg_grad=True)(model)
    theta = _flat(model).detach()
    du, dw = theta - _flat(model, u), theta - _flat(model, w)
    assert float(value.detach()) == pytest.approx(0.3 * du.norm().item() + 0.2 * dw.norm().item(), rel=1e-6)
    value.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    np.testing.assert_allclose(grad.numpy(), (0.3 * du / du.norm() + 0.2 * dw / dw.norm()).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_reg_grad_false_makes_the_pulls_constants():
    model, u, w = _pull_setup()
    with_grad = sfl_penalty(model, u, w, 0.3, 0.3, reg_grad=True)(model)
    constant = sfl_penalty(model, u, w, 0.3, 0.3, reg_grad=False)(model)
    assert float(constant) == pytest.approx(float(with_grad.detach()))
    assert not constant.requires_grad
    x = torch.randn(4, 3)
    task = model(x).square().mean()
    (task + constant).backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (model(x).square().mean() + sfl_penalty(model, u, w, 0.3, 0.3, reg_grad=True)(model)).backward()
    pulled = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().mean().backward()
    task_only = [p.grad for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(plain, task_only))  # reference: plain task loss
    assert any(not torch.allclose(a, b) for a, b in zip(pulled, task_only))


def test_pull_gradient_is_zero_not_nan_at_the_anchor():
    model = torch.nn.Linear(2, 2)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    sfl_penalty(model, state, state, 0.3, 0.3)(model).backward()
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())


# --- the strategy's server step -------------------------------------------------------------------
def _strategy(tiny_run, graph, **overrides):
    cfg = _cfg(tiny_run, method="sfl", **{"num-clients": len(graph)}, **overrides)
    from models import build_model

    torch.manual_seed(0)
    arrays = ArrayRecord(build_model("mclr", (1, 28, 28), 10).state_dict())
    layout = ParameterLayout.of(arrays)
    strategy = SFL(len(graph), 1.0, cfg.sfl, prior=graph)
    strategy.layout, strategy.personal = layout, layout.matrix(arrays, len(graph))
    strategy.aggregated = strategy.personal.clone()
    return strategy, arrays, layout


def _upload(strategy, client, row, server_round=None):
    if server_round is not None:
        strategy.last_trained[client] = server_round
    strategy.absorb(client, RecordDict({
        MODEL: strategy.layout.arrays(row),
        METRICS: MetricRecord({"num-examples": 10, "train-loss": 0.0}),
    }))


def test_server_step_keeps_stale_rows_propagates_and_reads_out_the_mean(tiny_run):
    graph = _random_graph(4, seed=3)
    strategy, arrays, layout = _strategy(tiny_run, graph, **{"sfl.hops": 2, "sfl.alpha": 0.8,
                                                             "sfl.rows": "all"})  # the spec
    w0 = layout.row(arrays)
    new = {1: torch.randn(layout.size), 3: torch.randn(layout.size)}
    for client, row in new.items():
        _upload(strategy, client, row)
    global_arrays = strategy.after_train(1)
    v = torch.stack([new.get(c, w0) for c in range(4)])  # clients 0 and 2 keep their stale row
    assert torch.equal(strategy.personal, v)
    a_hat = torch.as_tensor(graph, dtype=torch.float64)
    a_hat = a_hat / a_hat.sum(dim=1, keepdim=True)
    expected = 0.8 * torch.linalg.matrix_power(a_hat, 2) @ v.double() + 0.2 * v.double()
    np.testing.assert_allclose(strategy.aggregated.numpy(), expected.numpy(), atol=1e-5)
    np.testing.assert_allclose(layout.row(global_arrays).numpy(),
                               strategy.aggregated.mean(dim=0).numpy(), atol=1e-6)
    np.testing.assert_allclose(layout.row(strategy.personal_arrays(2)).numpy(),
                               strategy.aggregated[2].numpy())
    assert strategy.after_train(2) is None  # nothing new uploaded: no new global model
    report = strategy.round_report(1)
    assert report["sfl-propagation"] == "graph-first/dense" and report["sfl-aggregation-seconds"] >= 0


def test_train_message_carries_global_personal_and_the_pull_settings(tiny_run):
    strategy, arrays, _ = _strategy(tiny_run, np.eye(3), **{"sfl.reg-grad": False,
                                                            "sfl.lambda-personal": 0.1})
    content = strategy.train_content(0, arrays, train_config())
    assert set(content.array_records) == {GLOBAL, PERSONAL}
    assert content[CONFIG]["lambda-personal"] == 0.1
    assert content[CONFIG]["lambda-global"] == 0.3
    assert content[CONFIG]["reg-grad"] is False
    assert strategy.train_message_type == TRAIN_SFL


def test_never_trained_rows_have_zero_weight_in_u_and_in_the_global_mean(tiny_run):
    graph = np.ones((4, 4), dtype=np.float32)
    graph[0, 3] = graph[3, 0] = 0.0  # client 3's neighbours: 1, 2 (and itself)
    strategy, arrays, layout = _strategy(tiny_run, graph, **{"sfl.hops": 2, "sfl.alpha": 1.0,
                                                             "sfl.rows": "trained"})
    w0 = layout.row(arrays)
    new = {0: torch.randn(layout.size), 1: torch.randn(layout.size)}
    for client, row in new.items():
        _upload(strategy, client, row, server_round=1)
    global_row = layout.row(strategy.after_train(1))
    v = torch.stack([new.get(c, w0) for c in range(4)]).double()
    m = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    a_hat = torch.as_tensor(graph, dtype=torch.float64) * m  # columns of never-trained rows: 0
    a_hat = a_hat / a_hat.sum(dim=1, keepdim=True)
    expected = torch.linalg.matrix_power(a_hat, 2) @ v
    np.testing.assert_allclose(strategy.aggregated.numpy(), expected.numpy(), atol=1e-5)
    assert not torch.allclose(strategy.aggregated[2], w0)  # w0 enters no row of U
    np.testing.assert_allclose(global_row.numpy(), expected[:2].mean(dim=0).numpy(), atol=1e-5)
    assert strategy.round_report(1)["sfl-trained-rows"] == 2


def test_a_client_without_trained_neighbours_gets_the_global_model_and_decay_discounts(tiny_run):
    graph = np.eye(3, dtype=np.float32)
    graph[0, 1] = graph[1, 0] = 1.0  # client 2 alone
    strategy, arrays, layout = _strategy(tiny_run, graph, **{"sfl.hops": 1, "sfl.alpha": 1.0,
                                                             "sfl.staleness-decay": 0.5})
    rows = {0: torch.randn(layout.size), 1: torch.randn(layout.size)}
    _upload(strategy, 0, rows[0], server_round=1)
    strategy.after_train(1)
    _upload(strategy, 1, rows[1], server_round=2)
    global_row = layout.row(strategy.after_train(2))
    # row 0 is one round old: weight 0.5 next to row 1's 1
    expected = (0.5 * rows[0].double() + rows[1].double()) / 1.5
    np.testing.assert_allclose(strategy.aggregated[0].numpy(), expected.numpy(), atol=1e-5)
    np.testing.assert_allclose(global_row.numpy(), expected.numpy(), atol=1e-5)
    np.testing.assert_allclose(strategy.aggregated[2].numpy(), global_row.numpy(), atol=1e-6)


def test_rows_all_is_the_spec_propagation_over_every_row_including_w0(tiny_run):
    graph = _random_graph(5, seed=4)
    strategy, arrays, layout = _strategy(tiny_run, graph, **{"sfl.rows": "all", "sfl.hops": 3,
                                                             "sfl.alpha": 1.0})
    w0 = layout.row(arrays)
    new = torch.randn(layout.size)
    _upload(strategy, 2, new, server_round=1)
    global_row = layout.row(strategy.after_train(1))
    v = torch.stack([new if c == 2 else w0 for c in range(5)])
    expected = gcn_propagate(graph, v, 3, 1.0)
    torch.testing.assert_close(strategy.aggregated, expected)
    torch.testing.assert_close(global_row, expected.mean(dim=0))


SPEC_FLAGS = {"sfl.rows": "all", "sfl.staleness-decay": 1.0, "sfl.reg-grad": True, "sfl.start": "global",
              "sfl.hops": 3, "sfl.alpha": 1.0}
STAR_SPEC_FLAGS = {"sfl.beta": 0.05, "sfl.gl-model": "mtgnn", "sfl.gl-features": "models"}
# Recorded with the code before the robustness defaults (commit ae0f9ef^, where these settings were the
# defaults and rows / staleness-decay / start / gl-model / gl-features did not exist), on the
# `tests/method_runs.py` base run: per round (personalized mean %, train loss, learner loss).
BEFORE_THE_DEFAULTS = {
    "sfl": [(35.416666666666664, 2.060465282864041, None), (57.638888888888886, 2.0008307562934027, None),
            (67.3611111111111, 1.9260741339789496, None)],
    "sfl-star": [(38.19444444444444, 2.060465282864041, 0.14328141510486603),
                 (55.555555555555564, 2.0023201836480036, 0.18869976699352264),
                 (65.27777777777779, 1.9264895121256511, 0.2061709314584732)],
}


@pytest.mark.federation
@pytest.mark.parametrize("method", sorted(BEFORE_THE_DEFAULTS))
def test_spec_flags_reproduce_the_numbers_before_the_robustness_defaults(method, tmp_path):
    from method_runs import BASE

    flags = {**SPEC_FLAGS, **(STAR_SPEC_FLAGS if method == "sfl-star" else {})}
    extra = {"sfl.gl-k": 2, "sfl.gl-steps": 5} if method == "sfl-star" else {}
    simulate({**BASE, "method": method, **flags, **extra, "output-dir": str(tmp_path), "run-name": "run"},
             num_nodes=2)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    got = [(r["personalized"]["mean"], r["train-loss"], r.get("sfl-learner-loss")) for r in rounds[1:]]
    assert len(got) == len(BEFORE_THE_DEFAULTS[method])
    for values, recorded in zip(got, BEFORE_THE_DEFAULTS[method]):
        assert (values[2] is None) == (recorded[2] is None)
        assert [v for v in values if v is not None] == pytest.approx(
            [v for v in recorded if v is not None], rel=1e-6)  # the learner runs in float32


def test_the_learner_fitted_on_trained_rows_gives_the_others_no_edge():
    rows = torch.randn(8, 30, generator=torch.Generator().manual_seed(3))
    include = torch.tensor([True] * 5 + [False] * 3)
    for model in ("mtgnn", "knn"):
        learned = GraphLearner(8, k=2, steps=5, seed=0, model=model).fit(rows, include=include)
        off = learned.clone()
        off.fill_diagonal_(0.0)
        assert off[5:].abs().sum() == 0 and off[:, 5:].abs().sum() == 0
        assert torch.equal(learned[5:, 5:], torch.eye(3))  # self-loops only
        assert (off[:5, :5] > 0).sum() >= 5
        torch.testing.assert_close(learned.sum(dim=1), torch.ones(8))


def test_the_knn_learner_links_every_client_to_its_nearest_models():
    centres = torch.randn(3, 40, generator=torch.Generator().manual_seed(0)) * 10
    rows = centres.repeat_interleave(4, dim=0) + 0.1 * torch.randn(
        12, 40, generator=torch.Generator().manual_seed(1))
    groups = np.repeat(np.arange(3), 4)
    learned = GraphLearner(12, k=3, model="knn").fit(rows)
    same = groups[:, None] == groups[None, :]
    assert structure_share(learned.numpy(), same) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="graph learner"):
        GraphLearner(4, model="gat")


def test_clients_start_from_u_i_with_start_personal(tiny_run):
    strategy, arrays, _ = _strategy(tiny_run, np.eye(3), **{"sfl.start": "personal"})
    content = strategy.train_content(0, arrays, train_config())
    assert content[CONFIG]["start"] == "personal"


# --- whole federations ----------------------------------------------------------------------------
@pytest.mark.federation
def test_sfl_federation_writes_the_graph_and_sfl_star_reports_the_learned_share(tiny_run, tmp_path):
    common = {**tiny_run, "partition": "shards", "num-clients": 6, "num-rounds": 2}
    summary = simulate({**common, "method": "sfl", "run-name": "sfl"})
    assert summary["final"]["personalized"]["mean"] > summary["round-0"]["personalized"]["mean"]
    graph = np.load(tmp_path / "sfl" / "graph.npy")
    np.testing.assert_allclose(graph.sum(axis=1), np.ones(6), atol=1e-6)
    sfl_summary = json.loads((tmp_path / "sfl" / "summary.json").read_text())["sfl"]
    # shards: scored against the label-histogram similarity, above the complete graph's level
    assert sfl_summary["graph-share-label-similarity"] > sfl_summary["uniform-share-label-similarity"]

    simulate({**common, "method": "sfl-star", "run-name": "star", "sfl.beta": 1.0,
              "sfl.graph": "none", "sfl.gl-k": 2})
    rounds = [json.loads(line) for line in (tmp_path / "star" / "rounds.jsonl").read_text().splitlines()]
    shares = [r["sfl-learned-share-label-similarity"] for r in rounds[1:]]
    assert len(shares) == 2 and all(0.0 <= s <= 1.0 for s in shares)
    learned = np.load(tmp_path / "star" / "learned-graph.npy")  # T + Tᵀ + I, T = top-2 per row
    assert np.all(np.diag(learned) > 0) and np.array_equal(learned > 0, learned.T > 0)
    assert ((learned > 0).sum() - 6) // 2 <= 6 * 2  # at most k edges per client before symmetrising
    assert np.load(tmp_path / "star" / "learned-graphs.npy").shape == (2, 6, 6)
    star = json.loads((tmp_path / "star" / "summary.json").read_text())["sfl"]
    assert star["graph-source"] == "none" and len(star["learned-share-label-similarity"]) == 2


# --- documentation and the scale benchmark ---------------------------------------------------------
def test_the_sfl_page_documents_every_sfl_key():
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "docs" / "methods" / "sfl.md").read_text()
    keys = [k for k in default_run_config() if k.startswith("sfl.")]
    assert len(keys) == len(type(RunConfig().sfl).model_fields)
    assert [k for k in keys if f"`{k}`" not in readme] == []


def test_scale_benchmark_measures_every_plan_and_skips_the_hopeless_ones():
    from benchmarks.studies.sfl_scale import measure
    from docs.results.studies import calibration

    rows = measure([60], [300], hops=(2,), k=3, reps=1, skip_above=2.5, log=lambda _: None)
    assert len(rows) == 8  # 2 graphs × 4 plans
    assert sum(r["auto"] for r in rows) == 2
    dense = {r["plan"]: r for r in rows if r["graph"] == "dense"}
    assert dense["graph-first/dense"]["auto"]
    # modelled at 2× (one sparse product over all N² entries) and 4× (two of them) the one GEMM
    assert not dense["graph-first/sparse"].get("skipped")
    assert dense["rows-first/sparse"].get("skipped")
    measured = [r for r in rows if not r.get("skipped")]
    assert all(r["seconds"] >= 0 and r["ratio"] > 0 for r in measured)
    assert calibration(rows) is not None


@pytest.mark.federation
def test_sfl_trains_traffic_forecasters_over_the_road_graph(tiny_run):
    from models import SEQUENCE_MODELS

    summary = simulate({**tiny_run, "dataset": "traffic-synthetic", "partition": "sensors",
                        "model": SEQUENCE_MODELS[0], "num-clients": 3, "num-rounds": 1,
                        "traffic-days": 2, "method": "sfl", "sfl.graph": "road"})
    final = summary["final"]["regression"]
    assert final["mae"] < summary["round-0"]["regression"]["mae"]
    assert summary["sfl"]["graph-source"] == "road"
