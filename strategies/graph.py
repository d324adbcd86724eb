"""Graph math shared by the graph-aware methods: client distances from centroid sets, thresholded
adjacency, hierarchical clusters, neighbourhood averaging of parameter rows, and graph-quality scores.

FLT (spec `specs/flt.md` §2) uses: a 2-D UMAP embedding of every client's k-means centroids
(`umap_embed`, `umap_place`), a distance between two clients' embedded centroid sets (`set_distances`:
optimal matching [C] or minimum pair [P]), the threshold Ã_ij = 1[A_ij < γ] with self-loops
(`threshold_adjacency`), optional Ward clusters (`ward_clusters`), and the aggregation
W ← D⁻¹(Ã diag(n)) W (`neighbourhood_average`, and `NeighbourhoodModels` for the per-round step).
Everything is vectorised over clients: no Python loop over client pairs or over parameters.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch
from scipy.sparse import csr_matrix

from strategies.neighbourhood_sums import SumTree

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


# --- aggregation ----------------------------------------------------------------------------------
def neighbourhood_weights(adjacency: torch.Tensor | np.ndarray, num_examples: torch.Tensor | np.ndarray,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """D⁻¹(Ã diag(n)) of FLT's aggregation (spec §2 [C] `comm/fedavg.py`): row m holds
    Ã_mj n_j / Σ_j Ã_mj n_j. A row whose neighbours have no examples weights them equally."""
    a = torch.as_tensor(np.asarray(adjacency), dtype=dtype)
    n = torch.as_tensor(np.asarray(num_examples), dtype=dtype)
    weighted = a * n[None, :]
    total = weighted.sum(dim=1, keepdim=True)
    counts = a.sum(dim=1, keepdim=True)
    empty = total <= 0
    return torch.where(empty, a / counts.clamp_min(1), weighted / torch.where(empty, 1, total))


def neighbourhood_average(adjacency: torch.Tensor | np.ndarray, num_examples: torch.Tensor | np.ndarray,
                          rows: torch.Tensor, sparse: bool = False) -> torch.Tensor:
    """W_new = D⁻¹(Ã diag(n)) W for parameter rows W [M, P] (spec §2 [C], one Jacobi step from a
    snapshot): one matrix product, with a sparse (torch.sparse COO) weight matrix when asked.
    With Ã = 11ᵀ every row is the n-weighted FedAvg mean; with Ã = I rows are unchanged."""
    weights = neighbourhood_weights(adjacency, num_examples, rows.dtype)
    if sparse:
        return torch.sparse.mm(weights.to_sparse(), rows)
    return weights @ rows


class NeighbourhoodModels:
    """Every client's model under FLT's aggregation (spec §3 Phase 3, [D] §6.6): after each round,
    w_m ← Σ_j Ã_mj n_j w_j / Σ_j Ã_mj n_j from a snapshot of the latest models (Jacobi), where w_j is
    what client j trained this round if it was sampled, else the model it holds (stale).

    Clients whose rows of Ã are equal receive the same model, so the models are stored once per
    distinct row: `models` [g, P] with `scale` [g] (model q = scale_q·models_q) and `model_of` [M].
    The sums are planned once per graph (`strategies.neighbourhood_sums.SumTree`): a distinct row is
    either one product over its neighbours — with disjoint clusters one model per cluster, a FedAvg
    mean's cost — or, for the similar rows of a nearly block-diagonal Ã, a similar row's sum plus the
    few terms in which the two rows differ. Sampled clients' terms read their trained rows, the others'
    the held models, summed per held model; no loop over clients or parameters. `share_sums=False`
    computes every distinct row directly.
    """

    def __init__(self, initial: torch.Tensor, num_clients: int, sparse_below: float = 0.25,
                 share_sums: bool = True, max_path_terms: int | None = None) -> None:
        self.num_clients = num_clients
        self.sparse_below = sparse_below
        self.share_sums = share_sums
        self.max_path_terms = max_path_terms
        self.models = initial.detach().reshape(1, -1).clone()  # X [g, P]
        self.scale = torch.ones(1, dtype=self.models.dtype)  # model q = scale[q]·models[q]
        self.model_of = torch.zeros(num_clients, dtype=torch.long)  # client -> row of X
        self._spare: torch.Tensor | None = None  # last round's buffer, written in the next
        self.set_graph(np.eye(num_clients, dtype=np.float32))

    def set_graph(self, adjacency: np.ndarray) -> None:
        """Use Ã (binary, self-loops) from the next aggregation on; the held models are kept."""
        adjacency = np.asarray(adjacency, dtype=np.float32)
        if adjacency.shape != (self.num_clients, self.num_clients):
            raise ValueError(f"adjacency must be [{self.num_clients}, {self.num_clients}], "
                             f"got {adjacency.shape}")
        unique, inverse = np.unique(adjacency, axis=0, return_inverse=True)
        self.tree = SumTree.plan(unique, self.share_sums, self.max_path_terms)
        position = np.empty(len(unique), dtype=np.int64)
        position[self.tree.order] = np.arange(len(unique))
        self.adjacency = adjacency
        self.distinct = torch.from_numpy(np.ascontiguousarray(unique[self.tree.order]))  # [u, M]
        self.group_of = torch.from_numpy(position[inverse.reshape(-1)])  # [M]

    @property
    def num_models(self) -> int:
        return int(self.models.shape[0])

    def model(self, client: int) -> torch.Tensor:
        """The model client `client` holds now."""
        q = self.model_of[client]
        return self.models[q] * self.scale[q]

    def rows(self) -> torch.Tensor:
        """Every client's model as a dense [M, P] matrix (for tests and checkpoints)."""
        return self.models[self.model_of] * self.scale[self.model_of, None]

    def aggregate(self, trained: torch.Tensor, sampled: torch.Tensor | list[int],
                  num_examples: torch.Tensor) -> None:
        """One aggregation: `trained` [M, P] holds the sampled clients' new rows (other rows are
        ignored), `num_examples` [M] the train-set sizes n_j."""
        is_sampled = torch.zeros(self.num_clients, dtype=torch.bool)
        is_sampled[torch.as_tensor(sampled, dtype=torch.long)] = True
        shape = (int(self.distinct.shape[0]), int(trained.shape[1]))
        spare = self._spare
        out = (spare if spare is not None and spare.shape == shape and spare.dtype == trained.dtype
               else torch.empty(shape, dtype=trained.dtype))
        self._spare = None
        scale = self.tree.sums(out, trained, is_sampled, self.models, self.scale, self.model_of,
                               num_examples, self.sparse_below)
        self._spare = self.models
        self.models, self.scale = out, scale
        self.model_of = self.group_of.clone()

    def aggregate_fresh(self, trained: torch.Tensor, sampled: torch.Tensor | list[int],
                        num_examples: torch.Tensor) -> None:
        """One fresh-only aggregation: w_m ← Σ_{j ∈ N(m) ∩ S} n_j w_j / Σ_{j ∈ N(m) ∩ S} n_j over
        the neighbours sampled this round (S) only; a client none of whose neighbours was sampled
        keeps the model it holds. Stale models never enter an average."""
        index = torch.as_tensor(sorted(set(int(c) for c in sampled)), dtype=torch.long)
        if len(index) == 0:
            return
        weights = self.distinct[:, index].to(torch.float64) * num_examples[index].to(torch.float64)
        mass = weights.sum(dim=1)  # [u]
        reached = mass > 0
        sums = ((weights[reached] / mass[reached, None]).to(trained.dtype) @ trained[index])
        group_row = torch.full((len(mass),), -1, dtype=torch.long)
        group_row[reached] = torch.arange(int(reached.sum()))
        client_row = group_row[self.group_of]  # [M]: the fresh row, or -1 (keeps its model)
        keeps = client_row < 0
        held = torch.unique(self.model_of[keeps])  # held models still in use
        held_row = torch.full((self.num_models,), -1, dtype=torch.long)
        held_row[held] = len(sums) + torch.arange(len(held))
        self.models = torch.cat([sums, self.models[held] * self.scale[held, None]])
        self.scale = torch.ones(len(self.models), dtype=self.models.dtype)
        self.model_of = torch.where(keeps, held_row[self.model_of], client_row)
        self._spare = None

    def __getstate__(self) -> dict[str, Any]:
        """Checkpoints leave the spare buffer out (it holds nothing needed)."""
        return {**self.__dict__, "_spare": None}


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


