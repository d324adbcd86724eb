"""Traffic speed forecasting data: METR-LA / PEMS-BAY in the DCRNN layout, and a synthetic road network.

One client per sensor (partition scheme ``sensors``): client i is sensor i (column i of the speed table, in
the order of the adjacency pickle). Each sensor's series is cut chronologically into 70% train, 10%
validation (held out and unused by the federation; it only separates train from test in time) and 20%
test; windows of ``INPUT_STEPS`` = 12 readings (1 hour at 5 minutes) predict the next ``HORIZON`` = 12
readings, built inside each part, so no train window touches a test time step.

Inputs have ``NUM_FEATURES`` = 2 features per step, as in DCRNN/Graph WaveNet's ``add_time_in_day``:
the z-scored speed and the time of day in [0, 1). The z-score uses the mean and standard deviation of
the sensor's *training* readings (missing readings, stored as 0 in METR-LA, excluded). A missing input
reading becomes 0 after scaling (the training mean); a missing *target* becomes NaN, which the masked
loss and metrics skip (Graph WaveNet's masked MAE with null value 0).

Real data (``data-root``): ``metr-la.h5`` / ``pems-bay.h5`` — a pandas HDF5 frame (fixed format, key
``df``; rows 5-minute timestamps, columns sensor ids), read with h5py — and ``adj_mx.pkl`` /
``adj_mx_bay.pkl`` — a pickle of ``(sensor_ids, sensor_id_to_ind, adj_mx)`` (latin1), the
Gaussian-kernel road graph. Both come from the DCRNN repository (https://github.com/liyaguang/DCRNN).
"""

from __future__ import annotations

import functools
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datasets.sources import SOURCE_INFO, DataNotFoundError

INPUT_STEPS = 12  # readings per input window (60 minutes)
HORIZON = 12  # readings predicted per window (5 .. 60 minutes ahead)
NUM_FEATURES = 2  # z-scored speed, time of day
STEPS_PER_DAY = 288  # 5-minute readings
SPLIT = (0.7, 0.1, 0.2)  # chronological train / validation / test shares of the time axis
SYNTHETIC_DAYS = 14  # default length of "traffic-synthetic"
SYNTHETIC_SEED = 0  # the synthetic road network is a fixed data set, like the image "synthetic" source
KERNEL_THRESHOLD = 0.1  # DCRNN's normalized_k: kernel weights below it are dropped

TRAFFIC_DATASETS: tuple[str, ...] = ("metr-la", "pems-bay", "traffic-synthetic")


@dataclass(frozen=True)
class _RealLayout:
    """File names of a real traffic data set under ``data-root`` (DCRNN's ``data/`` folder)."""

    speeds: str
    adjacency: str
    folders: tuple[str, ...]  # sub-folders also searched, besides the root itself


_LAYOUTS = {
    "metr-la": _RealLayout("metr-la.h5", "adj_mx.pkl", ("METR-LA", "metr-la", "sensor_graph")),
    "pems-bay": _RealLayout("pems-bay.h5", "adj_mx_bay.pkl", ("PEMS-BAY", "pems-bay", "sensor_graph")),
}
_HOW_TO_GET = (
    "download metr-la.h5 / pems-bay.h5 (linked from the DCRNN README, https://github.com/liyaguang/DCRNN: "
    "Google Drive or Baidu Yun) and adj_mx.pkl / adj_mx_bay.pkl (DCRNN's data/sensor_graph/) into data-root"
)


@dataclass(frozen=True, eq=False)
class TrafficSource:
    """Speeds of K sensors over T 5-minute steps plus their road graph (arrays read-only, cached)."""

    name: str
    speeds: np.ndarray  # float32 [T, K]; 0 = missing reading
    time_of_day: np.ndarray  # float32 [T], fraction of the day in [0, 1)
    sensor_ids: tuple[str, ...]  # K
    adjacency: np.ndarray  # float32 [K, K] Gaussian-kernel weights, diagonal 1

    @property
    def num_steps(self) -> int:
        return int(self.speeds.shape[0])

    @property
    def num_sensors(self) -> int:
        return int(self.speeds.shape[1])


