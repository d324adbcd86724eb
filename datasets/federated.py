"""Per-client tensors for the simulation: source + partition -> ClientData, cached per process.

Server and clients only exchange a ``DataSpec``; each process rebuilds the same
partition deterministically and materialises just the clients it runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from datasets import traffic
from datasets.domains import apply_domains
from datasets.partition import Partition, PartitionSpec, make_partition
from datasets.sources import SOURCE_INFO, SOURCE_NAMES, DataSource, dataset_task, load_source


@dataclass(frozen=True)
class DataSpec:
    """Which data set, where its files are, and how it is split; hashable (cache key)."""

    dataset: str
    data_root: str | None
    partition: PartitionSpec
    num_samples: int = 6000  # size of the "synthetic" source; ignored by the others
    traffic_days: int = 0  # traffic: days of the series (0 = whole data set; synthetic default 14)


@dataclass(frozen=True, eq=False)
class ClientData:
    """One client's local train/test tensors: classification = float32 images [n, C, H, W] and int64
    labels; regression (traffic) = float32 windows [n, 12, F] and z-scored float32 targets [n, 12]
    (NaN = missing), de-normalised as ``y * target_std + target_mean``."""

    client_id: int
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int  # classes, or outputs per sample (the forecast horizon) for regression
    input_shape: tuple[int, ...]
    task: str = "classification"  # or "regression" (datasets.sources.TASKS)
    target_mean: float = 0.0  # regression: the z-score of the targets (training statistics)
    target_std: float = 1.0
    # "domains" partition: each image's true domain id (ground truth for reporting, and FedCG's
    # oracle control), int64 [n]; None for other partitions
    train_domains: torch.Tensor | None = None
    test_domains: torch.Tensor | None = None

    @property
    def target_scale(self) -> tuple[float, float] | None:
        """(mean, std) that turns regression outputs back into data units; None for classification."""
        return (self.target_mean, self.target_std) if self.task == "regression" else None


@functools.lru_cache(maxsize=None)
def load_partition(spec: DataSpec) -> tuple[DataSource | traffic.TrafficSource, Partition]:
    """Load the source and split it as ``spec.partition`` says; cached per process.

    Traffic data sets: one client per sensor; the Partition's indices are the time steps of each
    client's train/test targets (first step of each window) and its ``label_graph`` is the binary road
    graph (sensors linked in the Gaussian-kernel adjacency), for reporting only.
    """
    if traffic.is_traffic(spec.dataset):
        return _traffic_partition(spec)
    source = load_source(spec.dataset, spec.data_root, num_samples=spec.num_samples)
    return source, make_partition(source.labels, spec.partition, groups=source.groups,
                                  train_count=source.train_count)


def _traffic_source(spec: DataSpec) -> traffic.TrafficSource:
    if spec.partition.scheme != "sensors":
        raise ValueError(
            f"invalid partition scheme {spec.partition.scheme!r} for traffic data set {spec.dataset!r}: "
            "traffic is split one client per sensor, use 'sensors'"
        )
    return traffic.load_traffic(spec.dataset, spec.data_root, spec.partition.num_clients, spec.traffic_days)


def _traffic_partition(spec: DataSpec) -> tuple[traffic.TrafficSource, Partition]:
    source = _traffic_source(spec)
    train_end, val_end = traffic.split_bounds(source.num_steps)
    train = np.arange(traffic.INPUT_STEPS, train_end - traffic.HORIZON + 1, dtype=np.int64)
    test = np.arange(val_end + traffic.INPUT_STEPS, source.num_steps - traffic.HORIZON + 1, dtype=np.int64)
    k = source.num_sensors
    return source, Partition(
        train_indices=(train,) * k,
        test_indices=(test,) * k,
        cluster_ids=None,
        label_graph=(source.adjacency > 0).astype(np.float32),
        rotations=None,
    )


def _traffic_client_data(spec: DataSpec, client_id: int) -> ClientData:
    """Client ``client_id`` = sensor ``client_id``: z-scored 12-step windows (datasets.traffic)."""
    split = traffic.sensor_split(_traffic_source(spec), client_id)
    input_shape, horizon = SOURCE_INFO[spec.dataset]
    return ClientData(
        client_id=client_id,
        train_x=torch.from_numpy(split.train_x),
        train_y=torch.from_numpy(split.train_y),
        test_x=torch.from_numpy(split.test_x),
        test_y=torch.from_numpy(split.test_y),
        num_classes=horizon,
        input_shape=input_shape,
        task=dataset_task(spec.dataset),
        target_mean=split.mean,
        target_std=split.std,
    )


@functools.lru_cache(maxsize=None)
def load_client_data(spec: DataSpec, client_id: int) -> ClientData:
    """Tensors of client ``client_id``; under the "domains" scheme every image is shown in its true
    domain (rotated, or restyled; ``datasets.domains``); cached."""
    if traffic.is_traffic(spec.dataset):
        return _traffic_client_data(spec, client_id)
    source, partition = load_partition(spec)
    if not 0 <= client_id < partition.num_clients:
        raise IndexError(
            f"client_id {client_id} out of range: the partition has {partition.num_clients} clients "
            f"(valid ids 0..{partition.num_clients - 1})"
        )
    train, test = partition.train_indices[client_id], partition.test_indices[client_id]
    train_x, test_x = _images(source, train), _images(source, test)
    domains: dict[str, torch.Tensor] = {}
    if partition.train_domains is not None:
        train_d = torch.from_numpy(partition.train_domains[client_id].copy())
        test_d = torch.from_numpy(partition.test_domains[client_id].copy())
        family, names = spec.partition.family, partition.domain_names
        seed = spec.partition.seed * 1_000_003 + 2 * client_id  # the noise of this client's images
        train_x = apply_domains(train_x, train_d, family, names, seed)
        test_x = apply_domains(test_x, test_d, family, names, seed + 1)
        domains = dict(train_domains=train_d, test_domains=test_d)
    return ClientData(
        client_id=client_id,
        train_x=train_x,
        train_y=torch.from_numpy(source.labels[train].copy()),
        test_x=test_x,
        test_y=torch.from_numpy(source.labels[test].copy()),
        num_classes=source.num_classes,
        input_shape=tuple(source.images.shape[1:]),  # type: ignore[arg-type]
        **domains,
    )


def dataset_info(dataset: str, data_root: str | None) -> tuple[tuple[int, ...], int]:
    """(input_shape, num_classes) of a source, from its static description (no files are read).

    ``data_root`` is accepted for symmetry with ``DataSpec``; the shapes do not depend on it.
    """
    if dataset not in SOURCE_INFO:
        raise ValueError(f"unknown data source {dataset!r}; allowed names: {', '.join(SOURCE_NAMES)}")
    return SOURCE_INFO[dataset]


def _images(source: DataSource, indices: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(source.images[indices])  # fancy indexing copies: writable, owned


def client_sizes(spec: DataSpec, client_id: int) -> tuple[int, int]:
    """(train, test) sample counts of client ``client_id``, without building its image tensors."""
    if traffic.is_traffic(spec.dataset):
        data = load_client_data(spec, client_id)
        return len(data.train_y), len(data.test_y)
    partition = load_partition(spec)[1]
    return len(partition.train_indices[client_id]), len(partition.test_indices[client_id])
