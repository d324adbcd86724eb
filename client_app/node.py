"""What this SuperNode hosts, as a client handler asks it: the run's validated config, the node's
data folder and the clients found in it, its partition slot, its data spec, and the data of one
client (`client_data`: from the node's own folder by the client's name, else its share of the run's
data set by its partition slot). Every NodeConfigError names the node_config key to fix."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from flwr.app import Context

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
from strategies.shared.messages import ClientAddress
from strategies.shared.run_config import RunConfig


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


def node_data_spec(cfg: RunConfig, context: Context) -> DataSpec:
    """The run's data spec, with the SuperNode's own `data-root` (node_config) when it was started
    with one: a deployed client reads its data where that machine keeps it."""
    root = context.node_config.get("data-root")
    if root in (None, ""):
        return cfg.data_spec
    if not isinstance(root, str):
        raise NodeConfigError(f'node_config data-root={root!r} must be a quoted path: data-root="/data"')
    return replace(cfg.data_spec, data_root=root)


def client_data(cfg: RunConfig, context: Context, address: ClientAddress) -> ClientData:
    """The data of the client `address` names, which this node must host: from the node's own data
    folder by the client's name, else the client's share of the run's data set."""
    client = address.client_id
    if data_dir(context) is not None:  # the node's own data: the client is found by its name
        hosted = {c.name: c for c in local_clients(context)}
        if address.client_name not in hosted:
            raise NodeConfigError(
                f"node {context.node_id}: client {address.client_name!r} (index {client}) is not in "
                f"its data-dir {data_dir(context)!r}; it hosts {sorted(hosted)}")
        try:
            return _local_data(hosted[address.client_name], Expected.of(cfg), client)
        except LocalDataError as err:
            raise LocalDataError(f"node {context.node_id}: {err}") from None
    partition_id, num_partitions = partition_slot(context)
    if client >= cfg.num_clients or client % num_partitions != partition_id:
        raise NodeConfigError(
            f"client {client} is not hosted by partition {partition_id}/{num_partitions}"
        )
    return load_client_data(node_data_spec(cfg, context), client)
