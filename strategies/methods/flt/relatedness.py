"""FLT's client relatedness (docs/methods/flt.md, Form Client Relatedness): distances between clients' embedded centroid sets
(`set_distances`: optimal matching [C] or minimum pair [P]), the 2-D UMAP embedding of every client's
k-means centroids (`umap_embed`, `umap_place`), the threshold Ã_ij = 1[A_ij < γ] with self-loops
(`threshold_adjacency`), optional Ward clusters (`ward_clusters`) and the adjusted Rand index against a
known clustering. Vectorised over clients: no Python loop over client pairs."""

from __future__ import annotations

import contextlib
import heapq
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from strategies.methods.flt.set_distance import set_distances


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


def structure_contrast(latent: np.ndarray, adjacency: np.ndarray) -> float | None:
    """How much closer Ã's linked clients are than its unlinked ones in the encoder's own space:
    median(L_ij over edges) / median(L_ij over non-edges), L the set distance between the clients'
    *latent* centroids (before UMAP). Near 1: the edges are no closer than any pair there, the
    groups were made by the 2-D embedding (UMAP draws clusters from unstructured points too). None
    when Ã has no edge or no non-edge (the contrast is undefined)."""
    latent = np.asarray(latent, dtype=np.float64)
    linked = np.asarray(adjacency) > 0
    off = ~np.eye(len(latent), dtype=bool)
    inside, outside = latent[linked & off], latent[~linked & off]
    inside, outside = inside[np.isfinite(inside)], outside[np.isfinite(outside)]
    if inside.size == 0 or outside.size == 0:
        return None
    return float(np.median(inside) / max(float(np.median(outside)), 1e-12))


NULL_DRAWS = 199  # federations without groups drawn by `structure_test` (p-values in steps of 1/200)
NULL_SEED = 46  # their generator's seed: the decision is a function of the centroids alone
TEST_CLIENTS = 400  # above this many clients the test runs on a seeded sample of them (cost ∝ M²)


@dataclass(frozen=True)
class StructureTest:
    """`structure_test`'s answer: the found graph's contrast between client mean codes, the p-value
    of a contrast that low in a federation without groups, and the draws it was compared with."""

    contrast: float | None  # median ‖z_i − z_j‖ over Ã's edges / over its non-edges (None: undefined)
    p: float | None  # None where the contrast is undefined
    draws: int

    def structured(self, confidence: float) -> bool:
        """Whether the graph's groups are real at `confidence` (p ≤ 1 − confidence)."""
        return self.p is not None and self.p <= 1.0 - confidence + 1e-12


def structure_test(codes: np.ndarray, adjacency: np.ndarray, *, draws: int = NULL_DRAWS,
                   seed: int = NULL_SEED) -> StructureTest:
    """Are the groups of the found graph Ã real, or could a federation without groups of the same
    size and spread have given edges as close?

    `codes` [M, e]: each client's mean latent code (the mean of its centroids). The statistic is the
    contrast of Ã between them: median distance over its edges / median over its non-edges. The null
    model is a federation without groups (`_group_free_pairs`); in each of `draws` such federations,
    the graph is the same number of *closest* pairs (the most favourable graph for the null, so the
    test errs towards no structure), and its contrast is computed the same way. p = (1 + #{null
    contrast ≤ found contrast}) / (draws + 1): the chance that a federation without groups shows
    edges at least this much closer than its non-edges. Deterministic (seeded generator). Above
    `TEST_CLIENTS` clients, the statistic and the null are computed on a seeded sample of that many
    clients (and the edges among them), which bounds the cost at 199 × TEST_CLIENTS² distances."""
    codes, adjacency = _test_sample(codes, adjacency, seed)
    linked = adjacency > 0
    count = len(codes)
    upper = np.triu_indices(count, k=1)
    edges = linked[upper] | linked.T[upper]
    distance = _pair_distances(codes)[upper]
    if count < 3 or edges.all() or not edges.any():
        return StructureTest(None, None, draws)
    found = _contrast(distance[edges], distance[~edges])
    size = int(edges.sum())
    below = 0
    for pairs in _group_free_pairs(codes, draws, seed):
        order = np.argpartition(pairs, size - 1)
        below += _contrast(pairs[order[:size]], pairs[order[size:]]) <= found
    return StructureTest(found, (1 + below) / (draws + 1), draws)


