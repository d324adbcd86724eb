"""Secure aggregation (secure-aggregation = 'secagg+', docs/privacy.md): Flower's SecAgg+ client mod
inside the ClientApp, the server's stages as phases. A federation's aggregate equals plain FedAvg's
within the quantization error while no client's upload shows its model; a client that drops after
share-keys is unmasked with the survivors' shares; settings that cannot hold fail in one line."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, RecordDict

from client_app.app import app as client_app
from server_app.app import run
from server_app.callbacks import RunCallback
from server_app.harness.local_grid import LocalGrid
from strategies.shared.messages import CLIENT, ClientAddress
from strategies.shared.run_config import RunConfig, default_run_config
from strategies.shared.secure_aggregation import MODULUS_RANGE, SECAGG
from strategies.shared.settings import ConfigError

SMALL = {"dataset": "mnist", "partition": "label-clusters", "num-clusters": 2,
         "labels-per-cluster": 2, "max-samples-per-client": 60, "num-rounds": 1,
         "checkpoint-every": 0, "finetune-epochs": 0, "method": "fedavg"}


class Models(RunCallback):
    """Each round's model, as the round ended."""

    def __init__(self) -> None:
        self.arrays: dict[int, dict[str, np.ndarray]] = {}

    def round_finished(self, server_round: int, arrays: ArrayRecord, seconds: float,
                       pending: Any) -> None:
        self.arrays[server_round] = {k: v.numpy().copy() for k, v in arrays.items()}


class Recording:
    """The ClientApp, recording each (request, reply); `drop(message)` True: no reply (the client
    is gone)."""

    def __init__(self, drop=lambda message: False) -> None:
        self.exchanges: list[tuple[Message, Message | None]] = []
        self.drop = drop

    def __call__(self, message: Message, context: Context) -> Message | None:
        reply = None if self.drop(message) else client_app(message, context)
        self.exchanges.append((message, reply))
        return reply


def federation(tmp_path, name: str, settings: dict[str, Any], num_nodes: int | None = None,
               drop=lambda message: False) -> tuple[Models, Recording, list[dict]]:
    run_config = {**default_run_config(), **SMALL, **settings, "output-dir": str(tmp_path),
                  "run-name": name}
    cfg = RunConfig.from_flower(run_config)
    recording, models = Recording(drop), Models()
    grid = LocalGrid(recording, num_nodes or cfg.num_clients, run_config)
    run(grid, cfg, connect_timeout=5.0, callbacks=[models])
    rounds = [json.loads(line) for line in (tmp_path / name / "rounds.jsonl").read_text().splitlines()]
    return models, recording, rounds


def client_of(message: Message) -> int:
    return ClientAddress.read(message.content[CLIENT]).client_id


def quantization_bound(settings: dict[str, Any], clients: int) -> float:
    """How far the unmasked mean may lie from the exact one: each client's value is rounded
    stochastically to a step of 2·clipping-range / quantization-range, and the weights (n_k over the
    largest train set) sum to at least 1."""
    cfg = RunConfig.from_flower({**default_run_config(), **SMALL, **settings})
    return clients * 2 * cfg.secagg_clipping_range / cfg.secagg_quantization_range + 1e-6