def share_inside_groups(adjacency: np.ndarray, groups: np.ndarray) -> float | None:
    """Share of the off-diagonal edge weight of a graph that joins clients of the same true group
    (None when the graph has no off-diagonal edge)."""
    weights = np.asarray(adjacency, dtype=np.float64).copy()
    np.fill_diagonal(weights, 0.0)
    total = weights.sum()
    if total <= 0:
        return None
    groups = np.asarray(groups)
    return float((weights * (groups[:, None] == groups[None, :])).sum() / total)


def true_structure(partition: Any, labels: np.ndarray | None = None) -> tuple[np.ndarray, str] | None:
    """The ground truth a learned client graph is scored against, [K, K] in [0, 1], and its name.

    `true-clusters`: 1 for two clients of the same true cluster (label-clusters, domains: the
    partition's `cluster_ids`). Otherwise `label-similarity`: the cosine similarity of two clients'
    train-label histograms (needs the source `labels`), which stays informative where every pair
    shares some label (Dirichlet) and a binary label-sharing graph would be complete. Without
    either: `label-sharing`, the partition's binary label graph. None when nothing is known."""
    if partition is None:
        return None
    clusters = getattr(partition, "cluster_ids", None)
    if clusters is not None:
        clusters = np.asarray(clusters)
        return (clusters[:, None] == clusters[None, :]).astype(np.float64), "true-clusters"
    if labels is not None:
        labels = np.asarray(labels)
        classes = int(labels.max()) + 1 if labels.size else 1
        hist = np.stack([np.bincount(labels[idx], minlength=classes) for idx in
                         partition.train_indices]).astype(np.float64)
        norms = np.linalg.norm(hist, axis=1, keepdims=True)
        unit = hist / np.where(norms > 0, norms, 1.0)
        return np.clip(unit @ unit.T, 0.0, 1.0), "label-similarity"
    return np.asarray(partition.label_graph, dtype=np.float64), "label-sharing"


