"""FLT's cut from the evidence (`flt.threshold=evidence`, strategies/methods/flt/relatedness.py
`evidence_cut`): Ã links the closest pairs of A up to the cut whose groups a federation without groups
would be the least likely to show, and that graph is kept only when its p-value, which pays for
choosing the cut, is within the stated confidence."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.methods.flt.relatedness import (_log_prefix_contrasts, _prefix_lower_medians,
                                                evidence_cut, structure_test, threshold_adjacency)
from tests.test_flt_structure_test import _noise


def _distances(codes: np.ndarray, rng, jitter: float = 0.0) -> np.ndarray:
    """A stand-in for FCR's A: the codes' distances, each pair perturbed (UMAP's own noise)."""
    d = np.linalg.norm(codes[:, None] - codes[None], axis=-1)
    noise = rng.normal(size=d.shape) * jitter * np.median(d)
    d = d + (noise + noise.T) / 2
    np.fill_diagonal(d, 0.0)
    return np.maximum(d, 0.0)


def test_prefix_medians_are_the_lower_medians_of_every_prefix():
    values = np.random.default_rng(0).normal(size=101)
    want = [np.sort(values[: i + 1])[i // 2] for i in range(len(values))]
    np.testing.assert_array_equal(_prefix_lower_medians(values), want)
    contrasts = _log_prefix_contrasts(values ** 2)
    for s in (1, 2, 50, 100):
        head, tail = np.sort(values[:s] ** 2), np.sort(values[s:] ** 2)
        assert contrasts[s - 1] == pytest.approx(np.log(head[(s - 1) // 2] / tail[(len(tail) - 1) // 2]))


@pytest.mark.parametrize("groups, size", [(3, 3), (4, 5), (5, 4), (2, 10), (5, 2)])
def test_planted_groups_are_cut_inside_their_boundary_and_kept(groups, size):
    """Groups whose means differ by several noise widths, A a noisy copy of their distances: every
    linked pair is inside a group, most pairs inside a group are linked, and p is at the smallest
    step, whatever the number and size of the groups (a fixed fraction of the median distance links
    no pair of 3 groups of 3, or every pair of 2 groups of 10)."""
    rng = np.random.default_rng(groups * 10 + size)
    label = np.repeat(np.arange(groups), size)
    codes = rng.normal(size=(groups, 64))[label] * 0.5 + _noise(rng, groups * size)
    distance = _distances(codes, rng, jitter=0.02)
    cut = evidence_cut(codes, distance)
    linked = threshold_adjacency(distance, cut.gamma) > 0
    same = label[:, None] == label[None]
    assert not linked[~same].any()
    inside = groups * size * (size - 1) // 2
    assert cut.pairs == (linked.sum() - len(codes)) // 2 and 0.8 * inside <= cut.pairs <= inside
    assert cut.test.p == pytest.approx(1 / 200) and cut.test.structured(0.95)


def test_without_groups_the_cut_is_not_kept_beyond_the_stated_rate():
    """Over 30 federations without groups (10 to 40 clients), the chosen cut passes at 95 % in at most
    5 % of them (the p-value compares the best cut with each null federation's best cut)."""
    rng = np.random.default_rng(3)
    kept = 0
    for trial in range(30):
        codes = _noise(rng, int(rng.integers(10, 41)))
        cut = evidence_cut(codes, _distances(codes, rng, jitter=0.05), draws=99, seed=trial)
        kept += cut.test.structured(0.95)
    assert kept <= 2


def test_the_cut_is_deterministic_and_needs_three_clients():
    rng = np.random.default_rng(4)
    codes = _noise(rng, 12)
    distance = _distances(codes, rng, 0.1)
    assert evidence_cut(codes, distance) == evidence_cut(codes, distance)
    assert evidence_cut(codes[:2], distance[:2, :2]) is None


def test_its_p_value_pays_for_the_choice():
    """The same graph tested alone (`structure_test`) gets a p at most the cut's: choosing the best
    of many cuts is corrected for, not ignored."""
    rng = np.random.default_rng(5)
    label = np.repeat(np.arange(2), 6)
    codes = rng.normal(size=(2, 16))[label] * 0.12 + rng.normal(size=(12, 16)) * 0.1
    distance = _distances(codes, rng, 0.05)
    cut = evidence_cut(codes, distance)
    alone = structure_test(codes, threshold_adjacency(distance, cut.gamma))
    assert alone.p <= cut.test.p


def test_fcr_with_the_evidence_cut_and_its_revision_when_late_clients_arrive():
    """FCR over 6 clients of 3 groups already finds the pairs; over 2 clients there is nothing to
    test (the complete graph) until the other 22 are placed: then the cut is chosen again over all
    24, the groups are found and kept (every edge inside a group), and the same evidence gives the
    same answer."""
    import warnings

    from strategies.methods.flt.relatedness import form_client_relatedness, place_client

    warnings.filterwarnings("ignore")
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(3, 2, 16)) * 8
    centroids = {g * 8 + i: (centres[g] + rng.normal(size=(2, 16)) * 0.3).astype(np.float32)
                 for g in range(3) for i in range(8)}
    group = np.arange(24) // 8
    six = form_client_relatedness({c: centroids[c] for c in (0, 1, 8, 9, 16, 17)}, 24, gamma=1.0,
                                  structure_confidence=0.95, evidence=True)
    graph = six.aggregation_graph() > 0
    assert not six.complete and graph[0, 1] and graph[8, 9] and graph[16, 17]
    assert graph[group[:, None] != group[None]].sum() == 0

    rel = form_client_relatedness({c: centroids[c] for c in (0, 8)}, 24, gamma=1.0,
                                  structure_confidence=0.95, evidence=True)
    assert rel.evidence and rel.complete and rel.gamma == 0.0
    for client in sorted(set(centroids) - {0, 8}):
        place_client(rel, client, centroids[client])
    assert rel.retest(0.95) and not rel.complete and rel.test.p <= 0.05
    graph = rel.aggregation_graph() > 0
    assert graph[group[:, None] != group[None]].sum() == 0 and graph.sum() > 24
    gamma = rel.gamma
    assert not rel.retest(0.95) and rel.gamma == gamma


@pytest.mark.federation
def test_an_flt_run_cuts_from_the_evidence_inside_small_groups(tmp_path):
    """Digits, 3 label clusters of 3 clients (where 0.05 × the median distance linked no pair in
    `benchmarks/results/flt-thresholds.md`): the evidence cut links every client to both others of
    its cluster and to no one else, and the structure test keeps the graph."""
    from server_app.harness.simulate import simulate

    flt = simulate({"dataset": "digits", "model": "mclr", "num-clients": 9,
                    "partition": "label-clusters", "num-clusters": 3, "labels-per-cluster": 2,
                    "max-samples-per-client": 200, "method": "flt", "num-rounds": 1,
                    "finetune-epochs": 0, "checkpoint-every": 0, "output-dir": str(tmp_path),
                    "run-name": "evidence", "flt.threshold": "evidence"})["flt"]
    assert flt["edges"] == 9 and not flt["complete-graph"]
    assert flt["edges-inside-true-clusters"] == 1.0 and flt["structure-p"] <= 0.05
