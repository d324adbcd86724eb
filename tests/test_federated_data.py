"""Tests for datasets.federated: per-client tensors, caching, domain rotations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from datasets.domains import rotate
from datasets.federated import DataSpec, dataset_info, load_client_data, load_partition
from datasets.partition import PartitionSpec
from datasets.sources import SOURCE_NAMES, load_source

SYNTHETIC = DataSpec("synthetic", None, PartitionSpec("iid", 5, test_fraction=0.2), num_samples=1000)
DOMAINS = DataSpec("synthetic", None, PartitionSpec("domains", 4, seed=2), num_samples=400)


def test_client_data_sizes_and_types() -> None:
    source, partition = load_partition(SYNTHETIC)
    for client_id in range(5):
        data = load_client_data(SYNTHETIC, client_id)
        assert data.client_id == client_id
        assert data.train_x.shape == (160, 1, 28, 28) and data.test_x.shape == (40, 1, 28, 28)
        assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
        assert data.num_classes == 10 and data.input_shape == (1, 28, 28)
        indices = partition.train_indices[client_id]
        np.testing.assert_array_equal(data.train_y.numpy(), source.labels[indices])
        np.testing.assert_array_equal(data.train_x.numpy(), source.images[indices])


def test_cached_per_process() -> None:
    assert load_partition(SYNTHETIC) is load_partition(SYNTHETIC)
    assert load_client_data(SYNTHETIC, 1) is load_client_data(SYNTHETIC, 1)
    equal_spec = DataSpec("synthetic", None, PartitionSpec("iid", 5, test_fraction=0.2), num_samples=1000)
    assert load_client_data(equal_spec, 1) is load_client_data(SYNTHETIC, 1)  # specs compare by value
    assert load_partition(SYNTHETIC)[0] is load_source("synthetic", num_samples=1000)


def test_client_id_out_of_range() -> None:
    for bad in (-1, 5):
        with pytest.raises(IndexError, match=f"client_id {bad}.*5 clients"):
            load_client_data(SYNTHETIC, bad)


def test_domains_rotate_by_client_angle() -> None:
    source, partition = load_partition(DOMAINS)
    np.testing.assert_array_equal(partition.rotations, [0.0, 90.0, 180.0, 270.0])
    for client_id, turns in enumerate(range(4)):
        data = load_client_data(DOMAINS, client_id)
        original = torch.from_numpy(source.images[partition.train_indices[client_id]])
        torch.testing.assert_close(data.train_x, torch.rot90(original, k=turns, dims=(2, 3)), rtol=0, atol=0)
        test_original = torch.from_numpy(source.images[partition.test_indices[client_id]])
        torch.testing.assert_close(data.test_x, torch.rot90(test_original, k=turns, dims=(2, 3)), rtol=0, atol=0)


def test_rotate_arbitrary_angle() -> None:
    images = torch.zeros(2, 1, 9, 9)
    images[:, :, 4, 4:] = 1.0  # a ray pointing right from the centre
    turned = rotate(images, 45.0)
    assert turned.shape == images.shape
    assert turned[0, 0, 1, 7] > 0.5 and turned[0, 0, 7, 7] < 0.1  # now points up-right
    torch.testing.assert_close(rotate(images, 360.0), images)
    torch.testing.assert_close(rotate(images, -90.0), torch.rot90(images, k=3, dims=(2, 3)))


def test_dataset_info_matches_sources() -> None:
    for name in ("synthetic", "digits"):
        source = load_source(name)
        assert dataset_info(name, None) == (source.images.shape[1:], source.num_classes)
    assert dataset_info("cifar10", "/nonexistent") == ((3, 32, 32), 10)
    assert dataset_info("emnist", None)[1] == 47 and dataset_info("femnist", None)[1] == 62
    assert dataset_info("celeba", None) == ((3, 84, 84), 2)
    assert dataset_info("shakespeare", None)[1] == 80  # next character of 80
    assert {name for name in SOURCE_NAMES if dataset_info(name, None)[0] == (1, 28, 28)} == set(SOURCE_NAMES) - {
        "cifar10", "celeba", "shakespeare",
        "metr-la", "pems-bay", "traffic-synthetic"  # traffic: (12, 2) windows, tests/test_traffic.py
    }
    with pytest.raises(ValueError, match="'svhn'"):
        dataset_info("svhn", None)


def test_natural_partition_of_leaf_writers(tmp_path: Path) -> None:
    users = {"w0": 4, "w1": 6, "w2": 5}
    shard = {
        "users": list(users),
        "num_samples": list(users.values()),
        "user_data": {u: {"x": [[0.5] * 784] * n, "y": [i] * n} for i, (u, n) in enumerate(users.items())},
    }
    for split in ("train", "test"):
        folder = tmp_path / "femnist" / "data" / split
        folder.mkdir(parents=True)
        (folder / "part.json").write_text(json.dumps(shard))
    spec = DataSpec("femnist", str(tmp_path), PartitionSpec("natural", 3, test_fraction=0.25))
    sizes = {}
    for client_id in range(3):
        data = load_client_data(spec, client_id)
        assert data.num_classes == 62 and data.input_shape == (1, 28, 28)
        writer_labels = torch.cat([data.train_y, data.test_y]).unique()
        assert len(writer_labels) == 1  # label i was written by writer i only
        sizes[int(writer_labels)] = len(data.train_y) + len(data.test_y)
    assert sizes == {0: 8, 1: 12, 2: 10}  # train and test shards of a writer are pooled


def test_natural_needs_groups() -> None:
    spec = DataSpec("synthetic", None, PartitionSpec("natural", 2), num_samples=100)
    with pytest.raises(ValueError, match="natural.*femnist"):
        load_partition(spec)
