"""FLT's aggregation at scale: neighbourhood sums shared along a spanning tree of Ã's distinct rows
(`strategies.methods.flt.neighbourhood_sums.SumTree`, used by `strategies.methods.flt.neighbourhood.NeighbourhoodModels`) equal the
plain formula W = D⁻¹(Ã diag(n))·V round after round, stale models included."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
import torch

from strategies.methods.flt.neighbourhood import NeighbourhoodModels, neighbourhood_average
from strategies.methods.flt.relatedness import cluster_adjacency
from strategies.methods.flt.neighbourhood_sums import SumTree


def near_block_graph(rng: np.random.Generator, sizes: list[int], flips: float) -> np.ndarray:
    """Symmetric binary graph with self-loops: cliques of `sizes`, then a share `flips` of the
    entries toggled (edges dropped inside blocks, added between them) — many distinct, similar rows."""
    m = sum(sizes)
    graph = cluster_adjacency(np.repeat(np.arange(len(sizes)), sizes))
    toggle = np.triu(rng.random((m, m)) < flips, 1)
    graph = np.abs(graph - (toggle | toggle.T)).astype(np.float32)
    np.fill_diagonal(graph, 1.0)
    return graph


def run_rounds(graph: np.ndarray, n: torch.Tensor, rounds: int, fraction: float,
               rng: np.random.Generator, dtype: torch.dtype = torch.float32, p: int = 64,
               **options) -> tuple[NeighbourhoodModels, torch.Tensor]:
    """`rounds` aggregations with a random sample of clients each; returns the models and the
    reference computed with the plain formula in float64 on the full matrix."""
    m = len(graph)
    initial = torch.from_numpy(rng.normal(size=p)).to(dtype)
    models = NeighbourhoodModels(initial, m, **options)
    models.set_graph(graph)
    reference = initial.to(torch.float64).expand(m, -1).clone()
    buffer = torch.full((m, p), float("nan"), dtype=dtype)  # unsampled rows must never be read
    for _ in range(rounds):
        sampled = sorted(rng.choice(m, size=max(1, int(fraction * m)), replace=False).tolist())
        trained = torch.from_numpy(rng.normal(size=(len(sampled), p)))
        buffer[sampled] = trained.to(dtype)
        reference[sampled] = trained.to(dtype).to(torch.float64)
        reference = neighbourhood_average(graph, n.to(torch.float64), reference)
        models.aggregate(buffer, sampled, n)
    return models, reference


def path_terms(tree: SumTree) -> np.ndarray:
    """Terms on every row's path from its root (plan order)."""
    per_row = np.bincount(tree.rows, minlength=len(tree.order))
    terms = np.zeros(len(tree.order), dtype=np.int64)
    parent = tree.parent.numpy()
    for r in range(len(terms)):
        terms[r] = per_row[r] + (terms[parent[r]] if parent[r] >= 0 else 0)
    return terms


@pytest.mark.parametrize("fraction", [1.0, 0.2])
def test_shared_sums_equal_the_formula_on_a_near_block_graph(fraction):
    rng = np.random.default_rng(11)
    graph = near_block_graph(rng, [70, 50, 40], flips=0.02)
    n = torch.tensor(rng.integers(5, 60, size=len(graph)), dtype=torch.float32)
    models, reference = run_rounds(graph, n, rounds=4, fraction=fraction, rng=rng, p=300)
    tree = models.tree
    assert len(tree.order) > 100  # nearly every row is distinct
    assert tree.terms < tree.direct_terms / 4  # and the tree shares most terms
    assert len(tree.levels) > 3  # rows built on rows built on rows
    torch.testing.assert_close(models.rows().to(torch.float64), reference, rtol=1e-5, atol=1e-6)


