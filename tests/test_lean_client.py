"""The deployed client's import path: a train and an evaluate message in a fresh interpreter (as each
deployed message runs in a fresh `flwr-clientapp` process) import none of the server-side or
compile-time libraries; the optimizer that avoids `torch._dynamo` updates exactly as torch's SGD."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from client_app.training import SGD
from tests.conftest import REPO

HEAVY = ("scipy", "sklearn", "numba", "umap", "matplotlib", "torch._dynamo")

CLIENT_MESSAGES = r"""
import json, sys
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
for name in ("run_id", "node_id", "task_id"):
    setattr(TaskIdentity, name, 1)
from client_app.app import app
from models import build_model
from strategies.shared.messages import (
    CLIENT, CONFIG, GLOBAL, METRICS, ClientAddress, EvaluateInstructions, TrainInstructions
)
import tomllib
table = tomllib.load(open("pyproject.toml", "rb"))["tool"]["flwr"]["app"]["config"]
run_config = {f"{k}.{n}" if isinstance(v, dict) else k: item for k, v in table.items()
              for n, item in (v.items() if isinstance(v, dict) else [(None, v)])}
run_config.update({"dataset": "digits", "model": "cnn", "num-clients": 2,
              "partition": "iid", "max-samples-per-client": 60, "finetune-epochs": 1})
context = Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 2},
                  state=RecordDict(), run_config=run_config)
arrays = ArrayRecord(build_model("cnn", (1, 28, 28), 10).state_dict())
client = ClientAddress(client_id=0).config()
train = Message(RecordDict({GLOBAL: arrays, CLIENT: client, CONFIG: TrainInstructions(
    server_round=1, lr=0.05, momentum=0.9, local_epochs=1, batch_size=16, seed=0).config()}),
    dst_node_id=7, message_type="train")
evaluate = Message(RecordDict({GLOBAL: arrays, CLIENT: client, CONFIG: EvaluateInstructions(
    server_round=1, batch_size=16, seed=0, finetune_epochs=1, lr=0.05, momentum=0.9).config()}),
    dst_node_id=7, message_type="evaluate")
replies = [app(train, context), app(evaluate, context)]
print(json.dumps({
    "errors": [r.error.reason for r in replies if r.has_error()],
    "examples": [int(r.content[METRICS]["num-examples"]) for r in replies if not r.has_error()],
    "loaded": sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in %r)),
}))
""" % (HEAVY,)


def test_train_and_evaluate_messages_import_no_heavy_library():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CLIENT_MESSAGES], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == []
    assert result["examples"][0] > 0 and result["examples"][1] > 0
    assert result["loaded"] == [], f"the client path imported {result['loaded'][:10]}"


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_updates_exactly_as_torch_optim_sgd(momentum):
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    ours = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    ours.load_state_dict(reference.state_dict())
    ours[2].bias.requires_grad_(False)  # a frozen parameter is skipped by both
    reference[2].bias.requires_grad_(False)
    torch_sgd = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=momentum)
    plain_sgd = SGD(ours.parameters(), lr=0.1, momentum=momentum)
    for step in range(4):
        x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
        for model, optimizer in ((reference, torch_sgd), (ours, plain_sgd)):
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    for (name, a), b in zip(reference.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(reference[0].weight, torch.zeros_like(reference[0].weight))


def test_digits_read_without_scikit_learn_equal_load_digits():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    from datasets.sources import _digits

    images, labels = _digits()
    bunch = sklearn_datasets.load_digits()
    small = torch.from_numpy(np.asarray(bunch.images, dtype=np.float32)[:, None] / 16.0)
    expected = torch.nn.functional.interpolate(small, size=(28, 28), mode="bilinear",
                                               align_corners=False).clamp(0.0, 1.0).numpy()
    assert np.array_equal(images, expected)
    assert np.array_equal(labels, bunch.target) and labels.dtype == np.int64