def test_secagg_aggregate_equals_fedavg_and_no_upload_shows_a_model(tmp_path):
    # 4 clients on 2 nodes: each node runs the protocol for two logical clients
    plain, _, _ = federation(tmp_path, "plain", {"num-clients": 4}, num_nodes=2)
    secure, recording, rounds = federation(tmp_path, "secure", {
        "num-clients": 4, "secure-aggregation": "secagg+"}, num_nodes=2)
    bound = quantization_bound({}, 4)
    for name, value in plain.arrays[1].items():
        np.testing.assert_allclose(secure.arrays[1][name], value, rtol=0, atol=bound)
    assert any(np.abs(secure.arrays[1][n] - v).max() > 0 for n, v in plain.arrays[1].items())
    assert rounds[1]["clients-trained"] == 4
    assert rounds[1]["secagg"]["completed"] and rounds[1]["secagg"]["survivors"] == 4  # in rounds.jsonl

    types = [m.metadata.message_type for m, _ in recording.exchanges if SECAGG in m.content]
    assert types.count("query.secagg") == 3 * 4 and types.count("train") == 4  # 4 stages, 4 clients
    uploads = [(m, r) for m, r in recording.exchanges
               if m.metadata.message_type == "train" and SECAGG in m.content]
    for request, reply in uploads:
        assert not reply.has_error()
        assert [n for n, r in reply.content.items() if isinstance(r, ArrayRecord)] == [SECAGG]
        masked = reply.content[SECAGG]
        assert list(masked.keys())[1:] == list(plain.arrays[1])  # the weight, then every array
        values = np.concatenate([a.numpy().ravel() for a in list(masked.values())[1:]])
        # plainly quantized values lie in [0, quantization-range); masked ones cover [0, 2**32)
        assert values.max() > MODULUS_RANGE // 2 and values.min() >= 0

    # the same request without its `secagg` record trains the same model (seeded per message): the
    # client's own upload, dequantized alone, is nowhere near it
    request, reply = uploads[0]
    plain_request = Message(RecordDict({n: r for n, r in request.content.items() if n != SECAGG}),
                            dst_node_id=request.metadata.dst_node_id, message_type="train",
                            group_id=request.metadata.group_id)
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 2},
                      state=RecordDict(), run_config={**default_run_config(), **SMALL,
                                                      "num-clients": 4})
    model = client_app(plain_request, context).content["model"]
    cfg = RunConfig.from_flower({**default_run_config(), **SMALL})
    step = 2 * cfg.secagg_clipping_range / cfg.secagg_quantization_range
    for name, array in model.items():
        alone = reply.content[SECAGG][name].numpy() * step - cfg.secagg_clipping_range
        assert np.abs(alone - array.numpy()).mean() > 1.0


def test_a_client_dropped_after_share_keys_is_unmasked_with_the_survivors_shares(tmp_path):
    dropped = 2

    def gone_at_collect(message: Message) -> bool:  # answers setup and share-keys, then nothing
        return message.metadata.message_type == "train" and client_of(message) == dropped

    # two rounds: the run goes on after a drop (the dropped reply is waited for)
    settings = {"num-clients": 5, "round-timeout": 3.0, "num-rounds": 2}
    plain, _, _ = federation(tmp_path, "plain", settings, drop=gone_at_collect)
    secure, recording, rounds = federation(tmp_path, "secure", {
        **settings, "secure-aggregation": "secagg+"}, drop=gone_at_collect)
    for record in rounds[1:]:
        assert record["clients-trained"] == 4 and record["failed-clients"] == [dropped]
        assert record["secagg"]["completed"] and record["secagg"]["survivors"] == 4
        assert record["secagg"]["dropped"] == [dropped]
    stages = [(client_of(m), m.content[SECAGG]["stage"]) for m, _ in recording.exchanges
              if SECAGG in m.content]
    assert (dropped, "share_keys") in stages and (dropped, "unmask") not in stages
    unmask = [m.content[SECAGG] for m, _ in recording.exchanges
              if SECAGG in m.content and m.content[SECAGG]["stage"] == "unmask"]
    assert len(unmask) == 8 and all(r["dead_nids"] == [dropped] for r in unmask)
    # the survivors' mean: FedAvg over the four that answered, within the quantization error (of
    # two rounds in round 2, which trained from round 1's)
    bound = quantization_bound(settings, 4)
    for server_round in (1, 2):
        for name, value in plain.arrays[server_round].items():
            np.testing.assert_allclose(secure.arrays[server_round][name], value, rtol=0,
                                       atol=bound if server_round == 1 else 4 * bound)


