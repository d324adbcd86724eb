"""IFCA and FedSEM: per-cluster averaging, the client's argmin-loss choice, K-means on client models
with stale rows, and whole federations on MNIST with known label clusters."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from client_app.app import app as client_app
from client_app.runtime import ClientRuntime
from client_app.training import evaluate as evaluate_model
from client_app.training import seeded_generator, train_epochs
from datasets.federated import load_client_data
from server_app.app import initial_arrays
from strategies.shared.run_config import RunConfig
from server_app.harness.local_grid import LocalGrid
from strategies.shared.provenance import code_fingerprint
from server_app.harness.simulate import simulate
from strategies.shared.run_config import default_run_config
from server_app.clients import ClientGrid
from strategies.methods.fedsem.server import FedSEM, kmeans, kmeans_plus_plus
from strategies.shared.clustered import seeded_models
from strategies.methods.ifca.server import IFCA
from strategies.methods.ifca.settings import EVALUATE_IFCA, TRAIN_IFCA, cluster_model
from strategies.shared.messages import (
    CONFIG, METRICS, MODEL, PERSONAL, EvaluateInstructions, TrainInstructions
)
from strategies.shared.params import ParameterLayout


def _replies(strategy, records_by_client):
    """(client id, train reply) pairs (replies as Flower builds them), as the runner hands them."""
    from server_app.harness.local_grid import set_task_identity

    set_task_identity()
    replies = []
    for client, records in records_by_client.items():
        sent = Message(RecordDict(records), dst_node_id=1, message_type="train")
        sent.metadata.__dict__["_message_id"] = f"m{client}"
        reply = Message(RecordDict(records), reply_to=sent)
        replies.append((client, reply))
    return replies


def _tiny_layout():
    """A 3-parameter model (Linear 2→1) so rows can be written by hand."""
    arrays = ArrayRecord(torch.nn.Linear(2, 1).state_dict())
    return arrays, ParameterLayout.of(arrays)


# --- IFCA -----------------------------------------------------------------------------------------
def _ifca(num_clients=3, clusters=3):
    strategy = IFCA(num_clients, 1.0, clusters, seeded_models("mclr", "mnist", seed=0))
    arrays = seeded_models("mclr", "mnist", seed=0)(0)
    strategy.layout = ParameterLayout.of(arrays)
    strategy.personal = strategy.layout.matrix(arrays, num_clients)
    strategy.centres = strategy.initial_centres(arrays)
    return strategy


def test_ifca_starts_from_distinct_seeded_models_and_sends_all_of_them():
    strategy = _ifca()
    cfg = RunConfig(model="mclr", dataset="mnist", seed=0)
    assert torch.equal(strategy.centres[0], strategy.layout.row(initial_arrays(cfg)))
    assert not torch.equal(strategy.centres[0], strategy.centres[1])
    assert not torch.equal(strategy.centres[1], strategy.centres[2])
    content = strategy.train_content(0, initial_arrays(cfg), TrainInstructions(
        server_round=1, lr=0.1, momentum=0.0, local_epochs=1, batch_size=8, seed=0).config())
    assert set(content.array_records) == {"cluster-0", "cluster-1", "cluster-2"}
    for j in range(3):
        assert torch.equal(strategy.layout.row(content[cluster_model(j)]), strategy.centres[j])


def test_ifca_cluster_model_is_the_weighted_mean_of_its_choosers_and_unchosen_ones_stay():
    strategy = _ifca()
    layout, before = strategy.layout, strategy.centres.clone()
    size = layout.size

    def reply(row, n, cluster):
        return {MODEL: layout.arrays(row),
                METRICS: MetricRecord({"num-examples": n, "train-loss": 1.0, "cluster": cluster})}

    replies = _replies(strategy, {
        0: reply(torch.zeros(size), 30, 2), 1: reply(torch.ones(size), 10, 2),
        2: reply(torch.full((size,), 5.0), 7, 0),
    })
    new_global, metrics = strategy.aggregate_train(1, replies)
    assert new_global is None  # IFCA has no global model
    assert metrics["train-loss"] == pytest.approx(1.0)
    assert torch.allclose(strategy.centres[2], torch.full((size,), 0.25))  # (30·0 + 10·1) / 40
    assert torch.allclose(strategy.centres[0], torch.full((size,), 5.0))
    assert torch.equal(strategy.centres[1], before[1])  # nobody chose cluster 1
    assert strategy.assignment.tolist() == [2, 2, 0]
    assert strategy.round_report(1) == {"cluster-sizes": [1, 0, 2], "unassigned-clients": 0}
    # the personalized model of a client is the model of the cluster it chose
    evaluated = strategy.evaluate_content(1, ArrayRecord(), EvaluateInstructions(
        server_round=1, batch_size=8, seed=0, lr=0.1, momentum=0.0).config())
    assert torch.allclose(layout.row(evaluated[PERSONAL]), strategy.centres[2])
    truth = SimpleNamespace(cluster_ids=np.array([1, 1, 0]))
    assert strategy.report(None, truth) == {"cluster-assignment": [2, 2, 0], "cluster-ari": 1.0}


def test_ifca_reply_without_a_valid_cluster_is_rejected():
    strategy = _ifca(num_clients=1, clusters=2)
    bad = _replies(strategy, {0: {
        MODEL: strategy.layout.arrays(strategy.centres[0]),
        METRICS: MetricRecord({"num-examples": 5, "train-loss": 1.0, "cluster": 2})}})
    with pytest.raises(ValueError, match=r"'cluster' in \[0, 2\)"):
        strategy.aggregate_train(1, bad)


@pytest.mark.federation
@pytest.mark.parametrize("trained_index", [0, 1])
def test_ifca_client_trains_and_evaluates_the_lowest_train_loss_model(trained_index, tiny_run):
    run_config = {**default_run_config(), **tiny_run}
    cfg = RunConfig.from_flower(run_config)
    rt = ClientRuntime(cfg, 0, load_client_data(cfg.data_spec, 0), torch.device("cpu"))
    x, y = rt.tensors("train")
    random_model = seeded_models(cfg.model, cfg.dataset, seed=3)(0)
    trained = rt.model(seeded_models(cfg.model, cfg.dataset, seed=4)(0))
    train_epochs(trained, x, y, epochs=5, batch_size=16, lr=0.1, momentum=0.0,
                 generator=seeded_generator(0))
    trained_arrays = ArrayRecord({k: v.detach() for k, v in trained.state_dict().items()})
    models = [random_model, random_model]
    models[trained_index] = trained_arrays
    grid = ClientGrid(LocalGrid(client_app, 2, run_config), cfg.num_clients, code_fingerprint())
    grid.refresh(timeout=5)
    records = {cluster_model(j): models[j] for j in range(2)}

    train_ins = TrainInstructions(server_round=1, lr=0.05, momentum=0.0, local_epochs=1,
                                  batch_size=32, seed=0).config()
    message = Message(RecordDict({**records, CONFIG: train_ins}), dst_node_id=0,
                      message_type=TRAIN_IFCA)
    [reply] = grid.send_and_receive([message], timeout=30)
    assert not reply.has_error(), reply.error
    assert reply.content[METRICS]["cluster"] == trained_index
    layout = ParameterLayout.of(trained_arrays)
    moved = layout.row(reply.content[MODEL]) - layout.row(trained_arrays)
    assert 0 < moved.norm() < (layout.row(random_model) - layout.row(trained_arrays)).norm() / 10

    eval_ins = EvaluateInstructions(server_round=1, batch_size=32, seed=0, lr=0.05,
                                    momentum=0.0).config()
    message = Message(RecordDict({**records, CONFIG: eval_ins}), dst_node_id=0,
                      message_type=EVALUATE_IFCA)
    [reply] = grid.send_and_receive([message], timeout=30)
    assert not reply.has_error(), reply.error
    expected = evaluate_model(trained, *rt.tensors("test"), 32)
    assert reply.content[METRICS]["accuracy"] == pytest.approx(expected.accuracy)
    untrained = evaluate_model(rt.model(random_model), *rt.tensors("test"), 32)
    assert expected.accuracy > untrained.accuracy


# --- FedSEM ---------------------------------------------------------------------------------------
def _two_groups():
    """Six rows in two far-apart groups (clients 0–2 and 3–5) with unequal sample counts."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 3, generator=gen) * 0.1
    rows[3:] += torch.tensor([10.0, -10.0, 5.0])
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 1.0, 5.0])
    means = torch.stack([(weights[:3, None] * rows[:3]).sum(0) / 6.0,
                         (weights[3:, None] * rows[3:]).sum(0) / 10.0])
    return rows, weights, means


