"""Reliability: checkpoints and resume, reply validation, cross-field config rules (fault injection)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app import evaluation
from client_app.methods import fedavg
from client_app import identify
from client_app.app import with_evaluation
from server_app.app import run
from server_app.checkpoint import CheckpointError, CheckpointStore, checkpoint_path
from strategies.shared.settings import ConfigError
from strategies.shared.run_config import RunConfig
from server_app.harness.local_grid import LocalGrid
from server_app.harness.simulate import simulate
from strategies.shared.run_config import default_run_config
from strategies.shared.messages import CLIENT, METRICS, MODEL

REPO = Path(__file__).resolve().parent.parent


# --- checkpoint files ---------------------------------------------------------------------------
def test_checkpoints_are_atomic_checksummed_and_pruned(tmp_path):
    store = CheckpointStore(tmp_path / "ck", keep=2)
    for r in range(4):
        store.save(r, {"round": r, "v": np.arange(5) * r})
    assert store.rounds() == [3, 2]  # older ones pruned, no temporary files left behind
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["round-00002.ckpt",
                                                                  "round-00003.ckpt"]
    assert store.load_latest()["round"] == 3
    np.testing.assert_array_equal(store.load(2)["v"], np.arange(5) * 2)


def test_only_the_newest_checkpoint_is_kept_by_default(tmp_path):
    store = CheckpointStore(tmp_path / "ck")
    for r in range(1, 4):
        store.save(r, {"round": r})
        assert store.rounds() == [r]  # the older one is deleted once the new one is written
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["round-00003.ckpt"]
    assert store.load_latest()["round"] == 3
    store.save(2, {"round": 2})  # a resumed run writing a round again keeps what it just wrote
    assert store.rounds() == [2]
    with pytest.raises(ValueError, match="keep-checkpoints = 0 must be at least 1"):
        CheckpointStore(tmp_path / "none", keep=0)


def test_arrays_received_over_grpc_are_checkpointed(tmp_path):
    """Replies deserialised from gRPC hold memoryviews of the message buffer (plain pickle fails)."""
    record = ArrayRecord({"w": Array(np.arange(6, dtype=np.float32).reshape(2, 3))})
    record["w"].__dict__["data"] = memoryview(record["w"].data)
    store = CheckpointStore(tmp_path)
    store.save(1, {"arrays": record})
    np.testing.assert_array_equal(store.load(1)["arrays"]["w"].numpy(),
                                  np.arange(6, dtype=np.float32).reshape(2, 3))


def test_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    store = CheckpointStore(tmp_path, keep=2)
    store.save(1, {"round": 1})
    store.save(2, {"round": 2})
    path = checkpoint_path(tmp_path, 2)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="flwr.bouquet"):
        assert store.load_latest()["round"] == 1
    assert "round 2 is unusable" in caplog.text and "checksum" in caplog.text
    path.write_bytes(b"BOUQUET-CHECKPOINT-1\n")  # truncated by a crash mid-write
    assert store.load_latest()["round"] == 1
    checkpoint_path(tmp_path, 1).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="every checkpoint .* is corrupt"):
        store.load_latest()


# --- resume -------------------------------------------------------------------------------------
def _config(tmp_path, method: str, **extra) -> dict:
    """A small run; the safeguard is off because its own models live in the clients' node state,
    which a resumed run (a new Flower run) starts without (see the safeguard's resume test)."""
    return {"dataset": "digits", "model": "mlp", "partition": "shards", "num-clients": 6,
            "num-rounds": 3, "max-samples-per-client": 60, "client-threads": 1,
            "fraction-train": 0.5, "finetune-epochs": 0, "method": method,
            "output-dir": str(tmp_path), "run-name": "run", "safeguard": "off", **extra}


FEDCG = {"partition": "domains", "model": "cnn", "num-clients": 8, "max-samples-per-client": 40,
         "fedcg.teacher-period": 2, "fedcg.adj-warmup": 1, "fedcg.domain-stride": 2}


@pytest.mark.federation
@pytest.mark.parametrize("method, extra", [
    ("fedavg", {}), ("sfl-star", {}), ("ifca", {}), ("ditto", {}), ("fedsem", {}), ("fedu", {}),
    ("fedcg", FEDCG),  # the teacher is replaced at round 2, after the resume point
])
def test_resumed_run_equals_an_uninterrupted_one(tmp_path, method, extra):
    full = simulate(_config(tmp_path / "full", method, **extra))
    simulate(_config(tmp_path / "cut", method, **{**extra, "num-rounds": 1}))  # stops after round 1
    resumed = simulate(_config(tmp_path / "cut", method, resume=True, **extra))
    assert resumed["final"] == full["final"]  # bit-identical on this deterministic CPU backend
    rounds = [json.loads(line) for line in (tmp_path / "cut" / "run" / "rounds.jsonl").open()]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]


