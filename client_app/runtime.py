"""What a client handler needs for one message: the validated run config, which logical client it is,
its data (loaded once per process: what the node hosts is `client_app.node`), the device, and models
built from records."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache

import torch
from flwr.app import ArrayRecord, Context, Message

from client_app.devices import resolve_device
from client_app.node import client_data, run_config
from datasets.federated import ClientData
from models import Backbone, build_model
from strategies.shared.run_config import RunConfig
from strategies.shared.messages import CLIENT, ClientAddress


@dataclass(frozen=True)
class ClientRuntime:
    cfg: RunConfig
    client_id: int
    data: ClientData
    device: torch.device

    @property
    def on_cuda(self) -> int:
        """1 when this client trains on a CUDA GPU, 0 on the CPU (the `cuda` train metric)."""
        return int(self.device.type == "cuda")

    def model(self, arrays: ArrayRecord) -> Backbone:
        """A backbone on the device holding the weights in `arrays` (built on the meta device and
        given the received tensors, so no random initialisation is computed and thrown away)."""
        with torch.device("meta"):
            model = build_model(self.cfg.model, self.data.input_shape, self.data.num_classes)
        model.load_state_dict(arrays.to_torch_state_dict(), assign=True)
        return model.to(self.device)

    def tensors(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = (self.data.train_x, self.data.train_y) if split == "train" else (
            self.data.test_x, self.data.test_y)
        return x.to(self.device), y.to(self.device)


@lru_cache(maxsize=1)
def in_simulation_actor() -> bool:
    """Whether this process is a Ray actor: a simulated SuperNode's ClientApp worker under `flwr run`
    (Flower's simulation runs every ClientApp in Ray actors, several of which share the machine)."""
    ray = sys.modules.get("ray")  # never imported here: a process without Ray is no actor
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().get_actor_id() is not None


def client_threads(cfg: RunConfig) -> int:
    """Torch intra-op threads for this ClientApp: `client-threads`, or for 0 one thread in a simulated
    SuperNode (Ray gives each actor OMP_NUM_THREADS = its CPUs, 2 by Flower's default, and actors
    share the cores: two threads per small batch made `flwr run`'s local SGD several times slower on
    a busy machine; the in-process harness, the tests and the committed results compute with one
    thread, so this also gives `flwr run` their floating-point sums) and torch's default elsewhere
    (returned as 0: left as it is)."""
    if cfg.client_threads:
        return cfg.client_threads
    return 1 if in_simulation_actor() else 0


def client_runtime(message: Message, context: Context) -> ClientRuntime:
    """Resolve the logical client a message is for, check this node hosts it and load its data."""
    cfg = run_config(context)
    threads = client_threads(cfg)
    if threads and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    address = ClientAddress.read(message.content[CLIENT])
    return ClientRuntime(cfg, address.client_id, client_data(cfg, context, address),
                         resolve_device(cfg.device))


def model_record(model: torch.nn.Module) -> ArrayRecord:
    """The model's full state (CPU tensors) as an ArrayRecord for a reply."""
    return ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
