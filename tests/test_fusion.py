"""Evaluation riding on the next round's train message (`fuse-evaluate`, default) gives every metric
the value and round it has with a separate evaluate phase, in one phase per round."""

import json

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from server_app.harness.simulate import simulate
from strategies.shared.fusion import fuse, fuse_reply, split_reply, split_request
from strategies.shared.messages import CLIENT, CONFIG, EVALUATION_PREFIX, FUSED, GLOBAL, METRICS
from server_app.harness.local_grid import set_task_identity

set_task_identity()

TRANSPORT = ("seconds", "bytes-down", "bytes-up", "bytes-down-per-client", "bytes-up-per-client",
             "phases")


def _values(record: dict) -> dict:
    """A round record without what measures the transport (time, bytes, exchanges)."""
    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if not k.endswith("seconds")}
        return value
    return {k: clean(v) for k, v in record.items()
            if k not in TRANSPORT and not k.endswith(("seconds", "bytes-per-client"))}


CASES = {
    # fraction-train 0.5: the clients not trained get their evaluation alone in the same phase;
    # eval-every 2: round 1 is not evaluated, round 3 (the last) is
    "fedavg": {"fraction-train": 0.5, "eval-every": 2},
    # clients without a cluster are evaluated with `evaluate.ifca`, the others with `evaluate`
    "ifca": {"ifca.clusters": 2, "fraction-train": 0.5},
    # the safeguard on: the evaluation's `personal` and `global` are the training's `global` (the
    # graph start) and `embed_model` (w̄), shared across names
    "fedska": {"fraction-train": 0.5, "fedska.k": 1, "fedska.structure-steps": 2},
    # evaluation goes to held-out test clients, training to the others; evaluate.fedcg (balance
    # none: the Sinkhorn queries of each new teacher are phases of their own, fused or not)
    "fedcg": {"fedcg.balance": "none", "model": "cnn", "partition": "domains", "num-clients": 8, "max-samples-per-client": 30,
              "batch-size": 10, "domain-test-clients": 0.5, "fedcg.teacher-period": 2,
              "fedcg.adj-warmup": 1, "fedcg.bottleneck": 8, "fedcg.domain-stride": 2},
}


@pytest.mark.federation
@pytest.mark.parametrize("method", sorted(CASES))
def test_fused_and_unfused_runs_give_the_same_metrics_in_fewer_phases(method, tiny_run, tmp_path):
    rounds, summaries = {}, {}
    for fuse_evaluate in (True, False):
        name = f"{method}-{fuse_evaluate}"
        summaries[fuse_evaluate] = simulate({
            **tiny_run, "num-rounds": 3, "finetune-epochs": 1, "max-samples-per-client": 100,
            **CASES[method], "method": method, "fuse-evaluate": fuse_evaluate, "run-name": name,
        }, num_nodes=2)
        rounds[fuse_evaluate] = [json.loads(line) for line in
                                 (tmp_path / name / "rounds.jsonl").read_text().splitlines()]
    fused, unfused = rounds[True], rounds[False]
    assert [r["round"] for r in fused] == [r["round"] for r in unfused] == [0, 1, 2, 3]
    assert [_values(r) for r in fused] == [_values(r) for r in unfused]
    assert summaries[True]["final"] == summaries[False]["final"]
    assert "personalized" in fused[-1]
    # fused: one phase per round (round 0's evaluation rides on round 1), one more at the end
    evaluated = [r["round"] for r in unfused if "evaluated-clients" in r]
    assert sum(r["phases"] for r in unfused) == 3 + len(evaluated)
    assert sum(r["phases"] for r in fused) == 3 + 1


