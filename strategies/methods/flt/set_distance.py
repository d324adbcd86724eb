"""Distances between two clients' sets of embedded centroids (FLT's `flt.distance`, docs/methods/flt.md): optimal
matching [C] or the minimum pair [P], for every pair of clients at once (`set_distances`)."""

from __future__ import annotations

import itertools
from typing import Literal

import numpy as np

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
        sq = _squared_distances(part, big)  # [c, n2, ks, kl]
        cost = sq[:, :, rows, maps].sum(axis=-1)  # [c, n2, n_maps]
        out[start:start + step] = np.sqrt(cost.min(axis=-1)) / ks
    return out


GRAM_FROM_DIM = 16  # from this dimension on, squared distances come from one matrix product


def _squared_distances(part: np.ndarray, big: np.ndarray) -> np.ndarray:
    """Squared distances [c, n2, ks, kl] between centroid r of each set of `part` [c, ks, d] and
    centroid s of each set of `big` [n2, kl, d]. Low-dimensional points (UMAP's 2-D) take the
    exact differences; from `GRAM_FROM_DIM` on (the encoder's latent space) ‖a‖² + ‖b‖² − 2a·b
    from one BLAS product, which is many times faster there (clipped at 0; the error is at
    float64 rounding of the norms)."""
    c, ks, d = part.shape
    n2, kl, _ = big.shape
    if d < GRAM_FROM_DIM:
        sq = np.empty((c, n2, ks, kl))
        for r in range(ks):
            for s in range(kl):
                diff = part[:, None, r, :] - big[None, :, s, :]
                sq[:, :, r, s] = np.einsum("abd,abd->ab", diff, diff)
        return sq
    dot = (part.reshape(c * ks, d) @ big.reshape(n2 * kl, d).T).reshape(c, ks, n2, kl)
    sq = (np.einsum("crd,crd->cr", part, part)[:, None, :, None]
          + np.einsum("nsd,nsd->ns", big, big)[None, :, None, :]
          - 2.0 * dot.transpose(0, 2, 1, 3))
    return np.maximum(sq, 0.0, out=sq)


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
