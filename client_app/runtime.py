"""What a client handler needs for one message: the validated run config, which logical client it is,
its data (loaded once per process), the device, and models built from records."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
from flwr.app import ArrayRecord, Context, Message

from client_app.devices import resolve_device
from datasets.federated import ClientData, DataSpec, load_client_data
from datasets.local import (
    CLIENT_NAME_KEY,
    DATA_DIR_KEY,
    Expected,
    LocalClient,
    LocalDataError,
    client_tensors,
    discover,
)
from models import Backbone, build_model
from strategies.shared.run_config import RunConfig
from strategies.shared.messages import CLIENT, ClientAddress


class NodeConfigError(ValueError):
    """The SuperNode was started without the node_config Bouquet needs."""


@lru_cache(maxsize=8)
def _run_config(items: tuple) -> RunConfig:
    return RunConfig.from_flower(dict(items))


def run_config(context: Context) -> RunConfig:
    """The run's validated config (parsed once per process per distinct config)."""
    return _run_config(tuple(sorted(context.run_config.items())))


def data_dir(context: Context) -> str | None:
    """The node's own data folder (node_config `data-dir`), else the run's (`data-dir` of the run
    config: a simulation over one's own federated data, every simulated SuperNode on one machine),
    or None: the node then rebuilds its clients' share of the run's data set from its partition
    slot."""
    folder = context.node_config.get(DATA_DIR_KEY)
    if folder in (None, ""):
        return run_config(context).data_dir or None
    if not isinstance(folder, str):
        raise NodeConfigError(f'node_config {DATA_DIR_KEY}={folder!r} must be a quoted path: '
                              f'{DATA_DIR_KEY}="/data/site-a"')
    return folder


def local_clients(context: Context) -> list[LocalClient]:
    """The clients found in the node's `data-dir` (`datasets.local.discover`), sorted by name; a
    `NodeConfigError` names the node when the folder is not usable at all. Under the run config's
    `data-dir` (a simulation) a node hosts the clients at its partition slot: those whose position
    in the sorted list is partition-id mod num-partitions."""
    folder = data_dir(context)
    name = context.node_config.get(CLIENT_NAME_KEY)
    if name not in (None, "") and not isinstance(name, str):
        raise NodeConfigError(f'node_config {CLIENT_NAME_KEY}={name!r} must be a quoted name: '
                              f'{CLIENT_NAME_KEY}="site-a"')
    try:
        clients = _discover(folder, name or None)
    except LocalDataError as err:
        raise NodeConfigError(f"node {context.node_id}: {err}") from None
    if context.node_config.get(DATA_DIR_KEY) in (None, ""):  # the run's folder, shared by the nodes
        partition_id, num_partitions = partition_slot(context)
        clients = clients[partition_id::num_partitions]
    return clients


@lru_cache(maxsize=16)
def _discover(folder: str, name: str | None) -> list[LocalClient]:
    return discover(folder, name)


@lru_cache(maxsize=256)
def _local_data(client: LocalClient, expected: Expected, client_id: int) -> ClientData:
    return client_tensors(client, expected, client_id)


def partition_slot(context: Context) -> tuple[int, int]:
    """(partition-id, num-partitions) from node_config, with an actionable error if absent."""
    try:
        partition_id = int(context.node_config["partition-id"])
        num_partitions = int(context.node_config["num-partitions"])
    except (KeyError, TypeError, ValueError):
        raise NodeConfigError(
            "this SuperNode has no valid partition: start it with "
            "--node-config \"partition-id=<i> num-partitions=<n>\""
        ) from None
    if not 0 <= partition_id < num_partitions:
        raise NodeConfigError(
            f"node_config partition-id={partition_id} must be in [0, num-partitions={num_partitions})"
        )
    return partition_id, num_partitions


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


def node_data_spec(cfg: RunConfig, context: Context) -> DataSpec:
    """The run's data spec, with the SuperNode's own `data-root` (node_config) when it was started
    with one: a deployed client reads its data where that machine keeps it."""
    root = context.node_config.get("data-root")
    if root in (None, ""):
        return cfg.data_spec
    if not isinstance(root, str):
        raise NodeConfigError(f'node_config data-root={root!r} must be a quoted path: data-root="/data"')
    return replace(cfg.data_spec, data_root=root)


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
    """Resolve the logical client a message is for and check this node hosts it."""
    cfg = run_config(context)
    threads = client_threads(cfg)
    if threads and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    address = ClientAddress.read(message.content[CLIENT])
    client = address.client_id
    if data_dir(context) is not None:  # the node's own data: the client is found by its name
        hosted = {c.name: c for c in local_clients(context)}
        if address.client_name not in hosted:
            raise NodeConfigError(
                f"node {context.node_id}: client {address.client_name!r} (index {client}) is not in "
                f"its data-dir {data_dir(context)!r}; it hosts {sorted(hosted)}")
        try:
            data = _local_data(hosted[address.client_name], Expected.of(cfg), client)
        except LocalDataError as err:
            raise LocalDataError(f"node {context.node_id}: {err}") from None
        return ClientRuntime(cfg, client, data, resolve_device(cfg.device))
    partition_id, num_partitions = partition_slot(context)
    if client >= cfg.num_clients or client % num_partitions != partition_id:
        raise NodeConfigError(
            f"client {client} is not hosted by partition {partition_id}/{num_partitions}"
        )
    data = load_client_data(node_data_spec(cfg, context), client)
    return ClientRuntime(cfg, client, data, resolve_device(cfg.device))


def model_record(model: torch.nn.Module) -> ArrayRecord:
    """The model's full state (CPU tensors) as an ArrayRecord for a reply."""
    return ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
