"""FedU: the Laplacian step over the given graph, stale rows, untrained rows from their trained
neighbours, λ = 0 is `local` (reference untrained rows), graph checks."""

import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from models import build_model
from strategies.shared.settings import ConfigError
from strategies.shared.run_config import RunConfig
from server_app.harness.simulate import simulate
from strategies.shared.run_config import default_run_config
from strategies.methods.fedu.settings import FedUSection
from strategies.methods.fedu.server import FedU, laplacian_step, rows_from_trained_neighbours
from strategies.shared.graph import row_normalize
from strategies.shared.messages import METRICS, PERSONAL, TRAIN_LOCAL
from strategies.shared.params import ParameterLayout
from strategies.shared.registry import build_strategy


def test_laplacian_step_moves_each_row_toward_its_neighbours():
    rng = np.random.default_rng(0)
    a = torch.as_tensor(rng.random((5, 5)), dtype=torch.float32)
    v = torch.randn(5, 7)
    out = laplacian_step(v, a, 0.3)
    for k in range(5):
        pull = sum(a[k, l] * (v[k] - v[l]) for l in range(5) if l != k)
        torch.testing.assert_close(out[k], v[k] - 0.3 * pull)


def test_symmetric_graph_keeps_the_mean_and_pulls_rows_together():
    a = torch.ones(4, 4)
    v = torch.randn(4, 6)
    out = laplacian_step(v, row_normalize(a), 0.5)
    torch.testing.assert_close(out.mean(dim=0), v.mean(dim=0))
    assert (out - out.mean(dim=0)).norm() < (v - v.mean(dim=0)).norm()


def _strategy(graph, lam=0.1, lr=0.5, untrained="initial"):
    torch.manual_seed(0)
    arrays = ArrayRecord(build_model("mclr", (1, 28, 28), 10).state_dict())
    strategy = FedU(len(graph), 1.0, FedUSection(lambda_=lam, untrained=untrained), graph=graph, lr=lr)
    strategy.layout = ParameterLayout.of(arrays)
    strategy.personal = strategy.layout.matrix(arrays, len(graph))
    return strategy


def test_server_step_uses_only_this_rounds_clients_and_keeps_stale_rows():
    graph = np.ones((4, 4), dtype=np.float32)
    strategy = _strategy(graph)
    before = strategy.personal.clone()
    new = {0: torch.randn(strategy.layout.size), 2: torch.randn(strategy.layout.size)}
    for client, row in new.items():
        strategy.absorb(client, RecordDict({PERSONAL: strategy.layout.arrays(row),
                                            METRICS: MetricRecord({"num-examples": 3})}))
    assert strategy.after_train(1) is None  # no global model
    a_hat = row_normalize(graph)
    step = 0.5 * 0.1
    torch.testing.assert_close(strategy.personal[0], new[0] - step * a_hat[0, 2] * (new[0] - new[2]))
    torch.testing.assert_close(strategy.personal[2], new[2] - step * a_hat[2, 0] * (new[2] - new[0]))
    assert torch.equal(strategy.personal[1], before[1]) and torch.equal(strategy.personal[3], before[3])
    assert strategy.train_message_type == TRAIN_LOCAL  # the client half of `local`


def test_an_untrained_row_becomes_the_weighted_mean_of_its_trained_neighbours():
    a = torch.tensor([[1.0, 2.0, 1.0, 0.0], [2.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 3.0], [0.0, 0.0, 3.0, 1.0]])
    v = torch.randn(4, 5)
    trained = torch.tensor([True, False, False, True])
    out = rows_from_trained_neighbours(v, a, trained)
    assert torch.equal(out[0], v[0]) and torch.equal(out[3], v[3])  # trained rows stay
    torch.testing.assert_close(out[1], v[0])  # its one trained neighbour (itself has no weight)
    torch.testing.assert_close(out[2], (1.0 * v[0] + 3.0 * v[3]) / 4.0)
    alone = rows_from_trained_neighbours(v, torch.eye(4), trained)  # no trained neighbour: unchanged
    assert torch.equal(alone, v)


def test_untrained_clients_take_their_trained_neighbours_rows_after_a_round_and_initial_keeps_w0():
    graph = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 1]], dtype=np.float32)
    rows = {}
    for untrained in ("neighbours", "initial"):
        strategy = _strategy(graph, untrained=untrained)
        w0 = strategy.personal[0].clone()
        row = torch.randn(strategy.layout.size, generator=torch.Generator().manual_seed(1))
        strategy.last_trained[0] = 1
        strategy.absorb(0, RecordDict({PERSONAL: strategy.layout.arrays(row),
                                       METRICS: MetricRecord({"num-examples": 3})}))
        strategy.after_train(1)
        rows[untrained] = strategy.personal.clone()
        assert torch.equal(strategy.personal[2], w0) and torch.equal(strategy.personal[3], w0)
    torch.testing.assert_close(rows["neighbours"][1], rows["neighbours"][0])  # client 1 sees client 0
    assert torch.equal(rows["initial"][1], rows["initial"][2])  # still w0 (the reference)
    assert torch.equal(rows["neighbours"][0], rows["initial"][0])


@pytest.mark.federation
def test_lambda_zero_is_exactly_local_training(tiny_run, tmp_path):
    common = {**tiny_run, "partition": "shards", "num-clients": 4, "num-rounds": 2,
              "safeguard": "off"}  # the paper's FedU: λ = 0 is local training exactly
    local = simulate({**common, "method": "local", "run-name": "local"})
    fedu0 = simulate({**common, "method": "fedu", "fedu.lambda": 0.0, "fedu.untrained": "initial",
                      "run-name": "fedu0"})
    fedu = simulate({**common, "method": "fedu", "fedu.lambda": 5.0, "run-name": "fedu"})
    assert fedu0["final"] == local["final"]
    assert fedu["final"] != local["final"]
    graph = np.load(tmp_path / "fedu" / "graph.npy")
    np.testing.assert_allclose(graph.sum(axis=1), np.ones(4), atol=1e-6)
    assert json.loads((tmp_path / "fedu" / "summary.json").read_text())["fedu"]["step"] == \
        pytest.approx(0.05 * 5.0)


def test_graph_settings_are_checked_before_any_client_is_contacted(tiny_run, tmp_path):
    with pytest.raises(ConfigError, match="key 'fedu.graph' = 'road' is invalid: the road graph"):
        build_strategy(RunConfig.from_flower({**default_run_config(), **tiny_run,
                                              "method": "fedu", "fedu.graph": "road"}))
    with pytest.raises(ConfigError, match="fedu.graph-file"):
        RunConfig.from_flower({**default_run_config(), "fedu.graph": "file"})
    bad = tmp_path / "g.npy"
    np.save(bad, -np.ones((4, 4)))
    with pytest.raises(ConfigError, match="key 'fedu.graph-file' .* negative"):
        build_strategy(RunConfig.from_flower({**default_run_config(), **tiny_run, "method": "fedu",
                                              "fedu.graph": "file", "fedu.graph-file": str(bad)}))


def test_the_fedu_page_documents_every_fedu_key():
    from pathlib import Path

    section = (Path(__file__).resolve().parent.parent / "docs" / "methods" / "fedu.md").read_text()
    keys = [key for key in RunConfig().flat() if key.startswith("fedu.")]
    assert len(keys) == 4
    assert [k for k in keys if f"`{k}`" not in section] == []