def structure_share(weights: np.ndarray | torch.Tensor, truth: np.ndarray) -> float | None:
    """Σ_{i≠j} |w_ij|·t_ij / Σ_{i≠j} |w_ij|: the share of a graph's off-diagonal weight inside the
    true structure t (`true_structure`; for a binary t, the share on same-cluster pairs). None when
    the graph has no off-diagonal weight."""
    w = np.abs(np.asarray(weights, dtype=np.float64)).copy()
    np.fill_diagonal(w, 0.0)
    total = w.sum()
    if total <= 0:
        return None
    return float((w * np.asarray(truth, dtype=np.float64)).sum() / total)


def uniform_share(truth: np.ndarray) -> float | None:
    """`structure_share` of the complete graph (every pair weighted alike): the chance level."""
    n = len(truth)
    return structure_share(np.ones((n, n)), truth) if n > 1 else None


def fresh_graph(adjacency: torch.Tensor | np.ndarray, weights: torch.Tensor) -> torch.Tensor:
    """rownorm(A·diag(m)): neighbour j's column weighted by m_j ≥ 0 (0 = its row must not be read,
    e.g. a never-trained client), rows renormalised. Every hop of Â^L then reads only rows with
    m_j > 0; a row left without weight becomes a self-loop (`row_normalize`)."""
    a = torch.as_tensor(np.asarray(adjacency), dtype=torch.float64)
    return row_normalize(a * weights.to(torch.float64)[None, :])