def _same_groups(assignment, groups):
    """Whether two labelings define the same partition (up to renaming the labels)."""
    labels = assignment.tolist()
    return len(set(zip(labels, groups))) == len(set(groups)) == len(set(labels))


def test_kmeans_finds_two_obvious_groups_and_weighted_means():
    rows, weights, means = _two_groups()
    # warm start with both centres inside the first group: Lloyd iterations still separate them
    assignment, centres = kmeans(rows, weights, rows[[0, 1]].clone())
    assert _same_groups(assignment, [0, 0, 0, 1, 1, 1])
    assert torch.allclose(centres[assignment[[0, 3]]], means, atol=1e-6)
    # K-means++ seeding picks one centre per group
    seeds = kmeans_plus_plus(rows, weights, 2, torch.Generator().manual_seed(1))
    assignment, centres = kmeans(rows, weights, seeds)
    assert _same_groups(assignment, [0, 0, 0, 1, 1, 1])
    assert torch.allclose(centres[assignment[[0, 3]]], means, atol=1e-6)


def test_kmeans_keeps_the_centre_of_an_empty_cluster():
    rows, weights, means = _two_groups()
    far = torch.full((1, 3), 1e3)
    assignment, centres = kmeans(rows, weights, torch.cat([rows[[0, 3]], far]))
    assert 2 not in assignment.tolist()
    assert torch.equal(centres[2], far[0])


