"""A minimal Flower FedAvg app: Flower's own `FedAvg` and `start()`, a small torch CNN on the digits
data (scikit-learn's bundled 8x8 digits upsampled to 28x28), as a Flower user would write it.

The same model (two conv5x5 + pool stages, Linear 128, Linear 10), data, per-client sample count and
local training (1 epoch of minibatch SGD, `torch.optim.SGD`) as Bouquet's `fedavg` with
`dataset=digits model=cnn partition=iid` in benchmarks/studies/deploy_speed.py. It imports nothing from
Bouquet. The ServerApp writes the wall-clock start of each round and the end of the last one to
`timings-file` (JSON).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from torch import nn
from torch.nn import functional as F


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    spec = importlib.util.find_spec("sklearn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",")
    small = torch.from_numpy(table[:, :-1].reshape(-1, 1, 8, 8).astype(np.float32) / 16.0)
    images = F.interpolate(small, size=(28, 28), mode="bilinear", align_corners=False).clamp(0, 1)
    return images, torch.from_numpy(table[:, -1].astype(np.int64))


def partition(context: Context) -> tuple[torch.Tensor, ...]:
    """This node's IID share: `samples-per-client` samples, 80% train / 20% test."""
    images, labels = digits()
    pid, parts = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    n = int(context.run_config["samples-per-client"])
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    mine = order[pid * n:(pid + 1) * n] if (pid + 1) * n <= len(labels) else order[pid::parts][:n]
    cut = int(0.8 * len(mine))
    return images[mine[:cut]], labels[mine[:cut]], images[mine[cut:]], labels[mine[cut:]]


def received(message: Message) -> nn.Module:
    model = cnn()
    model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    return model


client = ClientApp()


@client.train()
def train(message: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    x, y, _, _ = partition(context)
    model = received(message)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(message.content["config"]["lr"]))
    batch = int(context.run_config["batch-size"])
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(
        int(context.run_config["seed"]) + int(message.content["config"]["server-round"])))
    total = 0.0
    model.train()
    for start in range(0, len(y), batch):
        idx = order[start:start + batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += float(loss) * len(idx)
    return Message(RecordDict({
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord({"num-examples": len(y), "train-loss": total / len(y)}),
    }), reply_to=message)


@client.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    _, _, x, y = partition(context)
    model = received(message)
    model.eval()
    with torch.no_grad():
        output = model(x)
    return Message(RecordDict({"metrics": MetricRecord({
        "num-examples": len(y), "loss": float(F.cross_entropy(output, y)),
        "accuracy": float((output.argmax(1) == y).float().mean()),
    })}), reply_to=message)


class TimedFedAvg(FedAvg):
    """FedAvg that notes the wall-clock start of each round (its configure_train)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.starts: list[float] = []

    def configure_train(self, server_round, arrays, config, grid):
        self.starts.append(time.time())
        return super().configure_train(server_round, arrays, config, grid)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    nodes = 3
    strategy = TimedFedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=nodes,
                           min_evaluate_nodes=nodes, min_available_nodes=nodes)
    torch.manual_seed(int(context.run_config["seed"]))
    result = strategy.start(grid, ArrayRecord(cnn().state_dict()),
                            num_rounds=int(context.run_config["num-server-rounds"]),
                            train_config=ConfigRecord({"lr": float(context.run_config["lr"])}))
    end = time.time()
    path = str(context.run_config["timings-file"])
    if path:
        accuracy = result.evaluate_metrics_clientapp
        Path(path).write_text(json.dumps({
            "round-starts": strategy.starts, "end": end,
            "accuracy": {int(r): float(m["accuracy"]) for r, m in accuracy.items()},
        }))