@pytest.mark.federation
def test_a_resumed_run_with_the_safeguard_restarts_the_clients_own_models(tmp_path):
    """The clients' own models are node state of the interrupted run: after a resume every client
    first uses the method's model again (no client mixes in the first resumed evaluation), then
    keeps a new own model; the server's state is restored as without the safeguard."""
    extra = {"safeguard": "mix", "finetune-epochs": 1}
    full = simulate(_config(tmp_path / "full", "sfl", **extra))
    simulate(_config(tmp_path / "cut", "sfl", **{**extra, "num-rounds": 1}))
    resumed = simulate(_config(tmp_path / "cut", "sfl", resume=True, **extra))
    full_rounds = [json.loads(line) for line in (tmp_path / "full" / "run" / "rounds.jsonl").open()]
    rounds = [json.loads(line) for line in (tmp_path / "cut" / "run" / "rounds.jsonl").open()]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert rounds[0] == full_rounds[0] | {"seconds": rounds[0]["seconds"]}  # before the cut
    # round 1's evaluation was pending at the checkpoint: the resumed run's clients make it without
    # an own model, where the uninterrupted run's clients mixed theirs in
    assert rounds[1]["safeguard-mixed"] == 0 < full_rounds[1]["safeguard-mixed"]
    assert rounds[3]["safeguard-mixed"] > 0  # then they keep new own models
    assert resumed["final"]["personalized"]["mean"] > 0


def _run_in_subprocess(config: dict) -> subprocess.Popen:
    code = ("import json, sys; from server_app.harness.simulate import simulate; "
            "simulate(json.loads(sys.argv[1]))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(config)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


@pytest.mark.federation
@pytest.mark.parametrize("method", ["flt", "sfl", "fedska"])
def test_server_killed_after_round_k_resumes_to_the_same_result(tmp_path, method):
    """Kill -9 the server process once a round's checkpoint exists, resume, compare.

    The run keeps one checkpoint (the default), so round 1's is replaced by round 2's a fraction
    of a second later: the test kills at the first checkpoint it sees, whichever round it holds,
    and the run is long enough that a busy machine still catches it before the last round."""
    extra = {"flt.ae-rounds": 0} if method == "flt" else {}
    killed = _config(tmp_path / "killed", method, **{"num-rounds": 8, **extra})
    process = _run_in_subprocess(killed)
    checkpoints = CheckpointStore(tmp_path / "killed" / "run" / "checkpoints")
    deadline = time.monotonic() + 300
    try:
        while not checkpoints.rounds() and process.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.02)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # the process group this test started
        process.wait()
    assert process.returncode == -signal.SIGKILL, f"the run ended by itself ({process.returncode})"
    assert not (tmp_path / "killed" / "run" / "summary.json").exists(), "the run was not cut short"
    resumed = simulate({**killed, "resume": True})
    full = simulate(_config(tmp_path / "full", method, **{"num-rounds": 8, **extra}))
    assert resumed["final"] == full["final"]


@pytest.mark.federation
def test_resume_after_corrupting_the_last_checkpoint_uses_the_one_before(tmp_path, caplog):
    full = simulate(_config(tmp_path / "full", "sfl"))
    assert CheckpointStore(tmp_path / "full" / "run" / "checkpoints").rounds() == [3]  # default: 1
    config = _config(tmp_path / "cut", "sfl", **{"keep-checkpoints": 2})
    simulate(config)
    store = CheckpointStore(tmp_path / "cut" / "run" / "checkpoints")
    assert store.rounds() == [3, 2]
    path = checkpoint_path(store.directory, 3)
    path.write_bytes(path.read_bytes()[:-100])  # truncated
    with caplog.at_level(logging.WARNING, logger="flwr.bouquet"):
        resumed = simulate({**config, "resume": True})
    assert "round 3 is unusable" in caplog.text
    assert resumed["final"] == full["final"]  # round 3 was run again from round 2's state


