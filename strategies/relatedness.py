"""FLT's client relatedness (specs/flt.md §2): distances between clients' embedded centroid sets
(`set_distances`: optimal matching [C] or minimum pair [P]), the 2-D UMAP embedding of every client's
k-means centroids (`umap_embed`, `umap_place`), the threshold Ã_ij = 1[A_ij < γ] with self-loops
(`threshold_adjacency`), optional Ward clusters (`ward_clusters`) and the adjusted Rand index against a
known clustering. Vectorised over clients: no Python loop over client pairs."""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch

DistanceMode = Literal["matching", "min-pair"]


DISTANCE_MODES: tuple[str, ...] = ("matching", "min-pair")


MAX_ENUMERATED_MATCHINGS = 720  # injective maps enumerated at once (k ≤ 6); beyond: one LSA per pair


_CHUNK_ELEMENTS = 4_000_000  # float64 elements of one block of intermediate distances (32 MB)


# --- centroid sets --------------------------------------------------------------------------------
def _offsets(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _check_sets(points: np.ndarray, sizes: np.ndarray, name: str) -> None:
    if points.ndim != 2:
        raise ValueError(f"{name}: points must be a 2-D array [Σk, d], got shape {points.shape}")
    if sizes.ndim != 1 or (sizes < 1).any():
        raise ValueError(f"{name}: every set needs at least one point, got sizes {sizes.tolist()[:10]}")
    if int(sizes.sum()) != len(points):
        raise ValueError(f"{name}: set sizes sum to {int(sizes.sum())} but there are {len(points)} points")


def set_distances(
    points_a: np.ndarray, sizes_a: np.ndarray | list[int],
    points_b: np.ndarray, sizes_b: np.ndarray | list[int],
    mode: DistanceMode = "matching",
) -> np.ndarray:
    """Distances [len(sizes_a), len(sizes_b)] between point sets stacked set after set (FLT spec §2).

    `matching` [C `min_matching_distance`]: A_ij = min_π sqrt(Σ_{r≤k_s} ||u_{small,r} − u_{big,π(r)}||²)
    / k_s over injective maps π of the smaller set into the larger (k_s = min(k_i, k_j)).
    `min-pair` [P]: A_ij = min_{r,s} ||u_{i,r} − u_{j,s}||.
    """
    points_a = np.asarray(points_a, dtype=np.float64)
    points_b = np.asarray(points_b, dtype=np.float64)
    sizes_a, sizes_b = np.asarray(sizes_a, dtype=np.int64), np.asarray(sizes_b, dtype=np.int64)
    _check_sets(points_a, sizes_a, "first sets")
    _check_sets(points_b, sizes_b, "second sets")
    if points_a.shape[1] != points_b.shape[1]:
        raise ValueError(f"point dimensions differ: {points_a.shape[1]} vs {points_b.shape[1]}")
    if mode == "min-pair":
        return _min_pair(points_a, sizes_a, points_b, sizes_b)
    if mode == "matching":
        return _matching(points_a, sizes_a, points_b, sizes_b)
    raise ValueError(f"unknown distance {mode!r}; allowed: {', '.join(DISTANCE_MODES)}")


def _min_pair(pa: np.ndarray, sa: np.ndarray, pb: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """[P] minimum pairwise distance: all point distances, then segment minima along both axes."""
    from scipy.spatial.distance import cdist

    oa, ob = _offsets(sa), _offsets(sb)
    out = np.empty((len(sa), len(sb)))
    step = max(1, _CHUNK_ELEMENTS // max(int(sa.max()) * len(pb), 1))  # sets of a per block
    for first in range(0, len(sa), step):
        last = min(first + step, len(sa))
        block = cdist(pa[oa[first]:oa[last]], pb)  # [points of these sets, all points of b]
        rows = np.minimum.reduceat(block, oa[first:last] - oa[first], axis=0)
        out[first:last] = np.minimum.reduceat(rows, ob[:-1], axis=1)
    return out


def _matching(pa: np.ndarray, sa: np.ndarray, pb: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """[C] optimal-matching distance, grouped by set sizes so each block is one array expression."""
    oa, ob = _offsets(sa), _offsets(sb)
    out = np.empty((len(sa), len(sb)))
    for ka in np.unique(sa):
        ia = np.flatnonzero(sa == ka)
        sets_a = pa[oa[ia][:, None] + np.arange(ka)]  # [na, ka, d]
        for kb in np.unique(sb):
            ib = np.flatnonzero(sb == kb)
            sets_b = pb[ob[ib][:, None] + np.arange(kb)]  # [nb, kb, d]
            if ka <= kb:
                block = _matching_block(sets_a, sets_b)
            else:
                block = _matching_block(sets_b, sets_a).T
            out[np.ix_(ia, ib)] = block
    return out


def _matching_block(small: np.ndarray, big: np.ndarray) -> np.ndarray:
    """Matching distances between every set of `small` [n1, ks, d] and of `big` [n2, kl, d], ks ≤ kl.

    The injective maps π are enumerated as index arrays (k=2: the 2 permutations, k=4: 24), so the
    minimum over π is taken for all pairs at once; only for k > 6 does each pair get its own
    Hungarian assignment (scipy `linear_sum_assignment` on squared distances, the same optimum).
    """
    n1, ks, _ = small.shape
    n2, kl, _ = big.shape
    maps = np.array(list(itertools.permutations(range(kl), ks)), dtype=np.int64)  # [n_maps, ks]
    if len(maps) > MAX_ENUMERATED_MATCHINGS:
        return _matching_by_assignment(small, big)
    out = np.empty((n1, n2))
    rows = np.arange(ks)
    step = max(1, _CHUNK_ELEMENTS // max(n2 * ks * max(kl, len(maps)), 1))
    for start in range(0, n1, step):
        part = small[start:start + step]
        # squared distances between centroid r of each small set and centroid s of each big set
        sq = np.empty((len(part), n2, ks, kl))
        for r in range(ks):
            for s in range(kl):
                diff = part[:, None, r, :] - big[None, :, s, :]
                sq[:, :, r, s] = np.einsum("abd,abd->ab", diff, diff)
        cost = sq[:, :, rows, maps].sum(axis=-1)  # [c, n2, n_maps]
        out[start:start + step] = np.sqrt(cost.min(axis=-1)) / ks
    return out


def _matching_by_assignment(small: np.ndarray, big: np.ndarray) -> np.ndarray:
    """Fallback for large k: the Hungarian algorithm per pair (spec §6.4 [D])."""
    from scipy.optimize import linear_sum_assignment

    ks = small.shape[1]
    out = np.empty((len(small), len(big)))
    for i, a in enumerate(small):
        sq = ((a[None, :, None, :] - big[:, None, :, :]) ** 2).sum(-1)  # [n2, ks, kl]
        for j in range(len(big)):
            r, c = linear_sum_assignment(sq[j])
            out[i, j] = np.sqrt(sq[j][r, c].sum()) / ks
    return out


def matching_distance(a: np.ndarray, b: np.ndarray) -> float:
    """[C] matching distance of two sets [k_i, d], [k_j, d] (Hungarian; the reference for tests)."""
    from scipy.optimize import linear_sum_assignment

    small, big = (a, b) if len(a) <= len(b) else (b, a)
    sq = ((np.asarray(small, float)[:, None, :] - np.asarray(big, float)[None, :, :]) ** 2).sum(-1)
    r, c = linear_sum_assignment(sq)
    return float(np.sqrt(sq[r, c].sum()) / len(small))


# --- adjacency and clusters -----------------------------------------------------------------------
def threshold_adjacency(distance: np.ndarray, gamma: float) -> np.ndarray:
    """FLT threshold (spec §2, [C] reading of §6.5): Ã_ij = 1 if A_ij < γ else 0, Ã_ii = 1.
    Unknown distances (NaN) give no edge."""
    distance = np.asarray(distance, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        adjacency = (distance < gamma).astype(np.float32)
    np.fill_diagonal(adjacency, 1.0)
    return adjacency


def ward_clusters(adjacency: np.ndarray, num_clusters: int) -> np.ndarray:
    """FLT disjoint clusters [C `partition_clusters`]: Ward linkage of the rows of Ã (euclidean),
    cut into at most `num_clusters` clusters (`fcluster(..., criterion='maxclust')`); labels 0..C'-1.

    The euclidean distances between rows come from one Gram product (exact for binary rows): the
    same numbers `linkage(rows, 'ward')` gets from `pdist`, as one BLAS call instead of M²/2 row
    differences (M = 2400: under a second instead of several).
    """
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    rows = np.asarray(adjacency, dtype=np.float64)
    if num_clusters < 1:
        raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
    if len(rows) == 1:
        return np.zeros(1, dtype=np.int64)
    norms = (rows * rows).sum(axis=1)
    squared = norms[:, None] + norms[None, :] - 2.0 * (rows @ rows.T)
    np.maximum(squared, 0.0, out=squared)
    distances = np.sqrt(squared)
    distances = (distances + distances.T) / 2.0
    np.fill_diagonal(distances, 0.0)
    tree = linkage(squareform(distances, checks=False), method="ward")
    labels = fcluster(tree, t=num_clusters, criterion="maxclust")
    return _relabel(labels)


def connected_components(adjacency: np.ndarray) -> np.ndarray:
    """Connected components of the undirected graph Ã (labels 0..c-1, in order of first client)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components as components

    _, labels = components(csr_matrix(np.asarray(adjacency) > 0), directed=False)
    return _relabel(labels)


def _relabel(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered 0, 1, ... in order of first appearance (stable across equivalent cuts)."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))
    return rank[inverse].astype(np.int64)


def cluster_adjacency(labels: np.ndarray) -> np.ndarray:
    """Ã_ij = 1[c_i = c_j] (spec §2, disjoint clusters: one model per cluster)."""
    labels = np.asarray(labels)
    return (labels[:, None] == labels[None, :]).astype(np.float32)


# --- UMAP -----------------------------------------------------------------------------------------
def umap_embed(points: np.ndarray, *, seed: int = 42, max_neighbors: int = 15,
               exact_knn_from: int = 4096) -> tuple[np.ndarray, Any]:
    """2-D UMAP of all clients' centroids (spec §2 manifold; §4: n_components=2, random_state=42,
    n_neighbors = min(15, Σk − 1), other settings default). Returns (embedding [N, 2], fitted reducer).

    From `exact_knn_from` points on, UMAP would switch to pynndescent's approximate neighbours
    (≈40 s of numba compilation per process); we give it the exact neighbours instead (scikit-learn,
    brute force) — the same graph UMAP builds itself below that size — and keep `transform` on UMAP's
    exact path for clients placed later.
    """
    import umap  # lazy: importing umap compiles numba code

    points = np.ascontiguousarray(points, dtype=np.float32)
    count = len(points)
    if count < 3:
        raise ValueError(
            f"FCR needs at least 3 centroids in total to fit UMAP, got {count}; raise flt.k or "
            "the number of clients"
        )
    neighbors = max(2, min(max_neighbors, count - 1))
    options: dict[str, Any] = dict(n_components=2, random_state=seed, n_neighbors=neighbors)
    if count < 4:
        options["init"] = "random"  # the spectral init needs more points than components + 1
    exact = count >= exact_knn_from
    if exact:
        from sklearn.neighbors import NearestNeighbors

        knn = NearestNeighbors(n_neighbors=neighbors, algorithm="brute").fit(points)
        distances, indices = knn.kneighbors(points)  # each point's first neighbour is itself
        options["precomputed_knn"] = (indices.astype(np.int32), distances.astype(np.float32))
    with warnings.catch_warnings(), _torch_threads_kept():
        warnings.filterwarnings("ignore", message=".*n_jobs value.*")
        warnings.filterwarnings("ignore", message=".*knn_search_index.*")
        warnings.filterwarnings("ignore", message=".*is not an NNDescent object.*")
        reducer = umap.UMAP(**options).fit(points)
    if exact:
        # transform() then takes UMAP's own exact (small-data) path: distances to all fitted points
        reducer._small_data = True
        if getattr(reducer, "_knn_search_index", None) is None and hasattr(reducer, "_knn_search_index"):
            del reducer._knn_search_index
    return np.asarray(reducer.embedding_, dtype=np.float64), reducer


def umap_place(reducer: Any, points: np.ndarray) -> np.ndarray:
    """Embed new centroids with the fitted reducer's `transform` (spec §6.3 [D], late clients)."""
    with warnings.catch_warnings(), _torch_threads_kept():
        warnings.filterwarnings("ignore", message=".*n_jobs value.*")
        return np.asarray(reducer.transform(np.asarray(points, dtype=np.float32)), dtype=np.float64)


@contextlib.contextmanager
def _torch_threads_kept() -> Iterator[None]:
    """Numba's OpenMP layer (started by UMAP) resets the process's OpenMP thread count, which torch
    then reports and uses: measured here, a pinned single-threaded process went to 2 threads and
    small training steps ran up to 100× slower on a busy 2-core machine. Restore torch's setting."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# --- graph quality against a ground-truth partition ----------------------------------------------
def adjusted_rand(labels: np.ndarray, truth: np.ndarray) -> float:
    """Adjusted Rand index between discovered and true cluster labels (1 = identical partitions)."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(np.asarray(truth), np.asarray(labels)))