@dataclass(frozen=True, eq=False)
class SensorSplit:
    """One sensor's windows: x float32 [n, 12, 2], y float32 [n, 12] (z-scored, NaN = missing)."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    mean: float  # z-score statistics of the training readings
    std: float
    train_steps: tuple[int, int]  # [first, last) time steps the train windows cover (inputs and targets)
    test_steps: tuple[int, int]


def is_traffic(dataset: str) -> bool:
    """True for the traffic (regression) data sets."""
    return dataset in TRAFFIC_DATASETS


def _check_name(dataset: str) -> None:
    if dataset not in TRAFFIC_DATASETS:
        raise ValueError(f"unknown traffic data set {dataset!r}; allowed names: {', '.join(TRAFFIC_DATASETS)}")
    if SOURCE_INFO[dataset] != ((INPUT_STEPS, NUM_FEATURES), HORIZON):  # one description of the shapes
        raise AssertionError(f"SOURCE_INFO[{dataset!r}] disagrees with datasets.traffic")


# --- loading --------------------------------------------------------------------------------


def load_traffic(dataset: str, data_root: str | None, num_sensors: int, days: int = 0) -> TrafficSource:
    """The first ``num_sensors`` sensors of ``dataset`` (cached per process).

    ``days`` > 0 keeps the first ``days`` days (real data) or sets the generated length (synthetic,
    default ``SYNTHETIC_DAYS``); 0 = the whole data set.
    """
    _check_name(dataset)
    if num_sensors < 1:
        raise ValueError(f"invalid num_clients={num_sensors}: one client per sensor needs at least 1")
    if days < 0:
        raise ValueError(f"invalid traffic_days={days}: must be 0 (whole data set) or a positive number of days")
    root = str(Path(data_root).expanduser().resolve()) if data_root else None
    return _load_cached(dataset, root, int(num_sensors), int(days))


@functools.lru_cache(maxsize=None)
def _load_cached(dataset: str, root: str | None, num_sensors: int, days: int) -> TrafficSource:
    if dataset == "traffic-synthetic":
        return synthetic_traffic(num_sensors, (days or SYNTHETIC_DAYS) * STEPS_PER_DAY, seed=SYNTHETIC_SEED)
    full = _read_real(dataset, root)
    if num_sensors > full.num_sensors:
        raise ValueError(
            f"invalid num_clients={num_sensors}: {dataset} has {full.num_sensors} sensors "
            f"(one client per sensor; allowed 1..{full.num_sensors})"
        )
    steps = full.num_steps if days == 0 else min(full.num_steps, days * STEPS_PER_DAY)
    return _freeze(
        dataset,
        full.speeds[:steps, :num_sensors],
        full.time_of_day[:steps],
        full.sensor_ids[:num_sensors],
        full.adjacency[:num_sensors, :num_sensors],
    )


def _freeze(
    name: str, speeds: np.ndarray, tod: np.ndarray, ids: tuple[str, ...], adj: np.ndarray
) -> TrafficSource:
    arrays = [np.ascontiguousarray(a, dtype=np.float32) for a in (speeds, tod, adj)]
    for array in arrays:
        array.setflags(write=False)
    return TrafficSource(name, arrays[0], arrays[1], tuple(ids), arrays[2])


def road_graph(dataset: str, data_root: str | None, num_clients: int, days: int = 0) -> np.ndarray:
    """float32 [K, K]: the Gaussian-kernel road graph of the K client sensors, self-loops (diagonal 1).

    The prior graph of SFL on traffic (docs/datasets.md): a server artifact, never computed from client
    data at run time. Real data sets read only their adjacency pickle.
    """
    _check_name(dataset)
    if dataset == "traffic-synthetic":
        adj = load_traffic(dataset, data_root, num_clients, days).adjacency
    else:
        root = str(Path(data_root).expanduser().resolve()) if data_root else None
        ids, adj = _read_adjacency(_find_files(dataset, root)[1])
        if num_clients > len(ids):
            raise ValueError(
                f"invalid num_clients={num_clients}: {dataset} has {len(ids)} sensors (allowed 1..{len(ids)})"
            )
        adj = adj[:num_clients, :num_clients]
    graph = np.array(adj, dtype=np.float32)
    np.fill_diagonal(graph, 1.0)
    return graph


def _find_files(dataset: str, root: str | None) -> tuple[Path, Path]:
    """(speeds .h5, adjacency .pkl) under ``root`` or one of its usual sub-folders; else DataNotFoundError."""
    layout = _LAYOUTS[dataset]
    if root is None:
        raise DataNotFoundError(
            f"data set {dataset!r} needs data-root holding {layout.speeds} and {layout.adjacency}; none was given. "
            + _HOW_TO_GET
        )
    folders = [Path(root)] + [Path(root) / sub for sub in layout.folders]
    found = []
    for name in (layout.speeds, layout.adjacency):
        match = next((folder / name for folder in folders if (folder / name).is_file()), None)
        found.append(match)
    if None in found:
        missing = [name for name, path in zip((layout.speeds, layout.adjacency), found) if path is None]
        searched = ", ".join(str(folder) for folder in folders)
        raise DataNotFoundError(
            f"{dataset}: missing {', '.join(missing)} (expected {layout.speeds} and {layout.adjacency} in one of: "
            f"{searched}). To get them, {_HOW_TO_GET}"
        )
    return found[0], found[1]


@functools.lru_cache(maxsize=None)
def _read_real(dataset: str, root: str | None) -> TrafficSource:
    """Whole real data set, columns reordered to the adjacency pickle's sensor order."""
    speeds_path, adjacency_path = _find_files(dataset, root)
    values, columns, timestamps = read_pandas_h5(speeds_path)
    ids, adj = _read_adjacency(adjacency_path)
    position = {sensor: j for j, sensor in enumerate(columns)}
    missing = [sensor for sensor in ids if sensor not in position]
    if missing:
        raise ValueError(
            f"{adjacency_path} lists sensors absent from {speeds_path}: {missing[:5]} "
            f"({len(missing)} in all); the two files must come from the same data set"
        )
    speeds = values[:, [position[sensor] for sensor in ids]]
    return _freeze(dataset, np.nan_to_num(speeds, nan=0.0), time_of_day(timestamps, len(values)), ids, adj)