# --- GCN aggregation over client graphs (SFL) ---
# SFL (specs/sfl.md §2 (3)): U = α·Â^L·V + (1−α)·V with Â = D_A⁻¹A the row-normalised client graph.
# The propagation is one linear operator W = α·Â^L + (1−α)·I applied to the parameter rows V; it is
# applied either "graph-first" (W formed on the N×N graph, then ONE product W·V) or "rows-first" (L
# products Â·X), each with a dense or a sparse kernel, whichever the cost model says is cheaper.
PropagationOrder = Literal["auto", "graph-first", "rows-first"]
PROPAGATION_ORDERS: tuple[str, ...] = ("auto", "graph-first", "rows-first")
SPARSE_COST_PER_NONZERO = 2.0  # a sparse multiply-add costs this many dense ones (sfl_scale.py: 2.0)
DENSE_COLUMN_BLOCK = 16_384  # columns of V per block of the dense rows-first kernel
ADJACENCY_SUFFIXES: tuple[str, ...] = (".npy", ".csv")


def row_normalize(adjacency: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Â = D_A⁻¹·A (spec §2 (3), [C] `normalize_adj`): every row sums to 1, self-loops kept.

    [D] A row without any weight (a client with no edge, e.g. in a learned graph) becomes a self-loop,
    so that client keeps its own model instead of the reference code's all-zero row (a zero model).
    """
    a = torch.as_tensor(np.asarray(adjacency), dtype=torch.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"adjacency must be a square matrix, got shape {tuple(a.shape)}")
    totals = a.sum(dim=1, keepdim=True)
    empty = (totals <= 0).squeeze(1)
    normalized = a / torch.where(totals > 0, totals, torch.ones_like(totals))
    if bool(empty.any()):
        normalized[empty, empty.nonzero().squeeze(1)] = 1.0
    return normalized.to(torch.float32)


def gcn_operator(adj_hat: torch.Tensor | np.ndarray, hops: int, alpha: float) -> torch.Tensor:
    """W = α·Â^L + (1−α)·I (dense N×N, float32), so that U = W·V (spec §2 (3)); Â^L by repeated
    squaring on the N×N graph (float64, then rounded once)."""
    a = torch.as_tensor(np.asarray(adj_hat), dtype=torch.float64)
    eye = torch.eye(a.shape[0], dtype=torch.float64)
    power = torch.linalg.matrix_power(a, hops) if hops > 0 else eye
    return (alpha * power + (1.0 - alpha) * eye).to(torch.float32)


class GCNPropagation:
    """The weight-free GCN of SFL (spec §2 (3)): `apply(V)` = α·Â^L·V + (1−α)·V for a fixed Â.

    Plans: graph-first = W = α·Â^L + (1−α)·I formed on the N×N graph, then ONE product W·V;
    rows-first = L products Â·X, then the α mix. Each with a dense (BLAS) or a sparse
    (`strategies.spmm`, CSR) kernel. `auto` takes the plan of least modelled cost, in dense
    multiply-adds per column of V: dense N² per product, sparse `SPARSE_COST_PER_NONZERO`·nnz
    (measured by benchmarks/sfl_scale.py).
    So a dense graph goes graph-first/dense (one GEMM instead of L), a kNN graph rows-first/sparse
    (L·nnz(Â) < nnz(Â^L) once neighbourhoods overlap), and a graph whose Â^L stays sparse
    graph-first/sparse. V is processed in blocks of columns, all hops of a block at once, so a block
    stays in cache across hops and no N×P intermediate is kept (memory: V and U). The sparse kernel
    runs every hop of a cache-sized column block in compiled code, the columns split among torch's
    thread count of threads. No loop over clients.
    """

    def __init__(self, adj_hat: torch.Tensor | np.ndarray, hops: int, alpha: float,
                 order: PropagationOrder = "auto", sparse: bool | None = None) -> None:
        if hops < 0:
            raise ValueError(f"hops must be >= 0, got {hops}")
        if order not in PROPAGATION_ORDERS:
            raise ValueError(f"unknown order {order!r}; allowed: {', '.join(PROPAGATION_ORDERS)}")
        a = torch.as_tensor(np.asarray(adj_hat), dtype=torch.float32)
        self.num_clients = n = a.shape[0]
        self.hops, self.alpha = hops, alpha
        self.adj_hat = a
        self.operator = gcn_operator(a, hops, alpha)  # W (dense; N×N is small next to N×P)
        self.nnz_adjacency = nnz_a = int(torch.count_nonzero(a))
        self.nnz_operator = nnz_w = int(torch.count_nonzero(self.operator))
        mix = n if alpha != 1.0 else 0
        costs = {
            ("graph-first", False): float(n * n),
            ("graph-first", True): SPARSE_COST_PER_NONZERO * nnz_w,
            ("rows-first", False): float(hops * n * n + mix),
            ("rows-first", True): SPARSE_COST_PER_NONZERO * hops * nnz_a + mix,
        }
        self.costs = {f"{o}/{'sparse' if s else 'dense'}": c for (o, s), c in costs.items()}
        allowed = [key for key in costs
                   if (order == "auto" or key[0] == order) and (sparse is None or key[1] == sparse)]
        self.order, self.sparse = min(allowed, key=lambda key: (costs[key], key))
        if self.order == "graph-first":
            self._step, self._steps = self.operator, 1
        else:
            self._step, self._steps = a, hops
        if self.sparse:
            step = csr_matrix(self._step.numpy())
            self._csr = (step.indptr.astype(np.int64), step.indices.astype(np.int64),
                         step.data.astype(np.float32))

    def describe(self) -> str:
        return f"{self.order}/{'sparse' if self.sparse else 'dense'}"

    def apply(self, rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """U = α·Â^L·V + (1−α)·V for parameter rows V [N, P] (float32) → U [N, P].

        `out`: a matrix of V's shape and dtype (not V itself) to write U into. Reusing one across
        rounds matters at scale: a fresh N×P result costs more in first-touch page faults than the
        sparse products themselves (`benchmarks/results/aggregation-floor.md`)."""
        if rows.shape[0] != self.num_clients:
            raise ValueError(f"rows must have {self.num_clients} rows (one per client), got "
                             f"{rows.shape[0]}")
        if out is None or out.shape != rows.shape or out.dtype != rows.dtype:
            out = torch.empty_like(rows)
        if out.data_ptr() == rows.data_ptr():
            raise ValueError("out must not share memory with the rows")
        if self.hops == 0 or self.alpha == 0.0:
            return out.copy_(rows)
        if self.order == "graph-first" and not self.sparse:
            return torch.mm(self._step, rows, out=out)  # one GEMM; BLAS blocks it itself
        if not self.sparse:
            self._columns(rows, out, 0, rows.shape[1])
            return out
        return self._sparse_apply(rows, out)

    def _sparse_apply(self, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The sparse plans: `strategies.spmm`'s column-blocked kernel, the columns split among
        torch's thread count of threads (the kernel releases the GIL)."""
        from concurrent.futures import ThreadPoolExecutor

        from strategies import spmm  # lazy: numba is imported only for sparse propagations

        if rows.dtype != torch.float32 or rows.device.type != "cpu":
            raise ValueError(f"the sparse propagation takes float32 rows on the CPU, got {rows.dtype} "
                             f"on {rows.device}")
        source = rows.detach().contiguous().numpy()
        target = out if out.is_contiguous() else torch.empty_like(rows)
        result = target.numpy()
        alpha = self.alpha if self.order == "rows-first" else 1.0  # graph-first: α is inside W
        columns = rows.shape[1]
        workers = max(1, min(torch.get_num_threads(), columns // spmm.block_columns(rows.shape[0])))
        bounds = [columns * i // workers for i in range(workers + 1)]

        def run(i: int) -> None:
            spmm.propagate_columns(self._csr, self._steps, alpha, source, result, bounds[i],
                                   bounds[i + 1])

        if workers == 1:
            run(0)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(run, range(workers)))
        return target if target is out else out.copy_(target)

    def _columns(self, rows: torch.Tensor, out: torch.Tensor, first: int, last: int) -> None:
        """out[:, first:last] = the propagation of rows[:, first:last], block by block, every hop
        of a block at once."""
        width = DENSE_COLUMN_BLOCK
        mix = self.order == "rows-first" and self.alpha != 1.0
        for start in range(first, last, width):
            stop = min(start + width, last)
            block = rows[:, start:stop].contiguous()
            x = block
            for _ in range(self._steps):
                x = self._step @ x
            if mix:
                x = self.alpha * x + (1.0 - self.alpha) * block
            out[:, start:stop] = x


def gcn_propagate(adjacency: torch.Tensor | np.ndarray, rows: torch.Tensor, hops: int = 3,
                  alpha: float = 1.0, order: PropagationOrder = "auto") -> torch.Tensor:
    """SFL's server step (spec §2 (3)): U = α·Â^L·V + (1−α)·V with Â = row_normalize(A)."""
    return GCNPropagation(row_normalize(adjacency), hops, alpha, order).apply(rows)


def top_k_per_row(matrix: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest entries of every row, zero the rest (spec §2 (5) export, [C] `eval`)."""
    k = max(0, min(int(k), matrix.shape[1]))
    if k == 0:
        return torch.zeros_like(matrix)
    values, index = matrix.topk(k, dim=1)
    return torch.zeros_like(matrix).scatter_(1, index, values)


def knn_graph(points: torch.Tensor | np.ndarray, k: int, self_loops: bool = True) -> torch.Tensor:
    """Binary kNN graph [N, N] of points [N, d]: row i links i to its k nearest other points."""
    x = torch.as_tensor(np.asarray(points), dtype=torch.float64)
    distances = torch.cdist(x, x)
    distances.fill_diagonal_(float("inf"))
    k = max(0, min(int(k), len(x) - 1))
    graph = torch.zeros(len(x), len(x), dtype=torch.float32)
    if k:
        graph.scatter_(1, distances.topk(k, dim=1, largest=False).indices, 1.0)
    if self_loops:
        graph.fill_diagonal_(1.0)
    return graph


def pairwise_row_distances(rows: torch.Tensor) -> torch.Tensor:
    """Dist_ij = ||v_i − v_j||_2 [N, N] (float64) of parameter rows (spec §2 (5)), from one Gram
    product of the centred rows (centring keeps float32 cancellation small)."""
    centred = rows - rows.mean(dim=0, keepdim=True)
    gram = (centred @ centred.T).to(torch.float64)
    norms = gram.diagonal()
    squared = (norms[:, None] + norms[None, :] - 2.0 * gram).clamp_min(0.0)
    squared.fill_diagonal_(0.0)
    return squared.sqrt()


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


def share_on_edges(weights: np.ndarray | torch.Tensor, reference: np.ndarray) -> float | None:
    """Share of a graph's off-diagonal weight that lies on the edges of a reference graph (e.g. the
    learned SFL* graph on label-sharing pairs); None when the graph has no off-diagonal weight."""
    w = np.abs(np.asarray(weights, dtype=np.float64)).copy()
    np.fill_diagonal(w, 0.0)
    total = w.sum()
    if total <= 0:
        return None
    return float((w * (np.asarray(reference) > 0)).sum() / total)
