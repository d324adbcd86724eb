"""ClientGrid routing/identity and the personalized strategies, over the in-process grid."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from client_app.app import app as client_app
from builders import train_config
from strategies.shared.run_config import RunConfig
from server_app.harness.local_grid import LocalGrid
from strategies.shared.provenance import code_fingerprint
from strategies.shared.run_config import default_run_config
from server_app.clients import ClientGrid, CodeMismatchError
from strategies.methods.ditto.server import Ditto
from strategies.methods.ditto.settings import DittoSection
from strategies.methods.local.server import Local
from strategies.shared.messages import CLIENT, CONFIG, METRICS, MODEL, PERSONAL
from strategies.shared.params import ParameterLayout
from strategies.shared.personalized import weighted_mean


def _grid(num_clients, num_nodes, tiny_run):
    run_config = {**default_run_config(), **tiny_run, "num-clients": num_clients}
    return LocalGrid(client_app, num_nodes, run_config)


def test_nodes_host_clients_by_partition_slot(tiny_run):
    local = _grid(10, 3, tiny_run)
    clients = ClientGrid(local, 10, code_fingerprint())
    clients.refresh(timeout=5)
    assert clients.missing_clients() == []
    assert clients.get_node_ids() == list(range(10))
    nodes = sorted(local.contexts)
    # node with partition-id p hosts clients p, p+3, p+6, ...
    assert [clients._host[c] for c in range(10)] == [nodes[c % 3] for c in range(10)]


def test_messages_are_rewritten_to_the_hosting_node_and_replies_mapped_back(tiny_run):
    local = _grid(4, 2, tiny_run)
    clients = ClientGrid(local, 4, code_fingerprint())
    clients.refresh(timeout=5)
    seen = []
    original = local.push_messages

    def spy(messages):
        messages = list(messages)
        seen.extend((m.metadata.dst_node_id, m.content[CLIENT]["client-id"]) for m in messages)
        return original(messages)

    local.push_messages = spy
    content = RecordDict({CONFIG: ConfigRecord({"x": 1})})
    from strategies.shared.messages import IDENTIFY

    replies = clients.send_and_receive(
        [Message(content, dst_node_id=c, message_type=IDENTIFY) for c in (3, 0)], timeout=5)
    nodes = sorted(local.contexts)
    assert seen == [(nodes[1], 3), (nodes[0], 0)]
    assert sorted(clients.client_id(r) for r in replies) == [0, 3]


def test_stale_code_on_a_node_is_reported(tiny_run):
    clients = ClientGrid(_grid(2, 2, tiny_run), 2, "0123456789ab")
    with pytest.raises(CodeMismatchError, match="stale app"):
        clients.refresh(timeout=5)


def test_offline_node_makes_its_clients_missing(tiny_run):
    local = _grid(4, 2, tiny_run)
    clients = ClientGrid(local, 4, code_fingerprint())
    clients.refresh(timeout=5)
    local.offline.add(sorted(local.contexts)[1])
    clients.refresh(timeout=5)
    assert clients.missing_clients() == [1, 3]


def test_weighted_mean_is_the_fedavg_rule():
    rows = torch.tensor([[0.0, 2.0], [4.0, 6.0]])
    assert torch.allclose(weighted_mean(rows, torch.tensor([3.0, 1.0])), torch.tensor([1.0, 3.0]))


def _reply(records):
    from server_app.harness.local_grid import set_task_identity

    set_task_identity()
    msg = Message(RecordDict(records), dst_node_id=1, message_type="train")
    msg.metadata.__dict__["_message_id"] = "m"
    return Message(RecordDict(records), reply_to=msg)


def _layout_and_rows():
    torch.manual_seed(0)
    from models import build_model

    arrays = ArrayRecord(build_model("mclr", (1, 28, 28), 10).state_dict())
    layout = ParameterLayout.of(arrays)
    return arrays, layout


def test_local_keeps_stale_rows_for_clients_that_did_not_reply():
    arrays, layout = _layout_and_rows()
    strategy = Local(num_clients=3, fraction_train=1.0)
    strategy.layout, strategy.personal = layout, layout.matrix(arrays, 3)
    new_row = torch.full((layout.size,), 0.5)
    reply = _reply({PERSONAL: layout.arrays(new_row),
                    METRICS: MetricRecord({"num-examples": 10, "train-loss": 1.5})})
    global_arrays, metrics = strategy.aggregate_train(1, [(1, reply)])  # (client id, reply)
    assert global_arrays is None  # local has no global model
    assert metrics["train-loss"] == pytest.approx(1.5)
    assert torch.equal(strategy.personal[1], new_row)
    assert torch.equal(strategy.personal[0], layout.row(arrays))  # stale rows kept
    assert torch.equal(strategy.personal[2], layout.row(arrays))
    assert strategy.num_examples.tolist() == [0, 10, 0]


def test_ditto_global_is_the_example_weighted_mean_of_the_model_updates():
    arrays, layout = _layout_and_rows()
    strategy = Ditto(num_clients=2, fraction_train=1.0, settings=DittoSection(lambda_=0.1, personal_epochs=1))
    strategy.layout, strategy.personal = layout, layout.matrix(arrays, 2)
    a, b = torch.zeros(layout.size), torch.ones(layout.size)
    for client, row, n in ((0, a, 30), (1, b, 10)):
        strategy.absorb(client, RecordDict({
            MODEL: layout.arrays(row), PERSONAL: layout.arrays(row * 2),
            METRICS: MetricRecord({"num-examples": n, "train-loss": 0.0}),
        }))
    new_global = layout.row(strategy.after_train(1))
    assert torch.allclose(new_global, torch.full((layout.size,), 0.25))
    assert torch.equal(strategy.personal[1], b * 2)
    assert strategy.after_train(2) is None  # nothing new absorbed


def test_ditto_sends_lambda_and_personal_epochs():
    arrays, layout = _layout_and_rows()
    strategy = Ditto(num_clients=2, fraction_train=1.0, settings=DittoSection(lambda_=0.3, personal_epochs=2))
    strategy.layout, strategy.personal = layout, layout.matrix(arrays, 2)
    content = strategy.train_content(0, arrays, train_config())
    assert content[CONFIG]["ditto-lambda"] == 0.3
    assert content[CONFIG]["personal-epochs"] == 2
    assert set(content.array_records) == {"global", "personal"}


@pytest.mark.federation
def test_partial_participation_samples_the_configured_share(tiny_run):
    cfg = RunConfig.from_flower({**default_run_config(), **tiny_run, "num-clients": 10,
                                 "fraction-train": 0.3})
    local = LocalGrid(client_app, 5, {**default_run_config(), **tiny_run, "num-clients": 10})
    clients = ClientGrid(local, 10, code_fingerprint())
    clients.refresh(timeout=5)
    arrays, _ = _layout_and_rows()
    strategy = Local(cfg.num_clients, cfg.fraction_train)
    messages = list(strategy.configure_train(1, arrays, ConfigRecord({}), clients))
    assert len(messages) == 3
    assert len({m.metadata.dst_node_id for m in messages}) == 3
    assert all(0 <= m.metadata.dst_node_id < 10 for m in messages)
    np.testing.assert_equal(len(list(strategy.configure_evaluate(1, arrays, ConfigRecord({}), clients))), 10)


@pytest.mark.federation
def test_a_node_that_cannot_identify_fails_the_run_at_once(tiny_run):
    import time

    from server_app.app import run

    def no_partition(message, context):
        context.node_config.pop("partition-id", None)  # a SuperNode started without node_config
        return client_app(message, context)

    run_config = {**default_run_config(), **tiny_run}
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="failed to identify itself.*--node-config"):
        run(LocalGrid(no_partition, 2, run_config), RunConfig.from_flower(run_config))
    assert time.monotonic() - started < 30  # not the 300 s connect timeout