def time_of_day(timestamps: np.ndarray | None, num_steps: int) -> np.ndarray:
    """Fraction of the day of each step: from int64 nanosecond timestamps, else from 5-minute positions."""
    if timestamps is None:
        return (np.arange(num_steps) % STEPS_PER_DAY / STEPS_PER_DAY).astype(np.float32)
    seconds = np.asarray(timestamps, dtype=np.int64) // 1_000_000_000
    return ((seconds % 86_400) / 86_400.0).astype(np.float32)


def read_pandas_h5(path: str | Path, key: str | None = None) -> tuple[np.ndarray, list[str], np.ndarray | None]:
    """Read a pandas HDF5 DataFrame in *fixed* format (``df.to_hdf(path, key='df')``) without pandas.

    Returns (values float64 [rows, columns], column names as str, row index as int64 nanoseconds if the
    index is a DatetimeIndex else None). Layout: group ``key`` with ``axis0`` (columns), ``axis1``
    (index), ``block<i>_items`` and ``block<i>_values`` ([rows, items], stored transposed by pandas).
    """
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a declared dependency
        raise ImportError(
            f"reading {path} needs h5py (a dependency of Bouquet): pip install h5py"
        ) from None
    with h5py.File(path, "r") as handle:
        groups = [name for name in handle if isinstance(handle[name], h5py.Group)]
        name = key or ("df" if "df" in groups else (groups[0] if len(groups) == 1 else None))
        if name is None or name not in handle:
            raise ValueError(f"{path}: cannot tell which frame to read; groups {groups}, pass key=")
        group = handle[name]
        if "axis0" not in group or "block0_values" not in group:
            raise ValueError(
                f"{path}[{name!r}] is not a pandas fixed-format frame (no axis0/block0_values; "
                "table format is not supported): re-save it with df.to_hdf(path, key='df')"
            )
        columns = _names(group["axis0"][()])
        index = group["axis1"]
        raw_index = np.asarray(index[()])
        is_time = (_attr(index, "kind") in ("datetime64", "datetime")
                   or np.issubdtype(raw_index.dtype, np.datetime64))
        timestamps = raw_index.astype("datetime64[ns]").astype(np.int64) if is_time else None
        blocks, items = [], []
        for b in range(int(_attr(group, "nblocks") or 1)):
            values = np.asarray(group[f"block{b}_values"][()], dtype=np.float64)
            block_items = _names(group[f"block{b}_items"][()])
            shape = (len(raw_index), len(block_items))
            if values.shape != shape and values.T.shape == shape:  # pandas stores blocks transposed
                values = values.T
            blocks.append(values)
            items += block_items
    table = np.concatenate(blocks, axis=1)
    where = {item: j for j, item in enumerate(items)}
    return table[:, [where[c] for c in columns]], columns, timestamps