def _fedsem(num_clients, clusters=2):
    arrays, layout = _tiny_layout()
    strategy = FedSEM(num_clients, 1.0, clusters, seed=0)
    strategy.layout, strategy.personal = layout, layout.matrix(arrays, num_clients)
    strategy.centres = strategy.initial_centres(arrays)
    return strategy


def _local_reply(layout, row, n):
    metrics = MetricRecord({"num-examples": n, "train-loss": 0.5})
    return {PERSONAL: layout.arrays(row), METRICS: metrics}


def test_fedsem_kmeans_uses_the_stale_rows_of_clients_not_sampled_this_round():
    rows, weights, means = _two_groups()
    strategy = _fedsem(6)
    strategy.personal[:] = rows  # every client trained in an earlier round
    strategy.num_examples[:] = weights
    strategy.centres = rows[[0, 3]].clone() + 0.5
    strategy.assignment[:] = torch.tensor([0, 0, 0, 1, 1, 1])
    strategy.seeded = True
    new = rows.clone()
    new[[0, 4]] += 0.05  # only clients 0 and 4 are sampled and reply
    replies = _replies(strategy, {c: _local_reply(strategy.layout, new[c], int(weights[c]))
                                  for c in (0, 4)})
    assert strategy.aggregate_train(2, replies)[0] is None  # no global model
    assert strategy.assignment.tolist() == [0, 0, 0, 1, 1, 1]
    expected = torch.stack([(weights[:3, None] * new[:3]).sum(0) / 6.0,
                            (weights[3:, None] * new[3:]).sum(0) / 10.0])
    assert torch.allclose(strategy.centres, expected, atol=1e-6)  # stale rows 1, 2, 3, 5 included
    assert strategy.round_report(2) == {"cluster-sizes": [3, 3], "unassigned-clients": 0}
    content = strategy.train_content(4, ArrayRecord(), TrainInstructions(
        server_round=3, lr=0.1, momentum=0.0, local_epochs=1, batch_size=8, seed=0).config())
    assert torch.allclose(strategy.layout.row(content[PERSONAL]), expected[1])  # its centre
    truth = SimpleNamespace(cluster_ids=np.array([2, 2, 2, 0, 0, 0]))
    assert strategy.report(None, truth)["cluster-ari"] == 1.0


def test_fedsem_averages_until_c_clients_trained_then_splits():
    rows, weights, _ = _two_groups()
    strategy = _fedsem(6)
    layout = strategy.layout
    strategy.aggregate_train(1, _replies(strategy, {3: _local_reply(layout, rows[3], 4)}))
    assert not strategy.seeded  # one client trained, C = 2: FedAvg warm-up
    assert torch.allclose(strategy.centres, rows[3].expand(2, -1))
    assert strategy.assignment.tolist() == [0] * 6
    strategy.aggregate_train(2, _replies(strategy, {
        c: _local_reply(layout, rows[c], int(weights[c])) for c in (0, 1)}))
    assert strategy.seeded
    assignment = strategy.assignment.tolist()
    assert assignment[0] == assignment[1] != assignment[3]
    # clients 2, 4, 5 have not trained: E-step only, to the centre nearest their (initial) row
    nearest = int(torch.cdist(strategy.personal[2][None], strategy.centres).argmin())
    assert assignment[2] == assignment[4] == assignment[5] == nearest


