"""Data a node holds itself: the clients found in a SuperNode's `data-dir` and their tensors.

A SuperNode started with node_config `data-dir="/path"` hosts the clients whose data is in that folder,
read on that machine only (no partition, nothing downloaded):

- the folder is one client when it holds data itself, named by node_config `client-name` or the
  folder's name;
- a folder whose subfolders each hold data hosts one client per subfolder, named by the subfolder;
- a folder of LEAF JSON files hosts one client per LEAF user, named by the user; a folder of traffic
  series (one `.csv` per sensor) one client per sensor, named by the file.

Formats of a client folder (`describe_layouts` lists them for error messages):

- **npz**: `train.npz` and `test.npz`, or one `.npz` split locally; arrays `x` (samples of the run's
  input shape; float, or uint8 scaled by 1/255) and `y` (class indices, or class names), optional
  `domain` and `group` (int per sample, reporting and FedCG's oracle control only); traffic windows:
  `x` [n, 12, 2], `y` [n, 12] float plus scalars `target_mean` and `target_std`;
- **images** (torchvision's ImageFolder): one subfolder per class, named by the class, or `train/` and
  `test/` each with one subfolder per class; read with PIL, converted to the run's channels (1 = gray,
  3 = RGB) and resized to its height and width;
- **LEAF JSON** (`users`, `num_samples`, `user_data`): `*.json` files, or `train/*.json` and
  `test/*.json`; each user's `x` rows are flattened samples of the run's input shape;
- **traffic**: one `<sensor>.csv` per sensor, a `speed` column (and optionally a leading `timestamp`
  column), 5-minute readings, 0 = missing; split in time and windowed as the built-in traffic data
  (`datasets.traffic.sensor_split`). An optional `road-graph.csv` (`from,to,weight` by sensor name)
  is read by `read_road_graph`.

A split that the files do not give is made locally: a seeded permutation of the client's samples (run
seed and client name), `test-fraction` of them for testing. What the model expects (input shape,
classes and their order) is the run's declaration (`Expected`), never the data's: a client with some
classes missing is normal; a label outside the declared classes is an error.

Every problem is a `LocalDataError` whose message names the file, what was found and what is allowed.
"""

from __future__ import annotations

import functools
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datasets.files import EXPORT_FILE, IMAGE_SUFFIXES, LocalDataError, read_image
from datasets.files import files as _files
from datasets.files import leaf_files as _leaf_files
from datasets.files import read_json as _read_json
from datasets.files import visible as _visible


DATA_DIR_KEY = "data-dir"  # node_config: the folder of this node's data
CLIENT_NAME_KEY = "client-name"  # node_config: the name of the client the folder is (one client)
ROAD_GRAPH_FILE = "road-graph.csv"
NPZ_SPLIT_FILES = ("train.npz", "test.npz")


def describe_layouts() -> str:
    return ("allowed: train.npz + test.npz (or one .npz) with arrays x, y [, domain, group]; "
            "one subfolder per class of image files (or train/ and test/ with them); LEAF *.json "
            "(users, num_samples, user_data); one <sensor>.csv per traffic sensor; or one subfolder "
            "per client holding one of these")


@dataclass(frozen=True)
class Expected:
    """What the run's model expects, declared by the run config: input shape, classes (names in the
    run's order) or, for regression, outputs per sample; and how a split is made locally."""

    dataset: str  # the built-in data set whose declaration this is
    input_shape: tuple[int, ...]
    num_classes: int  # classes, or outputs per sample (the horizon) for regression
    class_names: tuple[str, ...]  # classification: names of classes 0..n-1 (their order is the run's)
    task: str  # "classification" or "regression"
    test_fraction: float
    seed: int

    @classmethod
    def of(cls, cfg: Any) -> Expected:
        """The declaration of run config `cfg` (a `RunConfig`): the data set's input shape and class
        count, and `class-names` where given (else classes are named 0..n-1)."""
        from datasets.sources import SOURCE_INFO, dataset_task

        shape, count = SOURCE_INFO[cfg.dataset]
        task = dataset_task(cfg.dataset)
        given = tuple(n.strip() for n in str(getattr(cfg, "class_names", "") or "").split(",")
                      if n.strip())
        names = given or (tuple(str(i) for i in range(count)) if task == "classification" else ())
        return cls(cfg.dataset, tuple(shape), count, names, task, float(cfg.test_fraction),
                   int(cfg.seed))

    def allowed_labels(self) -> str:
        if not self.class_names:
            return f"0..{self.num_classes - 1}"
        names = ", ".join(self.class_names[:12]) + (", ..." if len(self.class_names) > 12 else "")
        return (f"class indices 0..{len(self.class_names) - 1} or the declared class names "
                f"({names})")