def _test_sample(codes: np.ndarray, matrix: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The clients a test runs on: all of them, or above `TEST_CLIENTS` a seeded sample (with the
    client-by-client `matrix` restricted to it)."""
    codes, matrix = np.asarray(codes, dtype=np.float64), np.asarray(matrix)
    if len(codes) > TEST_CLIENTS:
        keep = np.sort(np.random.default_rng(seed).choice(len(codes), TEST_CLIENTS, replace=False))
        codes, matrix = codes[keep], matrix[np.ix_(keep, keep)]
    return codes, matrix


def _group_free_pairs(codes: np.ndarray, draws: int, seed: int) -> Iterator[np.ndarray]:
    """The client-pair distances (upper triangle, row-major) of `draws` federations without groups
    like `codes`: every client's code is the federation's mean plus its own deviation, drawn at
    random from one Gaussian shared by all (the covariance of the observed deviations, each client
    keeping its own deviation's length, so clients with more data stay nearer the mean)."""
    count = len(codes)
    upper = np.triu_indices(count, k=1)
    deviation = codes - codes.mean(axis=0)
    length = np.linalg.norm(deviation, axis=1)
    unit = deviation / np.maximum(length, 1e-12)[:, None]
    rng = np.random.default_rng(seed)
    for _ in range(draws):
        # each row: a Gaussian with the covariance of the observed directions (E‖·‖² = 1), scaled
        # by the client's own deviation
        mix = rng.standard_normal((count, count)) @ unit / math.sqrt(count)
        yield _pair_distances(length[:, None] * mix)[upper]


@dataclass(frozen=True)
class EvidenceCut:
    """`evidence_cut`'s answer: Ã links the `pairs` closest client pairs of A (those below `gamma`),
    and `test` is that graph's structure test, corrected for having chosen the cut."""

    pairs: int
    gamma: float
    test: StructureTest


def evidence_cut(codes: np.ndarray, distance: np.ndarray, *, draws: int = NULL_DRAWS,
                 seed: int = NULL_SEED) -> EvidenceCut | None:
    """Where to cut A, from the federation's own evidence (`flt.threshold=evidence`): Ã links the s
    closest pairs of A for the s that marks the groups' boundary best, kept only if a federation
    without groups would rarely show such a graph.

    For every s up to half the pairs (linking more would leave fewer pairs apart than together:
    groups are at least two), G_s is A's s closest pairs, and the clients' mean codes give it two
    contrasts, edges against non-edges: of mean distances, and of lower-median distances
    (`structure_test`'s statistic). In each of `draws` federations without groups
    (`_group_free_pairs`) the null graph of s pairs is its s closest ones, with the same two
    contrasts. Standardised against the null at each s (log scale):
    - the cut is the s whose mean contrast lies the most standard deviations below the null's: a
      mean moves with every pair that crosses a group's boundary, so it peaks at the boundary;
    - the test is the median contrast at that cut (robust to a few far clients), against each null
      federation's median contrast at *its* best cut chosen the same way, so choosing the cut is
      paid for: p = (1 + #{null ≤ found}) / (draws + 1).
    No fraction and no constant between known cases: the confidence p is compared with is the only
    parameter. None with fewer than three clients (nothing to test). Above `TEST_CLIENTS` clients
    the scan runs on the seeded sample `structure_test` uses."""
    codes, matrix = _test_sample(codes, np.asarray(distance, dtype=np.float64), seed)
    count = len(codes)
    if count < 3:
        return None
    upper = np.triu_indices(count, k=1)
    apart, closeness = matrix[upper], _pair_distances(codes)[upper]
    known = np.isfinite(apart)
    apart, closeness = apart[known], np.maximum(closeness[known], 1e-12)
    total = len(apart)
    if total < 2:
        return None
    sizes = np.arange(1, total // 2 + 1)
    order = np.argsort(apart, kind="stable")
    ranked = closeness[order]
    found_mean = _log_mean_contrasts(ranked)[: len(sizes)]
    found_median = _log_prefix_contrasts(ranked)[: len(sizes)]
    null_mean, null_median = np.empty((draws, len(sizes))), np.empty((draws, len(sizes)))
    for d, pairs in enumerate(_group_free_pairs(codes, draws, seed)):
        pairs = np.maximum(np.sort(pairs[known]), 1e-12)
        null_mean[d] = _log_mean_contrasts(pairs)[: len(sizes)]
        logs = np.log(pairs)  # lower medians of the closest s and of the rest, as for `found`
        null_median[d] = logs[(sizes - 1) // 2] - logs[sizes + (total - sizes - 1) // 2]
    by_mean, by_median = _standardised(null_mean), _standardised(null_median)
    best = int(np.argmin(by_mean(found_mean)))
    null_best = np.argmin(by_mean(null_mean), axis=1)
    score = by_median(found_median)[best]
    p = (1 + int(np.sum(by_median(null_median)[np.arange(draws), null_best] <= score))) / (draws + 1)
    below, above = apart[order[best]], apart[order[best + 1]]
    gamma = float(below + (above - below) / 2.0) if above > below else float(np.nextafter(below, np.inf))
    contrast = _contrast(ranked[: best + 1], ranked[best + 1:])
    return EvidenceCut(best + 1, gamma, StructureTest(contrast, p, draws))


def _evidence_gamma(codes: np.ndarray, distance: np.ndarray) -> tuple[float, StructureTest]:
    """γ and the structure test of `evidence_cut`; with too few clients to test, γ = 0 (no edge)
    and an undefined test (the complete graph where the test decides)."""
    cut = evidence_cut(codes, distance)
    return (0.0, StructureTest(None, None, NULL_DRAWS)) if cut is None else (cut.gamma, cut.test)


def _standardised(null: np.ndarray):
    """x ↦ (x − the null's mean) / its standard deviation, per column (cut size)."""
    centre, spread = null.mean(axis=0), np.maximum(null.std(axis=0), 1e-12)
    return lambda x: (x - centre) / spread


def _log_mean_contrasts(values: np.ndarray) -> np.ndarray:
    """log(mean of values[:s] / mean of values[s:]) for s = 1 … len − 1."""
    running = np.cumsum(values)
    size = np.arange(1, len(values))
    return (np.log(running[:-1] / size)
            - np.log((running[-1] - running[:-1]) / (len(values) - size)))


def _log_prefix_contrasts(values: np.ndarray) -> np.ndarray:
    """log(lower median of values[:s] / lower median of values[s:]) for s = 1 … len − 1."""
    head = _prefix_lower_medians(values)
    tail = _prefix_lower_medians(values[::-1])[::-1]  # tail[i]: lower median of values[i:]
    return np.log(np.maximum(head[:-1], 1e-12)) - np.log(np.maximum(tail[1:], 1e-12))


def _prefix_lower_medians(values: np.ndarray) -> np.ndarray:
    """The lower median of each prefix values[:i + 1] (two heaps: O(n log n))."""
    low: list[float] = []  # the lower half, negated (a max-heap)
    high: list[float] = []
    out = np.empty(len(values))
    for i, value in enumerate(values.tolist()):
        if low and value > -low[0]:
            heapq.heappush(high, value)
        else:
            heapq.heappush(low, -value)
        if len(low) > len(high) + 1:
            heapq.heappush(high, -heapq.heappop(low))
        elif len(high) > len(low):
            heapq.heappush(low, -heapq.heappop(high))
        out[i] = -low[0]
    return out


def _pair_distances(points: np.ndarray) -> np.ndarray:
    squared = (points * points).sum(axis=1)
    gram = squared[:, None] + squared[None, :] - 2.0 * (points @ points.T)
    return np.sqrt(np.maximum(gram, 0.0))


def _contrast(inside: np.ndarray, outside: np.ndarray) -> float:
    return float(np.median(inside) / max(float(np.median(outside)), 1e-12))


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


UMAP_SEED = 42  # [C] UMAP(n_components=2, random_state=42)


# --- Form Client Relatedness (server side) --------------------------------------------------------
@dataclass
class Relatedness:
    """The server state of FCR (spec §3 Phase 2): per-client centroids and their UMAP coordinates,
    the fitted reducer, A [M, M] (NaN where a client has no row yet, 0 on the diagonal), the binary
    Ã [M, M] and, with `num_clusters` > 0, Ward cluster labels (−1 for clients without a row)."""

    num_clients: int
    gamma: float
    distance_mode: str
    num_clusters: int
    centroids: dict[int, np.ndarray]
    points: dict[int, np.ndarray]
    reducer: Any
    distance: np.ndarray
    adjacency: np.ndarray
    clusters: np.ndarray | None
    seconds: dict[str, float] = field(default_factory=dict)
    contrast: float | None = None  # `structure_contrast` of the thresholded Ã (None: undefined)
    complete: bool = False  # no structure found: every placed client is every other's neighbour
    test: StructureTest | None = None  # `structure_test` of Ã (None: not run, flt.no-structure=keep)
    evidence: bool = False  # γ is `evidence_cut`'s (flt.threshold=evidence): re-chosen on a retest

    def retest(self, confidence: float) -> bool:
        """Run the structure test again over every placed client (clients placed after FCR bring
        their codes and edges: more evidence) and set `complete` from it; True when it changed.
        Where the cut came from the evidence, it is chosen again first (γ and Ã may move)."""
        placed = self.placed
        if len(placed) < 2:
            return False
        codes = np.stack([self.centroids[c].mean(axis=0) for c in placed])
        recut = False
        if self.evidence:
            gamma, self.test = _evidence_gamma(codes, self.distance[np.ix_(placed, placed)])
            recut = gamma != self.gamma
            self.gamma = gamma
            self.adjacency = threshold_adjacency(self.distance, gamma)
        else:
            self.test = structure_test(codes, self.adjacency[np.ix_(placed, placed)])
        complete = not self.test.structured(confidence)
        changed = complete != self.complete or (recut and not complete)
        self.complete = complete
        if recut and self.clusters is not None:  # Ward's clusters of the old Ã: cut again below
            self.clusters = None
        if not complete and self.num_clusters > 0 and self.clusters is None:  # Ward's cut, now due
            self.clusters = np.full(self.num_clients, -1, dtype=np.int64)
            self.clusters[placed] = ward_clusters(self.adjacency[np.ix_(placed, placed)],
                                                  self.num_clusters)
        return changed

    @property
    def placed(self) -> list[int]:
        """Clients that have a row (answered FCR or were placed later), in client order."""
        return sorted(self.centroids)

    def aggregation_graph(self) -> np.ndarray:
        """The graph the models are averaged over: Ã, or with clusters Ã_ij = 1[c_i = c_j] (spec §2);
        a client without a row keeps a self-only row either way. With no structure found
        (`complete`), Ã links every placed client, so the average is FedAvg's over the placed ones."""
        if self.complete:
            graph = np.eye(self.num_clients, dtype=np.float32)
            placed = self.placed
            graph[np.ix_(placed, placed)] = 1.0
            return graph
        if self.clusters is None:
            return self.adjacency
        graph = cluster_adjacency(self.clusters)
        unplaced = self.clusters < 0
        graph[unplaced, :] = 0.0
        graph[:, unplaced] = 0.0
        graph[np.diag_indices(self.num_clients)] = 1.0
        return graph

    def stacked(self, clients: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """UMAP points of `clients`' centroids, stacked client after client, and the set sizes."""
        if not clients:
            return np.empty((0, 2)), np.empty(0, dtype=np.int64)
        return (np.concatenate([self.points[c] for c in clients]),
                np.array([len(self.points[c]) for c in clients], dtype=np.int64))


def relative_threshold(distance: np.ndarray, fraction: float) -> float:
    """γ = `fraction` × the median distance between two different clients (NaN entries ignored):
    a threshold in the embedding's own scale. Most client pairs are unrelated wherever there is
    structure to find, so the median is the typical unrelated distance; UMAP's absolute scale varies
    several-fold between data sets (median 2.4 on MNIST shards, 9.8 on rotated domains)."""
    distance = np.asarray(distance, dtype=np.float64)
    pairs = distance[~np.eye(len(distance), dtype=bool)]
    pairs = pairs[np.isfinite(pairs)]
    if pairs.size == 0:
        return 0.0
    return float(fraction * np.median(pairs))


def form_client_relatedness(
    centroids: dict[int, np.ndarray], num_clients: int, *, gamma: float, distance: str = "matching",
    clusters: int = 0, umap_neighbors: int = 15, relative_gamma: float | None = None,
    structure_confidence: float | None = None, evidence: bool = False,
) -> Relatedness:
    """Server side of FCR (spec §2–3): UMAP over all centroids → A (matching or min-pair distance
    between clients' embedded centroid sets) → Ã = 1[A < γ] with self-loops → optional Ward clusters.
    `centroids` maps client id → its uploaded [k_m, e] centroids; others get self-only rows. With
    `relative_gamma`, γ = relative_gamma × the median of A (`relative_threshold`) instead of `gamma`;
    the γ used is kept in `Relatedness.gamma` (late clients are placed against it). With
    `evidence`, γ is `evidence_cut`'s: the cut whose groups a federation without them would be the
    least likely to show, and its test (which pays for the choice) is the structure test below.

    With `structure_confidence`, Ã must pass the structure test (`structure_test` on the clients'
    mean latent codes): its edges must be closer, relative to its non-edges, than a federation
    without groups of the same size and spread would show them with probability 1 −
    `structure_confidence`. A graph that fails it, or has no edge, is replaced by the complete graph
    over the placed clients (`Relatedness.complete`): without groups in the data, FedAvg's average
    is the neighbourhood every client shares. `structure_contrast` (between centroid sets) is
    reported either way."""
    clients = sorted(centroids)
    sizes = np.array([len(centroids[c]) for c in clients], dtype=np.int64)
    seconds: dict[str, float] = {}

    latent = np.concatenate([centroids[c] for c in clients])  # [Σk, e], client after client
    started = time.perf_counter()
    embedding, reducer = umap_embed(latent, seed=UMAP_SEED, max_neighbors=umap_neighbors)
    seconds["umap"] = time.perf_counter() - started
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    points = {c: embedding[offsets[i]:offsets[i + 1]] for i, c in enumerate(clients)}

    started = time.perf_counter()
    distances = np.full((num_clients, num_clients), np.nan)
    distances[np.ix_(clients, clients)] = set_distances(embedding, sizes, embedding, sizes, distance)
    np.fill_diagonal(distances, 0.0)
    seconds["distance"] = time.perf_counter() - started

    started = time.perf_counter()
    codes = np.stack([centroids[c].mean(axis=0) for c in clients])
    cut_test = None
    if evidence:
        gamma, cut_test = _evidence_gamma(codes, distances[np.ix_(clients, clients)])
    elif relative_gamma is not None:
        gamma = relative_threshold(distances, relative_gamma)
    adjacency = threshold_adjacency(distances, gamma)
    seconds["threshold"] = time.perf_counter() - started

    started = time.perf_counter()
    graph = adjacency[np.ix_(clients, clients)]
    contrast = structure_contrast(set_distances(latent, sizes, latent, sizes, distance), graph)
    test = None
    complete = False
    if structure_confidence is not None and len(clients) > 1:
        test = cut_test if evidence else structure_test(codes, graph)
        complete = not test.structured(structure_confidence)
    seconds["structure-check"] = time.perf_counter() - started

    labels = None
    if clusters > 0 and not complete:
        started = time.perf_counter()
        labels = np.full(num_clients, -1, dtype=np.int64)
        labels[clients] = ward_clusters(adjacency[np.ix_(clients, clients)], clusters)
        seconds["clustering"] = time.perf_counter() - started
    seconds["server-total"] = sum(seconds.values())
    return Relatedness(num_clients, gamma, distance, clusters, dict(centroids), points, reducer,
                       distances, adjacency, labels, seconds, contrast, complete, test, evidence)


def place_client(relatedness: Relatedness, client: int, centroids: np.ndarray) -> None:
    """Give a client that answered after FCR its row and column (spec §3, §6.3 [D]): embed its
    centroids with the fitted UMAP's `transform`, measure its distance to every placed client, and
    threshold. With clusters it joins the cluster holding most of its Ã-neighbours (none: the cluster
    of its nearest client). Under a complete graph (no structure found) it joins every client."""
    rel = relatedness
    others = [c for c in rel.placed if c != client]
    own = umap_place(rel.reducer, centroids)
    rel.centroids[client] = np.asarray(centroids)
    rel.points[client] = own
    if not others:
        return
    points, sizes = rel.stacked(others)
    row = set_distances(own, [len(own)], points, sizes, rel.distance_mode)[0]
    rel.distance[client, others] = row
    rel.distance[others, client] = row
    rel.distance[client, client] = 0.0
    edges = (row < rel.gamma).astype(np.float32)
    rel.adjacency[client, others] = edges
    rel.adjacency[others, client] = edges
    rel.adjacency[client, client] = 1.0
    if rel.clusters is not None:
        member = rel.clusters[others]
        known = member >= 0
        if known.any():
            votes = np.bincount(member[known], weights=edges[known])
            nearest = member[known][np.argmin(row[known])]
            rel.clusters[client] = int(np.argmax(votes)) if votes.max() > 0 else int(nearest)


# --- the strategy ---------------------------------------------------------------------------------