def _attr(node: object, name: str) -> object:
    value = node.attrs.get(name)  # type: ignore[attr-defined]
    return value.decode() if isinstance(value, bytes) else value


def _names(values: np.ndarray) -> list[str]:
    """Column names as str (bytes decoded, integers printed), as the adjacency pickle spells them."""
    return [v.decode() if isinstance(v, bytes) else str(v) for v in np.asarray(values).tolist()]


def _read_adjacency(path: Path) -> tuple[tuple[str, ...], np.ndarray]:
    """DCRNN's ``(sensor_ids, sensor_id_to_ind, adj_mx)`` pickle (latin1 for Python-2 pickles)."""
    with open(path, "rb") as handle:
        try:
            content = pickle.load(handle)
        except UnicodeDecodeError:
            handle.seek(0)
            content = pickle.load(handle, encoding="latin1")
    try:
        sensor_ids, _, adj = content
    except (TypeError, ValueError):
        raise ValueError(f"{path}: expected a pickle of (sensor_ids, sensor_id_to_ind, adj_mx)") from None
    ids = tuple(_names(np.asarray(sensor_ids)))
    adj = np.asarray(adj, dtype=np.float32)
    if adj.shape != (len(ids), len(ids)):
        raise ValueError(f"{path}: adj_mx has shape {adj.shape}, expected ({len(ids)}, {len(ids)})")
    return ids, adj


# --- synthetic road network -----------------------------------------------------------------


def gaussian_kernel(distances: np.ndarray, sigma: float, threshold: float = KERNEL_THRESHOLD) -> np.ndarray:
    """DCRNN's road-graph weights: exp(−(d/σ)²), weights below ``threshold`` (and infinite d) set to 0."""
    weights = np.exp(-np.square(distances / sigma))
    weights[~np.isfinite(distances)] = 0.0
    weights[weights < threshold] = 0.0
    return weights


def synthetic_traffic(num_sensors: int, num_steps: int, seed: int = SYNTHETIC_SEED) -> TrafficSource:
    """A random geometric road network whose speeds follow a graph diffusion with daily rush hours.

    Sensors lie at uniform points of the unit square; pairs closer than r = sqrt(8 / (π K)) are linked
    with Gaussian-kernel weights (σ chosen so the weight reaches DCRNN's 0.1 threshold at r). A latent
    congestion c ∈ R^K diffuses over the row-normalised graph P:
    ``c[t+1] = φ·P c[t] + (1 − φ)·s[t+1] + σ_c·ε[t]`` (φ = 0.85, σ_c = 0.02), where the daily forcing
    ``s`` has a morning and an evening rush hour whose times and strengths vary smoothly in space (so
    regions differ and neighbours agree); speed = free-flow speed·(1 − clip(c, 0, 0.85)) + noise (1 mph).
    Deterministic given (num_sensors, num_steps, seed).
    """
    if num_sensors < 1 or num_steps < 1:
        raise ValueError(
            f"synthetic traffic needs num_sensors >= 1 and num_steps >= 1, got {num_sensors}, {num_steps}"
        )
    rng = np.random.default_rng(seed)
    k = num_sensors
    points = rng.uniform(0.0, 1.0, size=(k, 2))
    radius = float(np.sqrt(8.0 / (np.pi * k)))
    distances = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    distances[distances > radius] = np.inf
    adjacency = gaussian_kernel(distances, sigma=radius / np.sqrt(np.log(1.0 / KERNEL_THRESHOLD)))
    np.fill_diagonal(adjacency, 1.0)
    transition = adjacency / adjacency.sum(axis=1, keepdims=True)

    phase = rng.uniform(0.0, 2 * np.pi, size=2)
    x, y = points[:, 0], points[:, 1]
    morning_hour = 6.5 + 2.5 * x  # rush hours move across the city
    evening_hour = 16.0 + 2.5 * y
    morning_peak = 0.25 + 0.3 * (0.5 + 0.5 * np.sin(2 * np.pi * (x + 0.5 * y) + phase[0]))
    evening_peak = 0.25 + 0.3 * (0.5 + 0.5 * np.sin(2 * np.pi * (y - 0.5 * x) + phase[1]))
    free_flow = rng.uniform(50.0, 70.0, size=k)

    tod = time_of_day(None, num_steps)
    hours = 24.0 * tod.astype(np.float64)[:, None]
    forcing = (morning_peak * np.exp(-0.5 * ((hours - morning_hour) / 0.9) ** 2)
               + evening_peak * np.exp(-0.5 * ((hours - evening_hour) / 1.1) ** 2))  # [T, K]
    phi, sigma_c = 0.85, 0.02
    shocks = rng.normal(0.0, sigma_c, size=(num_steps, k))
    congestion = np.empty((num_steps, k))
    state = forcing[0].copy()
    for t in range(num_steps):  # one K-vector step per time step (the recursion is sequential in t)
        state = phi * (transition @ state) + (1.0 - phi) * forcing[t] + shocks[t]
        congestion[t] = state
    speeds = free_flow * (1.0 - np.clip(congestion, 0.0, 0.85)) + rng.normal(0.0, 1.0, size=(num_steps, k))
    speeds = np.maximum(speeds, 1.0)  # a reading of 0 means "missing"; keep generated speeds positive
    ids = tuple(f"s{i:04d}" for i in range(k))
    return _freeze("traffic-synthetic", speeds, tod, ids, adjacency)


