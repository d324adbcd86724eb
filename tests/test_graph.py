"""Graph math (strategies/shared/graph.py): FLT's distances, threshold, Ward clusters, neighbourhood averaging
(spec flt §7 unit tests: Ã = 11ᵀ is FedAvg, Ã = I is local training, matching = brute force)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.cluster.hierarchy import fcluster, linkage

from strategies.shared.graph import (
    fresh_graph,
    share_inside_groups,
    structure_share,
    uniform_share,
)
from strategies.shared.priors import true_structure
from strategies.methods.flt.neighbourhood import (
    NeighbourhoodModels,
    neighbourhood_average,
    neighbourhood_weights,
)
from strategies.shared.personalized import weighted_mean
from strategies.methods.flt.relatedness import (
    adjusted_rand,
    cluster_adjacency,
    connected_components,
    threshold_adjacency,
    umap_embed,
    umap_place,
    ward_clusters,
)
from strategies.methods.flt.set_distance import set_distances


def matching_distance(a: np.ndarray, b: np.ndarray) -> float:
    """[C] matching distance of two sets [k_i, d], [k_j, d] by the Hungarian assignment."""
    from scipy.optimize import linear_sum_assignment

    small, big = (a, b) if len(a) <= len(b) else (b, a)
    sq = ((np.asarray(small, float)[:, None, :] - np.asarray(big, float)[None, :, :]) ** 2).sum(-1)
    r, c = linear_sum_assignment(sq)
    return float(np.sqrt(sq[r, c].sum()) / len(small))


def _brute_matching(a: np.ndarray, b: np.ndarray) -> float:
    """min over injective maps π of the smaller set into the larger, by enumeration (spec §2 [C])."""
    small, big = (a, b) if len(a) <= len(b) else (b, a)
    best = min(((small - big[list(p)]) ** 2).sum() for p in itertools.permutations(range(len(big)),
                                                                                   len(small)))
    return float(np.sqrt(best) / len(small))


def _random_sets(rng: np.random.Generator, count: int, max_k: int, dim: int):
    sizes = rng.integers(1, max_k + 1, size=count)
    points = rng.normal(size=(int(sizes.sum()), dim)) * rng.uniform(0.1, 3.0)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return points, sizes, [points[offsets[i]:offsets[i + 1]] for i in range(count)]


@pytest.mark.parametrize("seed", range(3))
def test_matching_distance_equals_brute_force_permutation_minimum(seed):
    rng = np.random.default_rng(seed)
    points, sizes, sets = _random_sets(rng, 25, max_k=4, dim=2 + seed)  # unequal sizes 1..4
    got = set_distances(points, sizes, points, sizes, "matching")
    expected = np.array([[_brute_matching(a, b) for b in sets] for a in sets])
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, got.T, atol=1e-12)
    assert np.all(np.diag(got) == 0.0)
    hungarian = np.array([[matching_distance(a, b) for b in sets] for a in sets])
    np.testing.assert_allclose(hungarian, expected, rtol=1e-12, atol=1e-12)
    # a cross block (a few sets against all) is the same sub-matrix
    block = set_distances(np.concatenate(sets[:3]), sizes[:3], points, sizes, "matching")
    np.testing.assert_allclose(block, expected[:3], rtol=1e-12, atol=1e-12)


def test_matching_distance_in_the_latent_space_takes_the_gram_form_and_agrees():
    """From GRAM_FROM_DIM dimensions on (FLT's latent centroids, e = 128) the squared distances come
    from one matrix product: the same distances as the brute-force minimum, to float64 rounding."""
    from strategies.methods.flt.set_distance import GRAM_FROM_DIM

    rng = np.random.default_rng(4)
    points, sizes, sets = _random_sets(rng, 20, max_k=3, dim=128)
    assert points.shape[1] >= GRAM_FROM_DIM
    got = set_distances(points, sizes, points, sizes, "matching")
    expected = np.array([[_brute_matching(a, b) for b in sets] for a in sets])
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-6)
    assert np.all(got >= 0.0)


def test_matching_distance_for_k_beyond_enumeration_uses_assignment():
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(7, 2)), rng.normal(size=(8, 2))  # 8P7 = 40320 maps: Hungarian per pair
    got = set_distances(np.concatenate([a, b]), [7, 8], np.concatenate([a, b]), [7, 8])
    assert got[0, 1] == pytest.approx(matching_distance(a, b), rel=1e-12)


def test_min_pair_distance_is_the_papers_formula():
    rng = np.random.default_rng(1)
    points, sizes, sets = _random_sets(rng, 20, max_k=4, dim=2)
    got = set_distances(points, sizes, points, sizes, "min-pair")
    expected = np.array([[min(np.linalg.norm(x - y) for x in a for y in b) for b in sets]
                         for a in sets])
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_unknown_distance_and_bad_sets_are_clear_errors():
    with pytest.raises(ValueError, match="unknown distance 'cosine'; allowed: matching, min-pair"):
        set_distances(np.zeros((2, 2)), [2], np.zeros((2, 2)), [2], "cosine")
    with pytest.raises(ValueError, match="sizes sum to 3 but there are 2 points"):
        set_distances(np.zeros((2, 2)), [3], np.zeros((2, 2)), [2])


def test_threshold_is_strict_with_self_loops_and_no_edge_for_unknown():
    distance = np.array([[0.0, 0.5, 1.0], [0.5, 0.0, np.nan], [1.0, np.nan, 0.0]])
    adjacency = threshold_adjacency(distance, gamma=1.0)
    np.testing.assert_array_equal(adjacency, [[1, 1, 0], [1, 1, 0], [0, 0, 1]])
    assert adjacency.dtype == np.float32


def test_ward_clusters_match_scipy_on_rows_and_recover_blocks():
    rng = np.random.default_rng(2)
    truth = np.repeat(np.arange(4), 6)
    adjacency = cluster_adjacency(truth)
    noise = rng.random(adjacency.shape) < 0.05  # a few wrong edges
    adjacency = np.maximum(adjacency, (noise | noise.T).astype(np.float32))
    labels = ward_clusters(adjacency, 4)
    assert adjusted_rand(labels, truth) == 1.0
    reference = fcluster(linkage(adjacency.astype(float), method="ward", metric="euclidean"), 4,
                         criterion="maxclust")
    assert adjusted_rand(labels, reference) == 1.0
    assert labels[0] == 0  # renumbered in order of first client


def test_connected_components_and_graph_quality_scores():
    adjacency = cluster_adjacency(np.array([0, 0, 1, 1, 1]))
    np.testing.assert_array_equal(connected_components(adjacency), [0, 0, 1, 1, 1])
    assert share_inside_groups(adjacency, np.array([0, 0, 1, 1, 1])) == 1.0
    assert share_inside_groups(adjacency, np.array([0, 1, 1, 1, 1])) == pytest.approx(6 / 8)
    assert share_inside_groups(np.eye(3), np.zeros(3)) is None


# --- aggregation: spec §7 -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_all_ones_graph_is_fedavg_in_every_row(dtype):
    rng = np.random.default_rng(3)
    rows = torch.from_numpy(rng.normal(size=(9, 50))).to(dtype)
    n = torch.tensor(rng.integers(1, 100, size=9), dtype=dtype)
    fedavg = weighted_mean(rows, n)  # the FedAvg rule Σ n_k θ_k / Σ n_k
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-6, atol=1e-6)
    for sparse in (False, True):
        out = neighbourhood_average(np.ones((9, 9)), n, rows, sparse=sparse)
        for row in out:
            torch.testing.assert_close(row, fedavg, **tol)
    models = NeighbourhoodModels(rows[0], 9)
    models.set_graph(np.ones((9, 9)))
    models.aggregate(rows, list(range(9)), n)
    assert models.num_models == 1  # one model shared by all: FedAvg
    torch.testing.assert_close(models.rows(), fedavg.expand(9, -1), **tol)


def test_identity_graph_leaves_every_row_unchanged():
    rng = np.random.default_rng(4)
    rows = torch.from_numpy(rng.normal(size=(7, 30)).astype(np.float32))
    n = torch.tensor(rng.integers(1, 100, size=7), dtype=torch.float32)
    assert torch.equal(neighbourhood_average(np.eye(7), n, rows), rows)
    assert torch.equal(neighbourhood_average(np.eye(7), n, rows, sparse=True), rows)
    models = NeighbourhoodModels(torch.zeros(30), 7)  # starts with Ã = I
    models.aggregate(rows, list(range(7)), n)
    assert torch.equal(models.rows(), rows)
    models.aggregate(rows * 2, [1, 4], n)  # stale rows are kept, trained rows taken as they are
    expected = rows.clone()
    expected[[1, 4]] = rows[[1, 4]] * 2
    assert torch.equal(models.rows(), expected)


def test_weights_are_sample_weighted_neighbourhood_means():
    adjacency = np.array([[1, 1, 0], [1, 1, 1], [0, 1, 1]], dtype=np.float32)
    weights = neighbourhood_weights(adjacency, np.array([1.0, 3.0, 0.0]))
    torch.testing.assert_close(weights, torch.tensor([[0.25, 0.75, 0.0], [0.25, 0.75, 0.0],
                                                      [0.0, 1.0, 0.0]]))
    empty = neighbourhood_weights(np.array([[1, 1], [1, 1]]), np.zeros(2))  # no examples known
    torch.testing.assert_close(empty, torch.full((2, 2), 0.5))


@pytest.mark.parametrize("sparse_below", [0.0, 1.1], ids=["dense", "sparse"])
@pytest.mark.parametrize("graph", ["random", "clusters"])
def test_grouped_models_follow_the_reference_rule_with_stale_clients(graph, sparse_below):
    """NeighbourhoodModels (distinct rows, two sparse products) = the formula on the full matrix,
    round after round, with partial participation (stale models enter the averages)."""
    rng = np.random.default_rng(6)
    m, p = 16, 40
    if graph == "random":
        adjacency = (rng.random((m, m)) < 0.3).astype(np.float32)
        adjacency = np.maximum(adjacency, adjacency.T)
        np.fill_diagonal(adjacency, 1.0)
    else:
        adjacency = cluster_adjacency(rng.integers(0, 3, size=m))
    n = torch.tensor(rng.integers(1, 60, size=m), dtype=torch.float32)
    initial = torch.from_numpy(rng.normal(size=p).astype(np.float32))
    models = NeighbourhoodModels(initial, m, sparse_below=sparse_below)
    reference = initial.expand(m, -1).clone()
    buffer = torch.full((m, p), float("nan"))  # rows of unsampled clients must never be read
    for step in range(5):
        if step == 2:
            models.set_graph(adjacency)  # FCR happens after two rounds of local training
        graph_now = adjacency if step >= 2 else np.eye(m)
        sampled = sorted(rng.choice(m, size=5, replace=False).tolist())
        trained = torch.from_numpy(rng.normal(size=(5, p)).astype(np.float32))
        buffer[sampled] = trained
        reference[sampled] = trained
        reference = neighbourhood_average(graph_now, n, reference)
        models.aggregate(buffer, sampled, n)
        torch.testing.assert_close(models.rows(), reference, rtol=1e-5, atol=1e-6)
    if graph == "clusters":
        assert models.num_models == len(np.unique(adjacency, axis=0))  # one model per cluster


# --- UMAP -----------------------------------------------------------------------------------------
def test_umap_is_deterministic_and_places_new_points_near_their_group():
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(3, 16)) * 10
    points = np.concatenate([c + rng.normal(size=(12, 16)) for c in centres]).astype(np.float32)
    first, reducer = umap_embed(points)
    second, _ = umap_embed(points)
    np.testing.assert_array_equal(first, second)
    groups = np.repeat(np.arange(3), 12)
    for exact_from in (4096, 0):  # UMAP's own exact path, and our exact neighbours + transform
        embedding, reducer = umap_embed(points, exact_knn_from=exact_from)
        new = umap_place(reducer, centres[[2]] + rng.normal(size=(1, 16)) * 0.5)
        nearest = np.argmin(np.linalg.norm(embedding - new, axis=1))
        assert groups[nearest] == 2
    with pytest.raises(ValueError, match="at least 3 centroids"):
        umap_embed(points[:2])


# --- fresh-only FLT step, fresh rows in SFL, graph quality against the true structure -------------
def test_a_fresh_only_step_is_the_mean_of_the_sampled_neighbours_and_keeps_the_rest():
    rng = np.random.default_rng(5)
    adjacency = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 1]], dtype=np.float32)
    held = torch.from_numpy(rng.normal(size=(4, 6)))
    models = NeighbourhoodModels(held[0], 4)
    models.aggregate(held, [0, 1, 2, 3], torch.ones(4, dtype=torch.float64))  # Ã = I: held rows
    models.set_graph(adjacency)
    trained = torch.from_numpy(rng.normal(size=(4, 6)))
    n = torch.tensor([1.0, 3.0, 2.0, 5.0], dtype=torch.float64)
    models.aggregate_fresh(trained, [1, 2], n)
    rows = models.rows()
    mean_12 = (3.0 * trained[1] + 2.0 * trained[2]) / 5.0
    torch.testing.assert_close(rows[0], trained[1])  # neighbours {0, 1}: only 1 was sampled
    torch.testing.assert_close(rows[1], mean_12)  # {0, 1, 2}: the mean of the sampled 1 and 2
    torch.testing.assert_close(rows[2], mean_12)
    torch.testing.assert_close(rows[3], held[3])  # no sampled neighbour: keeps its model
    stale = NeighbourhoodModels(held[0], 4)  # the spec's step reads client 0's held row too
    stale.aggregate(held, [0, 1, 2, 3], torch.ones(4, dtype=torch.float64))
    stale.set_graph(adjacency)
    stale.aggregate(trained, [1, 2], n)
    torch.testing.assert_close(stale.rows()[0], (held[0] + 3.0 * trained[1]) / 4.0)


def test_fresh_graph_zeroes_the_columns_of_untrained_rows_and_renormalises():
    a = torch.ones(3, 3)
    g = fresh_graph(a, torch.tensor([1.0, 0.0, 0.5]))
    torch.testing.assert_close(g, torch.tensor([[2 / 3, 0.0, 1 / 3]] * 3))
    lonely = fresh_graph(torch.eye(2), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(lonely, torch.eye(2))  # no weighted neighbour: a self-loop


class _Partition:
    def __init__(self, train_indices, cluster_ids=None):
        self.train_indices, self.cluster_ids = train_indices, cluster_ids
        self.label_graph = np.ones((len(train_indices),) * 2)


def test_true_structure_uses_clusters_then_label_histograms():
    labels = np.array([0, 0, 1, 1, 2, 2, 0, 1])
    parts = [np.array([0, 1]), np.array([2, 3]), np.array([6, 0]), np.array([4, 5])]
    truth, kind = true_structure(_Partition(parts, np.array([0, 0, 1, 1])), labels)
    assert kind == "true-clusters" and truth[0, 1] == 1 and truth[0, 2] == 0
    truth, kind = true_structure(_Partition(parts), labels)
    assert kind == "label-similarity"
    assert truth[0, 2] == pytest.approx(1.0) and truth[0, 1] == 0 and truth[0, 3] == 0
    graph = np.array([[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=float)
    assert structure_share(graph, truth) == pytest.approx(1.0)
    assert uniform_share(truth) == pytest.approx(2 / 12)
    assert structure_share(np.eye(4), truth) is None
    groups = np.array([0, 0, 1, 1])
    same = (groups[:, None] == groups[None, :]).astype(float)
    rng = np.random.default_rng(0)
    weights = rng.random((4, 4))
    assert structure_share(weights, same) == pytest.approx(share_inside_groups(weights, groups))