@pytest.mark.federation
def test_resume_refuses_changed_settings_and_missing_checkpoints(tmp_path):
    simulate(_config(tmp_path, "fedavg", **{"num-rounds": 1}))
    with pytest.raises(RuntimeError, match="written with lr=0.05 but this run has lr=0.1"):
        simulate(_config(tmp_path, "fedavg", resume=True, lr=0.1))
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        simulate(_config(tmp_path, "fedavg", resume=True, **{"run-name": "other"}))


@pytest.mark.federation
def test_a_new_run_never_overwrites_earlier_results(tmp_path):
    simulate(_config(tmp_path, "fedavg", **{"num-rounds": 1}))
    before = (tmp_path / "run" / "rounds.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds the results of a run"):
        simulate(_config(tmp_path, "fedavg"))
    assert (tmp_path / "run" / "rounds.jsonl").read_text() == before


# --- reply validation ---------------------------------------------------------------------------
FAULTY = 1  # the client whose replies the faults below corrupt


def _nan(content):
    arrays = content[MODEL].to_torch_state_dict()
    next(iter(arrays.values()))[0] = float("nan")
    content[MODEL] = ArrayRecord(arrays)


def _wrong_shape(content):
    arrays = content[MODEL].to_torch_state_dict()
    name = next(iter(arrays))
    arrays[name] = arrays[name][:-1]
    content[MODEL] = ArrayRecord(arrays)


def _huge_norm(content):
    arrays = content[MODEL].to_torch_state_dict()
    next(iter(arrays.values())).mul_(1e6)
    content[MODEL] = ArrayRecord(arrays)


def _negative_examples(content):
    content[METRICS]["num-examples"] = -5


def _too_many_examples(content):
    content[METRICS]["num-examples"] = 10**6


def _unexpected_record(content):
    content["backdoor"] = MetricRecord({"x": 1.0})


def _no_metrics(content):
    del content[METRICS]


FAULTS = {
    "nan": (_nan, "finite values"),
    "wrong-shape": (_wrong_shape, "model structure"),
    "huge-norm": (_huge_norm, "update norm"),
    "negative-num-examples": (_negative_examples, "num-examples: -5 is not positive"),
    "num-examples-above-declared": (_too_many_examples, "num-examples: 1000000 is above the"),
    "unexpected-record": (_unexpected_record, "records: unexpected record(s) ['backdoor']"),
    "missing-metrics": (_no_metrics, "records: a 'train' reply must carry a 'metrics' MetricRecord"),
}


def _faulty_app(fault) -> ClientApp:
    app = ClientApp()
    app.query("identify")(identify.identify)
    app.evaluate()(evaluation.evaluate)

    @app.train()
    @with_evaluation  # a fused message's evaluation goes through Bouquet's own routing
    def train(message: Message, context) -> Message:
        reply = fedavg.train(message, context)
        if int(message.content[CLIENT]["client-id"]) == FAULTY:
            content = RecordDict(dict(reply.content.items()))
            fault(content)
            return Message(content, reply_to=message)
        return reply

    return app


@pytest.mark.federation
@pytest.mark.parametrize("fault", list(FAULTS))
def test_bad_reply_is_dropped_named_in_the_log_and_the_run_completes(tmp_path, caplog, fault):
    corrupt, check = FAULTS[fault]
    flat = {**default_run_config(), **_config(tmp_path, "fedavg", **{"fraction-train": 1.0,
                                                                     "num-rounds": 2})}
    cfg = RunConfig.from_flower(flat)
    with caplog.at_level(logging.WARNING, logger="flwr.bouquet"):
        summary = run(LocalGrid(_faulty_app(corrupt), 3, flat), cfg, connect_timeout=5.0)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").open()]
    assert [r["failed-clients"] for r in rounds[1:]] == [[FAULTY], [FAULTY]]
    assert [r["clients-trained"] for r in rounds[1:]] == [5, 5]
    assert f"client {FAULTY} failed and is skipped: invalid reply dropped ({check}" in caplog.text
    assert summary["final"]["personalized"]["mean"] > 0


