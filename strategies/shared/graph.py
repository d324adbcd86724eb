"""The small graph core shared by the graph-aware methods: row normalisation, top-k graphs, pairwise
row distances, the fresh-row restriction of a graph, the display order of a graph's groups, and
graph-quality scores against the true client structure (share of weight inside it; the structure
itself is `strategies.shared.priors.true_structure`)."""

from __future__ import annotations

import numpy as np
import torch
from scipy.sparse import csr_matrix


def share_inside_groups(adjacency: np.ndarray, groups: np.ndarray) -> float | None:
    """`structure_share` of a graph with non-negative weights against true groups: the share of its
    off-diagonal edge weight that joins clients of the same group (None without such an edge)."""
    groups = np.asarray(groups)
    return structure_share(adjacency, groups[:, None] == groups[None, :])


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


def top_k_per_row(matrix: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest entries of every row, zero the rest (spec §2 (5) export, [C] `eval`)."""
    k = max(0, min(int(k), matrix.shape[1]))
    if k == 0:
        return torch.zeros_like(matrix)
    values, index = matrix.topk(k, dim=1)
    return torch.zeros_like(matrix).scatter_(1, index, values)


def pairwise_row_distances(rows: torch.Tensor) -> torch.Tensor:
    """Dist_ij = ||v_i − v_j||_2 [N, N] (float64) of parameter rows (spec §2 (5)), from one Gram
    product of the centred rows (centring keeps float32 cancellation small)."""
    centred = rows - rows.mean(dim=0, keepdim=True)
    gram = (centred @ centred.T).to(torch.float64)
    norms = gram.diagonal()
    squared = (norms[:, None] + norms[None, :] - 2.0 * gram).clamp_min(0.0)
    squared.fill_diagonal_(0.0)
    return squared.sqrt()


def graph_display_order(reference: np.ndarray | None) -> np.ndarray | None:
    """Clients in reverse Cuthill–McKee order of a reference graph, so its groups show as blocks in
    a heatmap (None without a reference)."""
    if reference is None:
        return None
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    return np.asarray(reverse_cuthill_mckee(csr_matrix(np.asarray(reference) > 0),
                                            symmetric_mode=True))