# --- whole federations ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def label_clusters(tmp_path_factory):
    """fedavg, ifca and fedsem on MNIST with 3 label clusters (2 labels each) over 12 clients."""
    out = tmp_path_factory.mktemp("clustered")
    common = {
        "dataset": "mnist", "partition": "label-clusters", "num-clusters": 3,
        "labels-per-cluster": 2, "num-clients": 12, "max-samples-per-client": 200, "model": "mclr",
        "num-rounds": 3,
        "finetune-epochs": 0, "ifca.clusters": 3, "fedsem.clusters": 3, "output-dir": str(out),
        "fuse-evaluate": False,  # train and evaluate messages apart: bytes per message kind
    }
    runs = {m: simulate({**common, "method": m, "run-name": m}, num_nodes=2)
            for m in ("fedavg", "ifca", "fedsem")}
    runs["ifca-partial"] = simulate({**common, "method": "ifca", "fraction-train": 0.5,
                                     "num-rounds": 5, "run-name": "ifca-partial"}, num_nodes=2)
    rounds = {name: [json.loads(line) for line in (out / name / "rounds.jsonl").open()]
              for name in runs}
    return runs, rounds


def test_clustered_methods_beat_fedavg_on_label_clusters(label_clusters):
    runs, rounds = label_clusters
    fedavg = runs["fedavg"]["final"]["personalized"]["mean"]
    for method in ("ifca", "fedsem", "ifca-partial"):
        summary = runs[method]
        assert summary["final"]["personalized"]["mean"] > fedavg + 5.0, method
        assert "global-accuracy" not in summary["final"]  # no global model
        assert len(summary["cluster-assignment"]) == 12
        assert -1.0 <= summary["cluster-ari"] <= 1.0
        assert all(sum(r["cluster-sizes"]) + r["unassigned-clients"] == 12
                   for r in rounds[method][1:])
    assert runs["fedsem"]["cluster-ari"] >= 0.9  # obvious label clusters are recovered


def test_ifca_downlink_carries_all_cluster_models(label_clusters):
    _, rounds = label_clusters
    # full participation, round 1: fedavg sends the global model twice (train + evaluate), IFCA
    # sends C = 3 models for training and the chosen one for evaluation
    per_client = {m: rounds[m][1]["bytes-down-per-client"] for m in ("fedavg", "ifca", "fedsem")}
    assert per_client["ifca"] == pytest.approx(2 * per_client["fedavg"], rel=1e-3)
    assert per_client["fedsem"] == pytest.approx(per_client["fedavg"], rel=1e-3)
    assert rounds["ifca"][1]["bytes-up-per-client"] == pytest.approx(
        rounds["fedavg"][1]["bytes-up-per-client"], rel=1e-3)


def test_ifca_with_partial_participation_assigns_clients_as_they_train(label_clusters):
    runs, rounds = label_clusters
    partial = rounds["ifca-partial"]
    assert all(r["clients-trained"] == 6 for r in partial[1:])
    unassigned = [r["unassigned-clients"] for r in partial[1:]]
    assert unassigned[0] == 6 and unassigned == sorted(unassigned, reverse=True)
    assert runs["ifca-partial"]["cluster-assignment"].count(-1) == unassigned[-1]


@pytest.mark.federation
def test_ifca_reports_errors_on_a_regression_task(tmp_path):
    """Clients without a cluster choose at evaluation time; their reply carries MAE/MAPE/RMSE."""
    summary = simulate({
        "method": "ifca", "ifca.clusters": 2, "dataset": "traffic-synthetic",
        "partition": "sensors", "model": "gru", "num-clients": 4, "num-rounds": 1,
        "traffic-days": 3, "finetune-epochs": 0, "fraction-train": 0.5,
        "output-dir": str(tmp_path), "run-name": "ifca-traffic",
    })
    errors = summary["final"]["regression"]
    assert 0 < errors["mae"] <= errors["rmse"]
    assert "personalized" not in summary["final"]