@pytest.mark.federation
def test_valid_replies_pass_and_the_norm_bound_can_be_disabled(tmp_path):
    flat = {**default_run_config(), **_config(tmp_path, "fedavg", **{"max-update-norm": 0.0,
                                                                     "num-rounds": 1})}
    cfg = RunConfig.from_flower(flat)
    run(LocalGrid(_faulty_app(_huge_norm), 3, flat), cfg, connect_timeout=5.0)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").open()]
    assert rounds[1]["failed-clients"] == []  # a huge (finite) update passes when unbounded


# --- cross-field run-config rules ---------------------------------------------------------------
@pytest.mark.parametrize("config, message", [
    ({"fraction-train": 0.1, "num-clients": 5}, "fraction-train × num-clients = 0.1 × 5 selects no "
                                                 "client"),
    ({"resume": True}, "resume=true needs run-name"),
    ({"partition": "domains", "domain-rotations": "0"}, "partition 'domains' needs at least 2 "
                                                         "domains"),
    ({"method": "fedcg", "model": "cnn", "fedcg.clustering": "oracle"}, "fedcg.clustering='oracle' trains with each "
                                                         "image's true domain: it needs partition"),
    ({"partition": "label-clusters", "num-clusters": 6, "labels-per-cluster": 2},
     "num-clusters × labels-per-cluster = 6 × 2 exceeds the 10 classes of 'mnist'"),
    ({"partition": "label-clusters", "num-clusters": 4, "labels-per-cluster": 1,
      "num-clients": 3}, "num-clusters = 4 exceeds num-clients = 3"),
    ({"method": "sfl-star", "num-clients": 5, "sfl.gl-k": 7},
     "sfl.gl-k = 7 must be at most 4 with num-clients = 5"),
    ({"method": "fedska", "num-clients": 5, "fedska.k": 6},
     "fedska.k = 6 must be at most 4 with num-clients = 5"),
    ({"method": "ifca", "num-clients": 3, "ifca.clusters": 4},
     "ifca.clusters = 4 must be at most 3"),
    ({"method": "fedsem", "num-clients": 3, "fedsem.clusters": 4},
     "fedsem.clusters = 4 must be at most 3"),
    ({"method": "flt", "num-clients": 3, "flt.clusters": 4}, "flt.clusters = 4 must be at most 3"),
    ({"dataset": "metr-la", "partition": "iid", "model": "gru"},
     "dataset 'metr-la' is traffic (one client per sensor): set partition='sensors'"),
    ({"max-update-norm": -1.0}, "key 'max-update-norm' = -1.0 is invalid"),
    ({"checkpoint-every": -1}, "key 'checkpoint-every' = -1 is invalid"),
    ({"method": "sfl", "aggregation": "median"}, "aggregation='median' applies to the global part of"),
    ({"trim-fraction": 0.5}, "key 'trim-fraction' = 0.5 is invalid"),
])
def test_cross_field_rules_fail_with_an_actionable_message(config, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({**default_run_config(), **config})
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_defaults_are_capped_not_rejected_for_small_federations():
    for method in ("sfl-star", "fedska", "ifca", "fedsem"):
        RunConfig.from_flower({**default_run_config(), "method": method, "num-clients": 3})


# --- robust aggregation -------------------------------------------------------------------------
def test_robust_rules_are_the_coordinatewise_median_and_trimmed_mean():
    import torch

    from strategies.shared.personalized import PersonalizedStrategy

    rows = torch.tensor([[0.0, 10.0], [1.0, 20.0], [2.0, 30.0], [3.0, 40.0], [1000.0, -1e6]])
    weights = torch.tensor([1.0, 1.0, 1.0, 1.0, 100.0])

    def global_mean(rule: str, trim_fraction: float = 0.2) -> list[float]:
        strategy = PersonalizedStrategy(5, 1.0, rule, trim_fraction)
        return strategy.global_mean(rows, weights).tolist()

    assert global_mean("median") == [2.0, 20.0]
    # cut 1 of 5 per side: coordinate 0 keeps {1, 2, 3}, coordinate 1 keeps {10, 20, 30}
    assert global_mean("trimmed-mean", 0.2) == [2.0, 20.0]
    assert global_mean("mean") == pytest.approx(((weights / weights.sum()) @ rows).tolist())


def _poison(content):
    arrays = content[MODEL].to_torch_state_dict()
    for tensor in arrays.values():
        tensor.add_(50.0)
    content[MODEL] = ArrayRecord(arrays)


@pytest.mark.federation
@pytest.mark.parametrize("aggregation", ["median", "trimmed-mean"])
def test_robust_aggregation_withstands_a_poisoned_client_that_the_mean_does_not(tmp_path,
                                                                                aggregation):
    def global_accuracy(rule: str, app: ClientApp) -> float:
        flat = {**default_run_config(), **_config(
            tmp_path / f"{rule}-{len(list(tmp_path.iterdir()))}", "fedavg", **{
                "fraction-train": 1.0, "num-rounds": 3, "local-epochs": 3,
                "max-samples-per-client": 150, "max-update-norm": 0.0, "aggregation": rule,
                "partition": "iid"})}
        summary = run(LocalGrid(app, 3, flat), RunConfig.from_flower(flat), connect_timeout=5.0)
        return summary["final"]["global-accuracy"]

    poisoned = _faulty_app(_poison)
    clean = global_accuracy("mean", _faulty_app(lambda content: None))
    robust, mean = global_accuracy(aggregation, poisoned), global_accuracy("mean", poisoned)
    assert clean > 60.0
    assert mean < 20.0  # one poisoned client of six wrecks the weighted mean
    assert robust > clean - 15.0


@pytest.mark.federation
def test_an_unwritable_output_dir_fails_before_any_client_is_contacted(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    grid = LocalGrid(_faulty_app(lambda content: None), 2, {})
    flat = {**default_run_config(), **_config(blocker, "fedavg")}
    with pytest.raises(ConfigError, match="cannot write results to .*set output-dir to a writable"):
        run(grid, RunConfig.from_flower(flat), connect_timeout=5.0)
    assert blocker.read_text() == "not a folder"


@pytest.mark.federation
def test_a_missing_data_root_stops_the_run_when_nodes_join_naming_the_files(tmp_path):
    from server_app.runner import ClientsUnavailableError

    config = _config(tmp_path, "fedavg", dataset="cifar10", model="cnn",
                     **{"data-root": str(tmp_path / "no-such-folder")})
    with pytest.raises(ClientsUnavailableError, match="failed to identify itself.*cifar-10"):
        simulate(config)
    assert not (tmp_path / "run" / "rounds.jsonl").read_text()  # no round was run


def test_declared_model_records_are_accepted_and_checked_undeclared_ones_are_dropped():
    """IFCA declares its `cluster-<i>` records on its `Method`; validation takes them from the
    registry: a cluster model is accepted and checked against the models sent, and a validator that
    knows no such declaration drops the same reply as an unexpected record."""
    from server_app.validation import ReplyValidator, known_record_names, model_record_patterns
    from strategies.methods.ifca.settings import TRAIN_IFCA, cluster_model

    model = ArrayRecord({"w": Array(np.ones((2, 3), dtype=np.float32))})
    request = Message(RecordDict({cluster_model(0): model, cluster_model(1): model}), dst_node_id=1,
                      message_type=TRAIN_IFCA)

    def reply(record: ArrayRecord) -> Message:
        return Message(RecordDict({cluster_model(7): record,
                                   METRICS: MetricRecord({"num-examples": 3})}), reply_to=request)

    assert "cluster-*" in model_record_patterns()
    validator = ReplyValidator(0.0, known_record_names(), model_record_patterns())
    validator.declare(1, 10, 10)
    assert validator.problem(1, request, reply(model)) is None
    wrong = ArrayRecord({"w": Array(np.ones((3, 3), dtype=np.float32))})
    assert validator.problem(1, request, reply(wrong)).startswith("model structure: 'cluster-7'")
    shared_only = ReplyValidator(0.0, known_record_names())
    shared_only.declare(1, 10, 10)
    assert shared_only.problem(1, request, reply(model)) == (
        "records: unexpected record(s) ['cluster-7'] in a 'train.ifca' reply")


def test_a_checkpoint_of_the_earlier_safeguard_state_still_resumes():
    """A checkpoint written before the start evidence held a `PooledGains`, and before the
    fine-tuning evidence was pooled, restores into the current state."""
    import pickle

    from builders import consensus_strategy, safeguard_component
    from strategies.shared.evidence import PooledGains, StartEvidence

    earlier = StartEvidence("federation", switched=3)
    earlier.__dict__ = {"mode": "federation", "gain": 9.0, "square": 9.0, "switched": 3}
    start = pickle.loads(pickle.dumps(earlier))
    assert start.pooled == PooledGains(9.0, 9.0) and start.switched == 3
    assert not start.from_consensus
    component = safeguard_component("flt", consensus_strategy())
    component.restore({"weight": 0.5, "start": start})
    assert component.weight == 0.5 and component.tuned == PooledGains()


def test_a_checkpoint_keeps_the_federations_safeguard_weight_and_start(tmp_path):
    """The federation's pooled weight, start and fine-tuning evidence (the safeguard's own state)
    survive a resume: the restored component sends the weight of the interrupted run, not the
    consensus's 1, its clients train from their mixes if the interrupted run had switched to them,
    and answer with their fine-tuned models if its evidence favoured them."""
    from builders import consensus_strategy, safeguard_component
    from server_app.callbacks import Checkpointing, RunView

    def checkpointing(component):
        callback = Checkpointing(CheckpointStore(tmp_path))
        callback.attach(RunView(component.cfg, tmp_path, None, parts={"safeguard": component}))
        return callback

    federation = {"safeguard-finetune": "federation"}
    interrupted = safeguard_component("flt", consensus_strategy(), 0.25, **federation)
    interrupted.start.pool(3, [(9.0, 9.0)], 1.0)  # 3 standard errors: the mix from now on
    interrupted.tuned.add([(2.0, 4.0)])  # the fine-tuned answers scored better: they answer
    checkpointing(interrupted).round_finished(interrupted.cfg.num_rounds, ArrayRecord(), 1.0, None)
    resumed = safeguard_component("flt", consensus_strategy(), **federation)
    assert resumed.instructions().train_consensus and resumed.instructions().finetune is False
    point = checkpointing(resumed).resume()
    assert (point.server_round, point.seconds, point.pending) == (interrupted.cfg.num_rounds, 1.0, None)
    assert resumed.weight == 0.25
    assert (resumed.start.switched, resumed.start.pooled.gain) == (3, 9.0)
    assert (resumed.tuned.gain, resumed.tuned.square) == (2.0, 4.0)
    sent = resumed.instructions()
    assert sent.weight == 0.25 and sent.train_consensus is None and sent.finetune


def test_a_checkpoint_holds_each_components_own_state_and_names_what_it_lacks(tmp_path):
    """Checkpointing saves every stateful component under its name and restores each from it; a
    checkpoint without a component's state cannot resume the run."""
    from server_app.callbacks import Checkpointing, ResumeError, RunView, TrafficCount
    from strategies.shared.run_config import RunConfig, default_run_config

    cfg = RunConfig.from_flower(default_run_config())
    traffic = TrafficCount(2)
    traffic.bytes_exchanged(1, {0: 5, 1: 7}, {0: 2})
    traffic.completing_round({"round": 1, "seconds": 0.5})
    traffic.bytes_exchanged(2, {1: 3}, {})  # a round whose record is still open
    saving = Checkpointing(CheckpointStore(tmp_path))
    saving.attach(RunView(cfg, tmp_path, None, parts={"traffic": traffic}))
    saving.round_finished(cfg.num_rounds, ArrayRecord(), 2.0, {"round": 2})
    restored = TrafficCount(2)
    loading = Checkpointing(CheckpointStore(tmp_path))
    loading.attach(RunView(cfg, tmp_path, None, parts={"traffic": restored}))
    assert loading.resume().pending == {"round": 2}
    assert restored.totals == {0: [5, 2], 1: [7, 0]} and restored.open == {2: ({1: 3}, {})}
    record = {"round": 2, "seconds": 1.0}
    restored.completing_round(record)
    assert (record["bytes-down"], record["bytes-up"]) == (3, 0)
    lacking = Checkpointing(CheckpointStore(tmp_path))
    lacking.attach(RunView(cfg, tmp_path, None, parts={"traffic": TrafficCount(2),
                                                       "safeguard": traffic}))
    with pytest.raises(ResumeError, match="no state of safeguard"):
        lacking.resume()
