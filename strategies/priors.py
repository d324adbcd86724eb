"""Client graphs given by the user: read and checked from a .npy / .csv adjacency file."""

from __future__ import annotations

import warnings

import numpy as np

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