# --- per-sensor windows ---------------------------------------------------------------------


def split_bounds(num_steps: int) -> tuple[int, int]:
    """(end of train, end of validation) on the time axis: the first 70% train, next 10% validation."""
    train_end = int(round(SPLIT[0] * num_steps))
    val_end = int(round((SPLIT[0] + SPLIT[1]) * num_steps))
    return train_end, val_end


def windows(
    values: np.ndarray, steps_in: int = INPUT_STEPS, horizon: int = HORIZON
) -> tuple[np.ndarray, np.ndarray]:
    """All (input, target) windows of a [L, ...] array: x [L−in−h+1, in, ...], y [L−in−h+1, h, ...]."""
    count = len(values) - steps_in - horizon + 1
    if count < 1:
        raise ValueError(
            f"a series part of {len(values)} steps is too short for {steps_in}-step inputs and {horizon}-step "
            f"targets (needs >= {steps_in + horizon}); use more traffic-days"
        )
    view = np.lib.stride_tricks.sliding_window_view(values, steps_in + horizon, axis=0)[:count]
    view = np.moveaxis(view, -1, 1)  # [count, in + h, ...]
    return view[:, :steps_in], view[:, steps_in:]


def sensor_split(source: TrafficSource, sensor: int) -> SensorSplit:
    """Chronological train/test windows of one sensor, z-scored with its training statistics."""
    if not 0 <= sensor < source.num_sensors:
        raise IndexError(
            f"client_id {sensor} out of range: {source.name} here has {source.num_sensors} sensors "
            f"(valid ids 0..{source.num_sensors - 1})"
        )
    series = source.speeds[:, sensor].astype(np.float64)
    train_end, val_end = split_bounds(len(series))
    observed = series[:train_end][series[:train_end] > 0]
    mean = float(observed.mean()) if observed.size else 0.0
    std = float(observed.std()) if observed.size > 1 else 1.0
    std = std if std > 1e-6 else 1.0
    scaled = np.where(series > 0, (series - mean) / std, np.nan)
    features = np.stack([np.nan_to_num(scaled, nan=0.0), source.time_of_day], axis=-1)  # [T, 2]
    parts = {}
    for part, (start, end) in {"train": (0, train_end), "test": (val_end, len(series))}.items():
        x, _ = windows(features[start:end])
        _, y = windows(scaled[start:end])
        parts[part] = (np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.float32))
    return SensorSplit(
        train_x=parts["train"][0], train_y=parts["train"][1],
        test_x=parts["test"][0], test_y=parts["test"][1],
        mean=mean, std=std,
        train_steps=(0, train_end), test_steps=(val_end, len(series)),
    )
