"""FLT's structure test (strategies/methods/flt/relatedness.py `structure_test`): a found graph is kept
when its edges are closer, relative to its non-edges, than a federation without groups of the same
size and spread would show them, at the stated confidence; otherwise FLT averages over every client."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.methods.flt.relatedness import StructureTest, structure_test
from strategies.methods.flt.settings import FLTSection


def _nearest_graph(codes: np.ndarray, edges: int) -> np.ndarray:
    """The `edges` closest pairs of `codes`, with self-loops: the most favourable graph for a
    federation without groups."""
    d = np.linalg.norm(codes[:, None] - codes[None], axis=-1)
    upper = np.triu_indices(len(codes), k=1)
    order = np.argsort(d[upper])[:edges]
    graph = np.eye(len(codes))
    graph[upper[0][order], upper[1][order]] = 1.0
    return np.maximum(graph, graph.T)


def _noise(rng, clients: int, dim: int = 64) -> np.ndarray:
    """Clients' mean codes without groups: one mean plus sampling noise whose covariance is
    anisotropic (like an encoder's) and whose scale shrinks with each client's sample count."""
    samples = rng.integers(30, 600, size=clients)
    return 2.0 + rng.normal(size=(clients, dim)) * np.linspace(3.0, 0.1, dim) / np.sqrt(samples)[:, None]


def test_groups_are_kept_and_noise_is_not():
    """Structured codes (4 groups whose means differ by several noise widths) with the group graph:
    p at the smallest step, kept at 95 %. Unstructured codes with their closest pairs linked (the
    graph a threshold draws from noise): p well above 5 %, the complete graph."""
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(4), 5)
    centres = rng.normal(size=(4, 64)) * 0.5
    codes = centres[groups] + _noise(rng, 20)
    result = structure_test(codes, (groups[:, None] == groups[None]).astype(float))
    assert result.p == pytest.approx(1 / 200) and result.contrast < 0.5
    assert result.structured(0.95)

    flat = _noise(rng, 20)
    result = structure_test(flat, _nearest_graph(flat, 20))
    assert result.p > 0.2 and not result.structured(0.95)


def test_false_keeps_without_groups_stay_below_the_stated_rate():
    """Over 40 federations without groups (10 to 50 clients, the closest tenth of the pairs linked),
    the test keeps a graph at 95 % confidence in at most 5 % of them (it is conservative: the null's
    graph is its closest pairs)."""
    rng = np.random.default_rng(1)
    kept = 0
    for trial in range(40):
        clients = int(rng.integers(10, 51))
        codes = _noise(rng, clients)
        graph = _nearest_graph(codes, max(1, clients * (clients - 1) // 20))
        kept += structure_test(codes, graph, draws=99, seed=trial).structured(0.95)
    assert kept <= 2


def test_a_graph_with_no_edge_or_no_non_edge_is_not_structure():
    codes = np.random.default_rng(2).normal(size=(8, 4))
    for graph in (np.eye(8), np.ones((8, 8))):
        result = structure_test(codes, graph)
        assert result == StructureTest(None, None, result.draws) and not result.structured(0.95)


def test_the_decision_follows_the_confidence_level():
    """Weak groups give an intermediate p: kept at a confidence below 1 − p, not above; the default
    confidence is 95 %."""
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(2), 6)
    codes = rng.normal(size=(2, 16))[groups] * 0.15 + rng.normal(size=(12, 16)) * 0.1
    result = structure_test(codes, (groups[:, None] == groups[None]).astype(float))
    assert 0.02 < result.p < 0.5
    assert result.structured(1.0 - result.p) and not result.structured(1.0 - result.p + 0.01)
    assert FLTSection().structure_confidence == 0.95
    assert structure_test(codes, (groups[:, None] == groups[None]).astype(float)) == result


def test_above_the_client_cap_the_test_runs_on_a_seeded_sample(monkeypatch):
    """With more clients than `TEST_CLIENTS`, the test samples that many (seeded): groups are still
    found, noise still is not, and the answer is the same on a second call."""
    import strategies.methods.flt.relatedness as relatedness

    monkeypatch.setattr(relatedness, "TEST_CLIENTS", 24)
    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(6), 10)
    codes = rng.normal(size=(6, 64))[groups] * 0.5 + _noise(rng, 60)
    graph = (groups[:, None] == groups[None]).astype(float)
    result = relatedness.structure_test(codes, graph)
    assert result.structured(0.95) and relatedness.structure_test(codes, graph) == result
    flat = _noise(rng, 60)
    assert not relatedness.structure_test(flat, _nearest_graph(flat, 60)).structured(0.95)


def test_the_decision_is_revisited_when_late_clients_are_placed():
    """FCR over 6 clients of 3 groups links no pair (nothing to test: the complete graph); once the
    other 18 clients are placed, their edges are tested over all 24 and the groups are kept: the
    aggregation graph becomes Ã."""
    import warnings

    from strategies.methods.flt.relatedness import form_client_relatedness, place_client

    warnings.filterwarnings("ignore")
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(3, 2, 16)) * 8
    centroids = {g * 8 + i: (centres[g] + rng.normal(size=(2, 16)) * 0.3).astype(np.float32)
                 for g in range(3) for i in range(8)}
    first = {c: centroids[c] for c in (0, 1, 8, 9, 16, 17)}
    rel = form_client_relatedness(first, 24, gamma=1.0, relative_gamma=0.2,
                                  structure_confidence=0.95)
    assert rel.complete and rel.test.p is None
    for client in sorted(set(centroids) - set(first)):
        place_client(rel, client, centroids[client])
    assert rel.retest(0.95) and not rel.complete and rel.test.p <= 0.05
    np.testing.assert_array_equal(rel.aggregation_graph(), rel.adjacency)
    assert not rel.retest(0.95)  # the same evidence: the same decision
