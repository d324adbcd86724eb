"""FedPer and LG-FedAvg: the shared part is the example-weighted mean of the round's models, the
personal part stays each client's own."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from models import build_model
from server_app.harness.simulate import simulate
from strategies.shared.messages import CONFIG, METRICS, PERSONAL, TRAIN_LOCAL
from strategies.methods.fedper.server import FedPer
from strategies.methods.lg_fedavg.server import LGFedAvg
from strategies.shared.partial import shared_columns


def _setup(cls, num_clients=3):
    torch.manual_seed(0)
    arrays = ArrayRecord(build_model("mclr", (1, 28, 28), 10).state_dict())
    strategy = cls(num_clients, 1.0)
    strategy.bind(arrays)
    return strategy, arrays, strategy.layout


def _train(strategy, client, row, examples):
    strategy.num_examples[client] = examples  # as aggregate_train records it before absorb
    strategy.absorb(client, RecordDict({
        PERSONAL: strategy.layout.arrays(row),
        METRICS: MetricRecord({"num-examples": examples, "train-loss": 0.0}),
    }))


def test_shared_columns_follow_the_features_head_split():
    _, _, layout = _setup(FedPer)
    features = shared_columns(layout, "features")
    head = shared_columns(layout, "head")
    assert torch.equal(features, ~head)
    # mclr: features = Linear(784 → 64), head = Linear(64 → 10)
    assert int(features.sum()) == 784 * 64 + 64 and int(head.sum()) == 64 * 10 + 10
    with pytest.raises(ValueError, match="allowed: features, head"):
        shared_columns(layout, "body")


@pytest.mark.parametrize("cls,part", [(FedPer, "features"), (LGFedAvg, "head")])
def test_shared_part_is_the_weighted_mean_and_personal_parts_are_untouched(cls, part):
    strategy, arrays, layout = _setup(cls)
    shared = shared_columns(layout, part)
    w0 = layout.row(arrays)
    rows = {0: torch.randn(layout.size), 2: torch.randn(layout.size)}
    _train(strategy, 0, rows[0], 30)
    _train(strategy, 2, rows[2], 10)
    assert strategy.after_train(1) is None  # no global model
    mean = 0.75 * rows[0] + 0.25 * rows[2]
    for client in range(3):
        model = layout.row(strategy.personal_arrays(client))
        np.testing.assert_allclose(model[shared].numpy(), mean[shared].numpy(), atol=1e-6)
        own = rows.get(client, w0)  # client 1 did not train: its personal part is still w0's
        assert torch.equal(model[~shared], own[~shared])
    assert strategy.after_train(2) is None and torch.allclose(strategy.shared[shared], mean[shared])


def test_clients_receive_their_composed_model_for_local_training():
    strategy, arrays, layout = _setup(LGFedAvg)
    content = strategy.train_content(1, arrays, ConfigRecord({"lr": 0.1}))
    assert set(content.array_records) == {PERSONAL}
    assert content[CONFIG]["lr"] == 0.1
    assert strategy.train_message_type == TRAIN_LOCAL


@pytest.mark.federation
def test_fedper_and_lg_fedavg_federations_learn(tiny_run):
    for method in ("fedper", "lg-fedavg"):
        summary = simulate({**tiny_run, "method": method, "run-name": method, "partition": "shards"})
        assert summary["final"]["personalized"]["mean"] > summary["round-0"]["personalized"]["mean"]
        assert "global-accuracy" not in summary["final"]