@dataclass(frozen=True)
class LocalClient:
    """One client a node found in its data folder: its name, its format and where its data is."""

    name: str
    kind: str  # "npz", "images", "leaf", "traffic" or "empty" (nothing usable: loading fails)
    path: str  # the client's folder (npz, images, empty), LEAF folder, or the sensor's .csv
    user: str = ""  # LEAF: the user id inside the folder's JSON files


# --- discovery -------------------------------------------------------------------------------------

def _has_images(folder: Path) -> bool:
    return any(p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES for p in _visible(folder))


def _kind(folder: Path) -> str | None:
    """The format of the data directly in `folder`, or None when it holds none itself."""
    if _files(folder, ".npz"):
        return "npz"
    if _files(folder, ".json") or (folder / "train").is_dir() and _files(folder / "train", ".json"):
        return "leaf"
    if [p for p in _files(folder, ".csv") if p.name != ROAD_GRAPH_FILE]:
        return "traffic"
    subfolders = [p for p in _visible(folder) if p.is_dir()]
    if (folder / "train").is_dir() or any(_has_images(sub) for sub in subfolders):
        return "images"
    return None


def _clients_in(folder: Path, name: str, kind: str) -> list[LocalClient]:
    if kind == "leaf":
        users: set[str] = set()
        for path in _leaf_files(folder)[0]:
            users.update(str(u) for u in _read_json(path).get("users", []))
        return [LocalClient(user, "leaf", str(folder), user) for user in sorted(users)]
    if kind == "traffic":
        return [LocalClient(p.stem, "traffic", str(p)) for p in _files(folder, ".csv")
                if p.name != ROAD_GRAPH_FILE]
    return [LocalClient(name, kind, str(folder))]


def discover(data_dir: str, client_name: str | None = None) -> list[LocalClient]:
    """The clients of a node's data folder, sorted by name (see the module docstring). A folder that
    does not exist is a `LocalDataError`; a folder with nothing usable is one client of kind "empty",
    whose loading fails with what is allowed (so the node still identifies itself)."""
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise LocalDataError(f"node_config {DATA_DIR_KEY}={data_dir!r} is not a folder on this "
                             "machine; give the folder that holds this node's data")
    kind = _kind(folder)
    if kind is not None:
        clients = _clients_in(folder, client_name or folder.resolve().name, kind)
    else:
        subfolders = [p for p in _visible(folder) if p.is_dir()]
        clients = []
        for sub in subfolders:
            sub_kind = _kind(sub)
            clients += _clients_in(sub, sub.name, sub_kind) if sub_kind else [
                LocalClient(sub.name, "empty", str(sub))]
        if not clients:
            clients = [LocalClient(client_name or folder.resolve().name, "empty", str(folder))]
    names = [c.name for c in clients]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise LocalDataError(f"{folder}: client name(s) {duplicates} occur more than once; every "
                             "client of a node needs its own name (subfolder, LEAF user or sensor)")
    return sorted(clients, key=lambda c: c.name)


# --- loading ---------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class LocalData:
    """One client's arrays as read (before tensors): the train and test parts and optional fields."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    train_domains: np.ndarray | None = None
    test_domains: np.ndarray | None = None
    train_groups: np.ndarray | None = None
    test_groups: np.ndarray | None = None
    target_mean: float = 0.0
    target_std: float = 1.0


def split_seed(seed: int, name: str) -> np.random.Generator:
    """The generator of a client's local train/test split: run seed and client name."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def local_split(n: int, fraction: float, seed: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices of n samples: `fraction` of them (at least one, and at least one left
    for training when n > 1) for testing, chosen by a seeded permutation; each sorted."""
    order = split_seed(seed, name).permutation(n)
    test = min(max(1, int(round(n * fraction))), max(n - 1, 1)) if n else 0
    return np.sort(order[test:]), np.sort(order[:test])


@functools.lru_cache(maxsize=64)
def load_local(client: LocalClient, expected: Expected) -> LocalData:
    """Read and check one client's data (cached per process)."""
    loaders = {"npz": _load_npz, "images": _load_images, "leaf": _load_leaf, "traffic": _load_traffic}
    if client.kind not in loaders:
        raise LocalDataError(f"{client.path}: no data found for client {client.name!r}; "
                             f"{describe_layouts()}")
    data = loaders[client.kind](client, expected)
    if len(data.train_y) + len(data.test_y) == 0:
        raise LocalDataError(f"{client.path}: client {client.name!r} has no samples; "
                             f"{describe_layouts()}")
    return data


