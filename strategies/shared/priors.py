"""What the server knows before training: client graphs given to a method (a .npy / .csv file, the
label-sharing graph, a traffic data set's road graph), checked, and the partition's ground truth
(for the label-sharing graph and for reporting how well a learned graph finds the true structure)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import warnings

import numpy as np

if TYPE_CHECKING:
    from datasets.partition import Partition
    from strategies.shared.run_config import RunConfig

ADJACENCY_SUFFIXES: tuple[str, ...] = (".npy", ".csv")


def check_adjacency(matrix: np.ndarray, num_clients: int) -> np.ndarray:
    """A client graph a user supplied, as float32 [N, N]; raises ValueError saying what is wrong:
    not square, wrong size (N = num-clients), not finite, or negative."""
    matrix = np.asarray(matrix)
    allowed = (f"a square [num-clients, num-clients] = [{num_clients}, {num_clients}] matrix of "
               "finite, non-negative weights")
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"adjacency has shape {matrix.shape}; allowed: {allowed}")
    if matrix.shape[0] != num_clients:
        raise ValueError(f"adjacency has shape {matrix.shape} but num-clients = {num_clients}; "
                         f"allowed: {allowed}")
    if not np.issubdtype(matrix.dtype, np.number) or np.issubdtype(matrix.dtype, np.complexfloating):
        raise ValueError(f"adjacency has dtype {matrix.dtype}; allowed: {allowed}")
    matrix = matrix.astype(np.float64)
    bad = ~np.isfinite(matrix)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"adjacency has {int(bad.sum())} non-finite entries (NaN or inf), e.g. "
                         f"[{i}, {j}] = {matrix[i, j]}; allowed: {allowed}")
    if (matrix < 0).any():
        i, j = np.argwhere(matrix < 0)[0]
        raise ValueError(f"adjacency has {int((matrix < 0).sum())} negative entries, e.g. "
                         f"[{i}, {j}] = {matrix[i, j]:g}; allowed: {allowed}")
    return matrix.astype(np.float32)


def read_adjacency(path: str, num_clients: int) -> np.ndarray:
    """Read and check a client graph from `.npy` (a 2-D array) or `.csv` (comma-separated numbers,
    one row per line, no header); errors name the file, what was found and what is allowed."""
    from pathlib import Path

    path = Path(path).expanduser()
    if path.suffix.lower() not in ADJACENCY_SUFFIXES:
        raise ValueError(f"graph file {str(path)!r} has extension {path.suffix or '(none)'!r}; "
                         f"allowed: {', '.join(ADJACENCY_SUFFIXES)}")
    if not path.is_file():
        raise ValueError(f"graph file {str(path)!r} does not exist (resolved: {path.resolve()}); "
                         "give an existing .npy or .csv file")
    try:
        if path.suffix.lower() == ".npy":
            matrix = np.load(path, allow_pickle=False)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an empty file: reported below as shape (0,)
                matrix = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
    except (ValueError, OSError) as err:
        raise ValueError(f"graph file {str(path)!r} could not be read: {err}") from None
    try:
        return check_adjacency(matrix, num_clients)
    except ValueError as err:
        raise ValueError(f"graph file {str(path)!r}: {err}") from None


# --- what the server knows before training: given graphs and the partition's ground truth ---------

def ground_truth(cfg: RunConfig, required: bool = False) -> Partition | None:
    """The partition's ground truth (cached per process by `load_partition`); None when the server
    cannot rebuild it, unless `required`."""
    from datasets.federated import load_partition
    from datasets.sources import DataNotFoundError

    try:
        return load_partition(cfg.data_spec)[1]
    except (DataNotFoundError, OSError):
        if required:
            raise
        return None


def structure_truth(cfg: RunConfig) -> tuple[np.ndarray, str] | None:
    """The true client structure of the run's partition (`strategies.shared.graph.true_structure`): same
    true cluster where the partition has clusters (label-clusters, domains), else the clients'
    label-histogram similarity; None when the server cannot rebuild the partition."""
    from datasets.federated import load_partition
    from datasets.sources import DataNotFoundError, dataset_task
    from strategies.shared.graph import true_structure

    try:
        source, partition = load_partition(cfg.data_spec)
    except (DataNotFoundError, OSError):
        return None
    labels = (getattr(source, "labels", None) if dataset_task(cfg.dataset) == "classification"
              else None)
    return true_structure(partition, labels)


def road_graph(cfg: RunConfig) -> np.ndarray:
    """The traffic data set's sensor graph (Gaussian kernel, self-loops) for the K client sensors."""
    from datasets import traffic

    return traffic.road_graph(cfg.dataset, cfg.data_root, cfg.num_clients,
                              cfg.data_spec.traffic_days)


def given_graph(cfg: RunConfig, source: str, graph_file: str, key: str) -> np.ndarray:
    """A given client graph [K, K] for a method's `<key>` setting, checked (square, K = num-clients,
    finite, non-negative): `label-sharing` (the partition's ground truth, rebuilt on the server from
    the data set), `road` (a traffic data set's sensor graph) or `file` (`<key>-file`, .npy/.csv).
    A ConfigError names the key, the value and what is allowed."""
    from datasets import traffic
    from datasets.sources import DataNotFoundError, dataset_task
    from strategies.shared.settings import ConfigError

    def invalid(why: str, name: str = key, value: Any = source) -> ConfigError:
        return ConfigError(f"run config: key '{name}' = {value!r} is invalid: {why}")

    if source == "file":
        try:
            return read_adjacency(graph_file, cfg.num_clients)
        except ValueError as err:
            raise invalid(str(err), f"{key}-file", graph_file) from None
    if source == "road":
        if cfg.dataset not in traffic.TRAFFIC_DATASETS:
            raise invalid(f"the road graph comes with the traffic data sets "
                          f"({', '.join(traffic.TRAFFIC_DATASETS)}), not dataset '{cfg.dataset}'; "
                          "use 'label-sharing' or 'file'")
        try:
            graph = road_graph(cfg)
        except (DataNotFoundError, OSError, ValueError) as err:
            raise invalid(f"the road graph could not be read: {err}") from None
    elif source == "label-sharing":
        if dataset_task(cfg.dataset) != "classification":
            raise invalid(f"dataset '{cfg.dataset}' has no labels to share; use 'road' or 'file'")
        try:
            graph = ground_truth(cfg, required=True).label_graph
        except (DataNotFoundError, OSError) as err:  # the data is what is missing: say so first
            raise ConfigError(f"data: {err} (the server reads dataset '{cfg.dataset}' because "
                              f"{key}='label-sharing' builds the client graph from its labels; or "
                              f"set {key}='file' with {key}-file)") from None
    else:
        raise invalid("allowed: 'label-sharing', 'road', 'file'")
    try:
        return check_adjacency(graph, cfg.num_clients)
    except ValueError as err:
        raise invalid(str(err)) from None