def test_a_record_identical_in_both_halves_travels_once():
    model = ArrayRecord([np.arange(6, dtype=np.float32)])
    same_model = ArrayRecord([np.arange(6, dtype=np.float32)])
    train = Message(RecordDict({GLOBAL: model, CONFIG: ConfigRecord({"lr": 0.1})}),
                    dst_node_id=3, message_type="train")
    evaluation = Message(RecordDict({GLOBAL: same_model, CONFIG: ConfigRecord({"batch-size": 8})}),
                         dst_node_id=3, message_type="evaluate.ifca")
    fused = fuse(train, evaluation)
    assert sorted(fused.content.keys()) == sorted([GLOBAL, CONFIG, EVALUATION_PREFIX + CONFIG, FUSED])
    fused.content[CLIENT] = ConfigRecord({"client-id": 5})  # added on the way to the node
    train_part, evaluation_part = split_request(fused)
    assert evaluation_part.metadata.message_type == "evaluate.ifca"
    assert train_part.metadata.message_type == "train"
    assert dict(evaluation_part.content[CONFIG]) == {"batch-size": 8}
    assert dict(train_part.content[CONFIG]) == {"lr": 0.1}
    for part in (train_part, evaluation_part):
        assert part.content[GLOBAL].to_numpy_ndarrays()[0].tolist() == list(range(6))
        assert dict(part.content[CLIENT]) == {"client-id": 5}
    reply = fuse_reply(fused,
                       Message(RecordDict({METRICS: MetricRecord({"train-loss": 1.5})}),
                               reply_to=train_part),
                       Message(RecordDict({METRICS: MetricRecord({"correct": 3})}),
                               reply_to=evaluation_part))
    trained, evaluated = split_reply(fused, reply)
    assert dict(trained.content[METRICS]) == {"train-loss": 1.5}
    assert dict(evaluated.content[METRICS]) == {"correct": 3}
    assert evaluated.metadata.message_type == "evaluate.ifca"


def test_a_model_identical_to_a_train_model_of_another_name_travels_once():
    start, average = (ArrayRecord([np.full(4, v, dtype=np.float32)]) for v in (1.0, 2.0))
    train = Message(RecordDict({GLOBAL: start, "embed_model": average,
                                CONFIG: ConfigRecord({"lr": 0.1})}), dst_node_id=3, message_type="train")
    evaluation = Message(RecordDict({
        "personal": ArrayRecord([np.full(4, 1.0, dtype=np.float32)]),
        GLOBAL: ArrayRecord([np.full(4, 2.0, dtype=np.float32)]),
        "other": ArrayRecord([np.full(4, 3.0, dtype=np.float32)]),
        CONFIG: ConfigRecord({"lr": 0.1})}), dst_node_id=3, message_type="evaluate")
    fused = fuse(train, evaluation)
    models = [name for name, record in fused.content.items() if isinstance(record, ArrayRecord)]
    assert sorted(models) == sorted([GLOBAL, "embed_model", EVALUATION_PREFIX + "other"])
    train_part, evaluation_part = split_request(fused)
    assert sorted(train_part.content.keys()) == sorted([GLOBAL, "embed_model", CONFIG])
    for name, value in (("personal", 1.0), (GLOBAL, 2.0), ("other", 3.0)):
        assert evaluation_part.content[name].to_numpy_ndarrays()[0].tolist() == [value] * 4
    assert train_part.content[GLOBAL].to_numpy_ndarrays()[0].tolist() == [1.0] * 4
    assert dict(evaluation_part.content[CONFIG]) == {"lr": 0.1}
    del fused.content["embed_model"]
    with pytest.raises(ValueError, match="'embed_model'"):
        split_request(fused)


@pytest.mark.federation
def test_a_fused_checkpoint_resumes_unfused_to_the_same_numbers(tiny_run, tmp_path):
    """The checkpoint of a fused run holds the round whose evaluation was still due; a resumed run
    evaluates it first, whichever way it sends evaluations."""
    base = {**tiny_run, "method": "ditto", "num-rounds": 3}
    full = simulate({**base, "run-name": "full"})
    simulate({**base, "num-rounds": 1, "run-name": "cut"})
    resumed = simulate({**base, "run-name": "cut", "resume": True, "fuse-evaluate": False})
    assert resumed["final"] == full["final"]
    rounds = [json.loads(line) for line in (tmp_path / "cut" / "rounds.jsonl").read_text().splitlines()]
    full_rounds = [json.loads(line) for line in
                   (tmp_path / "full" / "rounds.jsonl").read_text().splitlines()]
    assert [_values(r) for r in rounds] == [_values(r) for r in full_rounds]