@pytest.mark.parametrize("settings, message", [
    ({"method": "sfl"}, "method 'sfl''s server needs the individual models"),
    ({"aggregation": "median"}, "aggregation = 'median' needs each client's"),
    ({"dp": "client"}, "client-level DP clips each client's update on the server"),
    ({"num-clients": 2}, "needs at least 3 clients per round"),
    ({"secagg-num-shares": 2}, "secagg-num-shares = 2 must be 0"),
    ({"secagg-reconstruction-threshold": 5}, "secagg-reconstruction-threshold = 5 must be 0"),
    ({"num-clients": 300, "secagg-quantization-range": 2**24}, "below 2\\*\\*32"),
])
def test_settings_that_cannot_hold_fail_in_one_line(settings, message):
    with pytest.raises(ConfigError, match=message) as err:
        RunConfig.from_flower({**default_run_config(), **SMALL, "num-clients": 5,
                               "secure-aggregation": "secagg+", **settings})
    assert "\n" not in str(err.value)


def test_methods_whose_server_needs_only_a_sum_accept_it():
    for method in ("fedavg", "fedprox", "fedper", "lg-fedavg"):
        cfg = RunConfig.from_flower({**default_run_config(), **SMALL, "method": method,
                                     "num-clients": 5, "secure-aggregation": "secagg+"})
        assert cfg.secure_aggregation == "secagg+"


@pytest.mark.parametrize("method, shared", [("fedper", "features."), ("lg-fedavg", "head.")])
def test_partial_sharing_sums_the_shared_part_and_keeps_the_personal_part_on_the_client(
        tmp_path, method, shared):
    # 4 clients on 2 nodes, 2 rounds: round 2 trains from round 1's securely summed shared part and
    # from each client's own personal part, which only the client holds
    settings = {"num-clients": 4, "method": method, "num-rounds": 2}
    _, plain, plain_rounds = federation(tmp_path, "plain", settings, num_nodes=2)
    _, secure, rounds = federation(tmp_path, "secure", {**settings,
                                                        "secure-aggregation": "secagg+"}, num_nodes=2)
    assert [r["secagg"]["completed"] for r in rounds[1:]] == [True, True]

    def sent(recording: Recording, server_round: int) -> dict[int, dict[str, np.ndarray]]:
        """The `personal` model each client's train request of `server_round` carried."""
        trains = [m for m, _ in recording.exchanges if m.metadata.message_type == "train.local"]
        per_round = len(trains) // 2
        return {client_of(m): {k: a.numpy() for k, a in m.content["personal"].items()}
                for m in trains[(server_round - 1) * per_round:server_round * per_round]}

    first, plain_second, secure_second = sent(plain, 1), sent(plain, 2), sent(secure, 2)
    assert sorted(secure_second) == [0, 1, 2, 3]
    bound = quantization_bound(settings, 4)
    keys = list(first[0])
    assert any(k.startswith(shared) for k in keys) and not all(k.startswith(shared) for k in keys)
    for client, model in secure_second.items():
        for key in keys:
            if key.startswith(shared):  # the weighted mean of round 1's shared parts
                np.testing.assert_allclose(model[key], plain_second[client][key], rtol=0, atol=bound)
            else:  # the server has no personal part but the initial one
                np.testing.assert_array_equal(model[key], first[client][key])
    # no upload carries a personal array: only the masked shared part, exactly its arrays
    uploads = [r for m, r in secure.exchanges
               if m.metadata.message_type == "train.local" and SECAGG in m.content]
    assert len(uploads) == 8
    for reply in uploads:
        assert [n for n, r in reply.content.items() if isinstance(r, ArrayRecord)] == [SECAGG]
        assert list(reply.content[SECAGG].keys())[1:] == [k for k in keys if k.startswith(shared)]
    # each client trained and evaluated round 2 with its own personal part (the server's initial
    # one would not give the plain run's accuracies)
    np.testing.assert_allclose([r["train-loss"] for r in rounds[1:]],
                               [r["train-loss"] for r in plain_rounds[1:]], rtol=0, atol=1e-3)
    np.testing.assert_allclose([r["personalized"]["mean"] for r in rounds],
                               [r["personalized"]["mean"] for r in plain_rounds], rtol=0, atol=1e-6)