def test_shared_and_direct_sums_agree_and_float64_is_exact():
    rng = np.random.default_rng(12)
    graph = near_block_graph(rng, [30, 30], flips=0.03)
    n = torch.tensor(rng.integers(1, 40, size=len(graph)), dtype=torch.float64)
    shared, reference = run_rounds(graph, n, 3, 0.5, np.random.default_rng(1), torch.float64)
    direct, _ = run_rounds(graph, n, 3, 0.5, np.random.default_rng(1), torch.float64,
                           share_sums=False)
    assert len(direct.tree.levels) == 1 and direct.tree.terms == direct.tree.direct_terms
    assert shared.tree.terms < direct.tree.terms
    torch.testing.assert_close(shared.rows(), reference, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(direct.rows(), reference, rtol=1e-12, atol=1e-12)


def test_deep_chain_of_rows_stays_accurate_and_paths_are_bounded():
    """Sliding-window rows (row i = clients i..i+w): every row differs from the next in 2 columns, so
    the tree is one long path; float32 error stays small, and `max_path_terms` re-roots rows."""
    m, w = 400, 30
    graph = np.zeros((m, m), dtype=np.float32)
    for i in range(m):
        graph[i, max(0, i - w):i + w + 1] = 1.0
    rng = np.random.default_rng(13)
    n = torch.tensor(rng.integers(5, 60, size=m), dtype=torch.float32)
    models, reference = run_rounds(graph, n, 2, 0.3, rng, p=200)
    tree = models.tree
    assert len(tree.levels) > 20  # a deep tree
    assert path_terms(tree).max() <= 2 * graph.sum(axis=1).max()  # the default bound
    torch.testing.assert_close(models.rows().to(torch.float64), reference, rtol=1e-5, atol=1e-6)
    bounded, reference = run_rounds(graph, n, 2, 0.3, np.random.default_rng(14), p=50,
                                    max_path_terms=80)
    assert path_terms(bounded.tree).max() <= 80
    assert len(bounded.tree.levels) < len(tree.levels)
    torch.testing.assert_close(bounded.rows().to(torch.float64), reference, rtol=1e-5, atol=1e-6)


def test_plan_is_the_cheapest_tree_on_small_graphs():
    """Brute force over every assignment of parents (or direct) to 5 distinct rows: the plan's cost
    (its terms + one write per row: the parent's copy, or zeros under a direct sum) is the minimum
    over all valid forests."""
    rng = np.random.default_rng(15)
    for _ in range(20):
        rows = np.unique((rng.random((5, 9)) < 0.6).astype(np.int8), axis=0)
        rows = rows[rows.sum(axis=1) > 0]
        u = len(rows)
        hamming = np.abs(rows[:, None, :] - rows[None, :, :]).sum(axis=2)
        degree = rows.sum(axis=1)
        best = np.inf
        for parents in itertools.product(range(-1, u), repeat=u):
            if any(p == r for r, p in enumerate(parents)) or not _is_forest(parents):
                continue
            best = min(best, sum((degree[r] if p < 0 else hamming[r, p]) + 1
                                 for r, p in enumerate(parents)))
        tree = SumTree.plan(rows, max_path_terms=10 ** 6)
        cost = tree.terms + u
        assert cost == best


def _is_forest(parents: tuple[int, ...]) -> bool:
    for start in range(len(parents)):
        seen, node = set(), start
        while node >= 0:
            if node in seen:
                return False
            seen.add(node)
            node = parents[node]
    return True


def test_disjoint_clusters_and_identity_are_computed_directly():
    """The cost model keeps one direct product per distinct row where rows share nothing."""
    for graph in (cluster_adjacency(np.repeat(np.arange(4), 5)), np.eye(12)):
        tree = SumTree.plan(np.unique(graph, axis=0))
        assert len(tree.levels) == 1 and tree.terms == tree.direct_terms
        assert (tree.parent < 0).all()


def test_neighbourhoods_without_examples_get_the_plain_mean():
    """Round 1 at partial participation: rows whose neighbours never reported n_j fall back to the
    unweighted mean of their (held) models, as `neighbourhood_weights` does."""
    rng = np.random.default_rng(16)
    graph = near_block_graph(rng, [20, 20], flips=0.05)
    m, p = len(graph), 30
    held = torch.from_numpy(rng.normal(size=(m, p)).astype(np.float32))
    models = NeighbourhoodModels(torch.zeros(p), m)
    n = torch.ones(m)
    models.aggregate(held, list(range(m)), n)  # Ã = I: every client holds its own row
    models.set_graph(graph)
    n = torch.zeros(m)
    n[:3] = 10.0  # only three clients (all in the first block) have reported examples
    buffer = torch.full((m, p), float("nan"))
    buffer[:3] = held[:3] + 1.0
    reference = held.clone().to(torch.float64)
    reference[:3] += 1.0
    reference = neighbourhood_average(graph, n.to(torch.float64), reference)
    models.aggregate(buffer, [0, 1, 2], n)
    assert (torch.from_numpy(graph) @ n == 0).any()  # some rows have no examples at all
    torch.testing.assert_close(models.rows().to(torch.float64), reference, rtol=1e-5, atol=1e-6)


def test_checkpoints_leave_the_spare_buffer_out():
    rng = np.random.default_rng(17)
    graph = near_block_graph(rng, [10, 10], flips=0.05)
    n = torch.ones(20)
    models, reference = run_rounds(graph, n, 2, 1.0, rng, p=40)
    assert models._spare is not None
    restored = pickle.loads(pickle.dumps(models))
    assert restored._spare is None
    torch.testing.assert_close(restored.rows(), models.rows())
    buffer = torch.from_numpy(rng.normal(size=(20, 40)).astype(np.float32))
    models.aggregate(buffer, list(range(20)), n)
    restored.aggregate(buffer, list(range(20)), n)
    torch.testing.assert_close(restored.rows(), models.rows())