def client_tensors(client: LocalClient, expected: Expected, client_id: int):
    """The client's `datasets.federated.ClientData` under the index the server gave it."""
    from datasets.federated import ClientData

    data = load_local(client, expected)

    def tensor(array: np.ndarray | None) -> torch.Tensor | None:
        return None if array is None else torch.from_numpy(np.array(array, copy=True))

    extra: dict[str, Any] = {}
    if data.train_domains is not None:
        extra = dict(train_domains=tensor(data.train_domains), test_domains=tensor(data.test_domains))
    return ClientData(
        client_id=client_id,
        train_x=tensor(data.train_x), train_y=tensor(data.train_y),
        test_x=tensor(data.test_x), test_y=tensor(data.test_y),
        num_classes=expected.num_classes, input_shape=expected.input_shape, task=expected.task,
        target_mean=data.target_mean, target_std=data.target_std, **extra,
    )


def _samples(x: np.ndarray, expected: Expected, where: str) -> np.ndarray:
    """`x` as float32 samples of the declared input shape (uint8 scaled by 1/255)."""
    shape = expected.input_shape
    if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != shape:
        raise LocalDataError(
            f"{where}: x has shape {list(x.shape)}, but the run declares input shape {list(shape)} "
            f"(dataset '{expected.dataset}'); allowed: x [n, {', '.join(map(str, shape))}]")
    if x.dtype == np.uint8:
        return (x.astype(np.float32) / np.float32(255.0))
    if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.integer):
        raise LocalDataError(f"{where}: x has dtype {x.dtype}; allowed: float or uint8 arrays")
    return np.ascontiguousarray(x, dtype=np.float32)


def _labels(y: np.ndarray, expected: Expected, where: str) -> np.ndarray:
    """Class indices in the run's order; names are looked up in the declared class names."""
    if expected.task == "regression":
        if y.ndim != 2 or y.shape[1] != expected.num_classes:
            raise LocalDataError(f"{where}: y has shape {list(y.shape)}; allowed: traffic targets "
                                 f"y [n, {expected.num_classes}]")
        return np.ascontiguousarray(y, dtype=np.float32)
    if y.ndim != 1:
        raise LocalDataError(f"{where}: y has shape {list(y.shape)}; allowed: one label per sample, "
                             "y [n]")
    if y.dtype.kind in "US":
        index = {name: i for i, name in enumerate(expected.class_names)}
        unknown = sorted({str(v) for v in y.tolist()} - set(index))
        if unknown:
            raise LocalDataError(f"{where}: labels {unknown[:5]} are outside the declared classes; "
                                 f"allowed: {expected.allowed_labels()}")
        return np.array([index[str(v)] for v in y.tolist()], dtype=np.int64)
    if y.dtype.kind == "f" and y.size and not np.all(np.equal(np.mod(y, 1), 0)):
        raise LocalDataError(f"{where}: y holds non-integer values; allowed: "
                             f"{expected.allowed_labels()}")
    labels = np.ascontiguousarray(y, dtype=np.int64)
    limit = len(expected.class_names) or expected.num_classes
    bad = labels[(labels < 0) | (labels >= limit)]
    if bad.size:
        raise LocalDataError(f"{where}: labels {sorted(set(bad.tolist()))[:5]} are outside the "
                             f"declared classes; allowed: {expected.allowed_labels()}")
    return labels


def _per_sample(array: np.ndarray | None, n: int, key: str, where: str) -> np.ndarray | None:
    if array is None:
        return None
    if array.shape != (n,) or array.dtype.kind not in "iu":
        raise LocalDataError(f"{where}: {key} has shape {list(array.shape)} and dtype {array.dtype}; "
                             f"allowed: one integer per sample, {key} [n={n}]")
    return np.ascontiguousarray(array, dtype=np.int64)


def _read_npz(path: Path, expected: Expected) -> dict[str, Any]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except Exception as err:  # noqa: BLE001 - any unreadable archive is the same problem
        raise LocalDataError(f"{path}: not a readable .npz ({err}); {describe_layouts()}") from None
    missing = [key for key in ("x", "y") if key not in arrays]
    if missing:
        raise LocalDataError(f"{path}: arrays {missing} are missing (found {sorted(arrays)}); "
                             "allowed: x, y and optionally domain, group")
    x, y = arrays["x"], arrays["y"]
    if len(x) != len(y):
        raise LocalDataError(f"{path}: x has {len(x)} samples but y {len(y)}; they must match")
    out = {"x": _samples(x, expected, str(path)), "y": _labels(y, expected, str(path))}
    for key in ("domain", "group"):
        out[key] = _per_sample(arrays.get(key), len(y), key, str(path))
    for key in ("target_mean", "target_std"):
        if key in arrays:
            out[key] = float(arrays[key])
    return out


def _load_npz(client: LocalClient, expected: Expected) -> LocalData:
    folder = Path(client.path)
    files = _files(folder, ".npz")
    names = {p.name for p in files}
    if "train.npz" in names or "test.npz" in names:
        if names - set(NPZ_SPLIT_FILES):
            raise LocalDataError(f"{folder}: found {sorted(names)}; allowed: train.npz and test.npz, "
                                 "or a single .npz that is split locally")
        parts = {name.removesuffix(".npz"): _read_npz(folder / name, expected)
                 for name in NPZ_SPLIT_FILES if name in names}
        if "train" not in parts:
            raise LocalDataError(f"{folder}: test.npz without train.npz; allowed: train.npz and "
                                 "test.npz, or a single .npz that is split locally")
        train = parts["train"]
        test = parts.get("test") or _empty_like(train)
    else:
        if len(files) != 1:
            raise LocalDataError(f"{folder}: found {sorted(names)}; allowed: train.npz and test.npz, "
                                 "or a single .npz that is split locally")
        whole = _read_npz(files[0], expected)
        train_i, test_i = local_split(len(whole["y"]), expected.test_fraction, expected.seed,
                                      client.name)
        train, test = _take(whole, train_i), _take(whole, test_i)
    for key in ("domain", "group"):
        if (train[key] is None) != (test[key] is None) and len(test["y"]) and len(train["y"]):
            raise LocalDataError(f"{folder}: '{key}' is in one of train.npz/test.npz only; give it "
                                 "in both or in neither")
    return LocalData(train["x"], train["y"], test["x"], test["y"],
                     train["domain"], test["domain"] if train["domain"] is not None else None,
                     train["group"], test["group"] if train["group"] is not None else None,
                     train.get("target_mean", 0.0), train.get("target_std", 1.0))


def _empty_like(part: dict[str, Any]) -> dict[str, Any]:
    return _take(part, np.zeros(0, dtype=np.int64))


def _take(part: dict[str, Any], index: np.ndarray) -> dict[str, Any]:
    return {key: (value[index] if isinstance(value, np.ndarray) else value)
            for key, value in part.items()}


# --- images (ImageFolder layout) -------------------------------------------------------------------

def _image_part(folder: Path, expected: Expected) -> tuple[np.ndarray, np.ndarray]:
    index = {name: i for i, name in enumerate(expected.class_names)}
    images, labels = [], []
    for sub in (p for p in _visible(folder) if p.is_dir()):
        if sub.name not in index:
            raise LocalDataError(f"{sub}: class folder {sub.name!r} is not a declared class; allowed "
                                 f"folder names: {', '.join(expected.class_names[:20])}"
                                 f"{', ...' if len(expected.class_names) > 20 else ''} (run config "
                                 "class-names)")
        for path in _visible(sub):
            if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
                images.append(read_image(path, expected.input_shape, expected.dataset))
                labels.append(index[sub.name])
    x = (np.stack(images) if images else np.zeros((0, *expected.input_shape), dtype=np.float32))
    return x, np.asarray(labels, dtype=np.int64)


def _load_images(client: LocalClient, expected: Expected) -> LocalData:
    if expected.task != "classification":
        raise LocalDataError(f"{client.path}: image folders are for classification; dataset "
                             f"'{expected.dataset}' is {expected.task}")
    folder = Path(client.path)
    if (folder / "train").is_dir():
        train_x, train_y = _image_part(folder / "train", expected)
        test_x, test_y = (_image_part(folder / "test", expected) if (folder / "test").is_dir()
                          else (train_x[:0], train_y[:0]))
        return LocalData(train_x, train_y, test_x, test_y)
    x, y = _image_part(folder, expected)
    train, test = local_split(len(y), expected.test_fraction, expected.seed, client.name)
    return LocalData(x[train], y[train], x[test], y[test])


# --- LEAF JSON -------------------------------------------------------------------------------------

def _leaf_part(files: list[Path], user: str, expected: Expected) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for path in files:
        data = _read_json(path)
        record = data["user_data"].get(user)
        if record is None:
            continue
        where = f"{path} (user {user})"
        try:
            x = np.asarray(record["x"], dtype=np.float32)
            y = np.asarray(record["y"])
        except (KeyError, ValueError, TypeError) as err:
            raise LocalDataError(f"{where}: user_data needs x (rows of numbers) and y ({err})") from None
        size = int(np.prod(expected.input_shape))
        if x.ndim != 2 or x.shape[1] != size:
            raise LocalDataError(f"{where}: x has shape {list(x.shape)}; allowed: rows of "
                                 f"{size} values (input shape {list(expected.input_shape)})")
        if len(x) != len(y):
            raise LocalDataError(f"{where}: x has {len(x)} rows but y {len(y)}; they must match")
        xs.append(x.reshape(-1, *expected.input_shape))
        ys.append(_labels(y, expected, where))
    if not xs:
        return np.zeros((0, *expected.input_shape), np.float32), np.zeros(0, np.int64)
    return np.concatenate(xs), np.concatenate(ys)


def _load_leaf(client: LocalClient, expected: Expected) -> LocalData:
    train_files, test_files = _leaf_files(Path(client.path))
    x, y = _leaf_part(train_files, client.user, expected)
    if test_files:
        test_x, test_y = _leaf_part(test_files, client.user, expected)
        return LocalData(x, y, test_x, test_y)
    train, test = local_split(len(y), expected.test_fraction, expected.seed, client.name)
    return LocalData(x[train], y[train], x[test], y[test])


# --- traffic series --------------------------------------------------------------------------------

def _read_series(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """(speeds float32 [T], timestamps datetime64 [T] or None) of one sensor's CSV."""
    try:
        rows = [line.strip().split(",") for line in path.read_text().splitlines() if line.strip()]
    except OSError as err:
        raise LocalDataError(f"{path}: not readable ({err})") from None
    if rows and not _is_number(rows[0][-1]):
        rows = rows[1:]  # header
    allowed = "allowed: one reading per line, 'speed' or 'timestamp,speed' (0 = missing)"
    if not rows or any(len(r) != len(rows[0]) or len(r) > 2 or not _is_number(r[-1]) for r in rows):
        raise LocalDataError(f"{path}: not a sensor series; {allowed}")
    speeds = np.array([float(r[-1]) for r in rows], dtype=np.float32)
    stamps = None
    if len(rows[0]) == 2:
        try:
            stamps = np.array([r[0] for r in rows], dtype="datetime64[s]")
        except ValueError:
            raise LocalDataError(f"{path}: timestamps are not ISO dates; {allowed}") from None
    return speeds, stamps


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _load_traffic(client: LocalClient, expected: Expected) -> LocalData:
    from datasets import traffic

    path = Path(client.path)
    if expected.task != "regression":
        raise LocalDataError(f"{path}: a traffic series needs a traffic run (dataset one of "
                             f"{', '.join(traffic.TRAFFIC_DATASETS)}); dataset '{expected.dataset}' "
                             "is classification")
    speeds, stamps = _read_series(path)
    source = traffic.TrafficSource(
        name=client.name, speeds=speeds[:, None],
        time_of_day=traffic.time_of_day(stamps, len(speeds)), sensor_ids=(client.name,),
        adjacency=np.ones((1, 1), dtype=np.float32))
    try:
        split = traffic.sensor_split(source, 0)
    except ValueError as err:
        raise LocalDataError(f"{path}: {err}") from None
    return LocalData(split.train_x, split.train_y, split.test_x, split.test_y,
                     target_mean=split.mean, target_std=split.std)


def read_road_graph(path: str | Path, names: list[str]) -> np.ndarray:
    """A road graph given by sensor name (`from,to,weight` lines, header optional) as a symmetric
    adjacency [K, K] in the order of `names`, diagonal 1; sensors it does not name stay unlinked."""
    index = {name: i for i, name in enumerate(names)}
    graph = np.eye(len(names), dtype=np.float32)
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        parts = [p.strip() for p in line.split(",")]
        if not line.strip() or (number == 1 and not _is_number(parts[-1])):
            continue
        if len(parts) != 3 or not _is_number(parts[2]):
            raise LocalDataError(f"{path}:{number}: {line!r}; allowed: from,to,weight by sensor name")
        a, b, weight = parts[0], parts[1], float(parts[2])
        for sensor in (a, b):
            if sensor not in index:
                raise LocalDataError(f"{path}:{number}: sensor {sensor!r} is not a client of this "
                                     f"run; allowed: {', '.join(names[:10])}")
        graph[index[a], index[b]] = graph[index[b], index[a]] = weight
    return graph
