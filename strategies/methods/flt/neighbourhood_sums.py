"""Neighbourhood sums over the distinct rows of a fixed binary graph, shared along a spanning tree.

FLT's aggregation (docs/methods/flt.md; the reference code's `comm/fedavg.py`) gives the clients of a distinct row r
of Ã the model w_r = S_r / D_r with S_r = Σ_{j∈N_r} n_j v_j and D_r = Σ_{j∈N_r} n_j. Computed row by
row that is |N_r| row-axpys per row, nnz(Ã's distinct rows) in all. Ã is fixed after the one-shot FCR,
so its structure is analysed once (`SumTree.plan`): rows of a nearly block-diagonal Ã differ in a few
columns, and a row's sum follows from a similar row's,

    S_c = S_p + Σ_{j ∈ N_c∖N_p} n_j v_j − Σ_{j ∈ N_p∖N_c} n_j v_j,

at |N_c △ N_p| row-axpys and one row copy. The plan is the minimum spanning tree of the distinct rows
plus a virtual root: the edge between two rows weighs their Hamming distance + 1 (the axpys and the
copy), the edge from the virtual root to row r weighs |N_r| + 1 (S_r computed directly). The MST is
the cheapest plan of this kind, and never costlier than one direct product per distinct row — the plan
in which every row hangs from the virtual root, which it keeps where that is cheaper (e.g. disjoint
clusters, whose rows share nothing).

Scaling: a row of a tree rooted at ρ holds X_r = S_r / D_ρ, and its model is w_r = (D_ρ / D_r)·X_r. A
root therefore holds its model computed with the normalised weights n_j / D_ρ of the direct formula
(so Ã = 11ᵀ gives the FedAvg mean and Ã = I the clients' own models exactly), and no row is rescaled
in the round; the scale D_ρ / D_r is applied when a model is read.

Rounding: every term on a row's path from its root adds one rounding error of the same size as a term
of a direct sum. A row whose path would exceed `max_path_terms` terms (default: twice the largest
degree) is computed directly instead, so no model carries more rounded terms than twice the densest
direct row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse import coo_matrix, csr_matrix
from scipy.sparse.csgraph import breadth_first_order, minimum_spanning_tree


@dataclass
class SumTree:
    """How to compute the neighbourhood sums of u distinct rows of a binary [u, M] graph, rows in
    plan order (`order` maps a plan position to the row it was given as): level 0 holds the rows
    computed directly (the roots), level ℓ > 0 rows whose parent lies in an earlier level. Row r's
    terms are the entries of Δ_r = N_r − N_parent(r) (N_r for a root): `rows`, `columns`, `signs`,
    sorted by row, then column."""

    order: np.ndarray  # [u] plan position -> index of the row as given
    parent: torch.Tensor  # [u] plan position of the parent, -1 for a root
    root: np.ndarray  # [u] plan position of the row's root
    levels: list[tuple[int, int]]  # plan-position ranges, level by level
    rows: np.ndarray  # [e] entries of Δ: plan position of the row
    columns: np.ndarray  # [e] client (column of the graph)
    signs: np.ndarray  # [e] +1 or -1
    graph: csr_matrix  # [u, M] the distinct rows in plan order

    @classmethod
    def plan(cls, distinct: np.ndarray, share: bool = True,
             max_path_terms: int | None = None) -> SumTree:
        """Plan the sums of the binary rows `distinct` [u, M] (pairwise different). `share=False`
        computes every row directly (no tree); `max_path_terms` bounds the terms on a row's path
        from its root (default 2 × the largest degree)."""
        distinct = np.asarray(distinct) != 0
        u = distinct.shape[0]
        degree = distinct.sum(axis=1).astype(np.int64)
        parent, hamming = (_spanning_tree(distinct, degree) if share and u > 1
                           else (np.full(u, -1), degree))
        cap = int(2 * degree.max()) if max_path_terms is None else int(max_path_terms)
        depth = _bound_paths(parent, degree, hamming, cap)
        order = np.argsort(depth, kind="stable")  # parents before children
        position = np.empty(u, dtype=np.int64)
        position[order] = np.arange(u)
        parent_pos = np.where(parent[order] >= 0, position[np.maximum(parent[order], 0)], -1)
        root = np.arange(u)
        for p in range(u):  # plan order: a parent's root is known before its children's
            if parent_pos[p] >= 0:
                root[p] = root[parent_pos[p]]
        ordered = distinct[order]
        base = np.zeros_like(ordered)
        has_parent = parent_pos >= 0
        base[has_parent] = ordered[parent_pos[has_parent]]
        delta = ordered.astype(np.int8) - base.astype(np.int8)
        rows, columns = np.nonzero(delta)
        stops = np.cumsum(np.bincount(depth[order]))
        levels = [(int(a), int(b)) for a, b in zip(np.concatenate([[0], stops[:-1]]), stops)]
        return cls(order, torch.from_numpy(parent_pos), root, levels, rows, columns,
                   delta[rows, columns].astype(np.float64), csr_matrix(ordered, dtype=np.float64))

    @property
    def terms(self) -> int:
        """Row-axpys of one round under this plan (copies of parent rows not counted)."""
        return int(len(self.rows))

    @property
    def direct_terms(self) -> int:
        """Row-axpys of one direct product per distinct row: nnz of the distinct rows."""
        return int(self.graph.nnz)

    def sums(self, out: torch.Tensor, trained: torch.Tensor, sampled: torch.Tensor,
             held: torch.Tensor, held_scale: torch.Tensor, held_of: torch.Tensor,
             num_examples: torch.Tensor, sparse_below: float = 0.25) -> torch.Tensor:
        """Fill `out` [u, P] with X (plan order) and return the scales s [u], so that s_r·X_r is
        row r's model: Σ_j Ã_rj n_j v_j / Σ_j Ã_rj n_j (spec §2 [C]), where v_j = `trained`[j] for
        a sampled client j (`sampled`: bool [M]; no other row of `trained` is read) and
        v_j = held_scale[q]·held[q] with q = held_of[j] otherwise (stale). A row whose neighbours
        have no examples (D_r = 0) gets the plain mean of their models."""
        n = num_examples.detach().to(torch.float64).numpy()
        is_sampled, model_of = sampled.numpy(), held_of.numpy()
        model_scale = held_scale.to(torch.float64).numpy()
        sampled_index = torch.nonzero(sampled).flatten()
        total = self.graph @ n  # D_r
        norm = total[self.root]
        norm = np.where(norm > 0, norm, 1.0)
        values = self.signs * n[self.columns] / norm[self.rows]
        parts = _split(self.rows, self.columns, values, is_sampled, model_of, model_scale)
        sources = ((trained, sampled_index), (held, None))
        starts = [a for a, _ in self.levels] + [len(out)]
        bounds = [np.searchsorted(part[0], starts) for part in parts]
        with _one_thread(len(self.levels) > 1):
            for level, (start, stop) in enumerate(self.levels):
                target = out[start:stop]
                if start == 0:
                    target.zero_()
                else:
                    torch.index_select(out[:start], 0, self.parent[start:stop], out=target)
                for part, bound, (source, readable) in zip(parts, bounds, sources):
                    rows, cols, vals = (x[bound[level]:bound[level + 1]] for x in part)
                    _accumulate(target, rows - start, cols, vals, source, sparse_below, readable)
        scale = norm / np.where(total > 0, total, 1.0)
        empty = np.flatnonzero(total <= 0)
        if len(empty):  # Σ_j Ã_rj v_j / Σ_j Ã_rj, as `neighbourhood_weights` falls back
            graph = self.graph[empty].tocoo()
            counts = np.maximum(np.asarray(self.graph[empty].sum(axis=1)).ravel(), 1.0)
            order = np.lexsort((graph.col, graph.row))
            rows, columns = graph.row[order].astype(np.int64), graph.col[order].astype(np.int64)
            means = torch.zeros(len(empty), out.shape[1], dtype=out.dtype)
            for part, (source, readable) in zip(
                    _split(rows, columns, 1.0 / counts[rows], is_sampled, model_of, model_scale),
                    sources):
                _accumulate(means, *part, source, sparse_below, readable)
            out[torch.from_numpy(empty)] = means
            scale[empty] = 1.0
        return torch.from_numpy(scale).to(out.dtype)


@contextlib.contextmanager
def _one_thread(active: bool) -> Iterator[None]:
    """Run a tree's level loop on one torch thread. Its many small row operations are bound by
    memory traffic, not arithmetic (one thread streams as fast as two here), but each multi-threaded
    op ends at a barrier: on a busy machine a descheduled peer thread stalls every op, measured here
    3.5× slower for the whole step with a competing process on the other core."""
    threads = torch.get_num_threads()
    if active and threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _spanning_tree(distinct: np.ndarray, degree: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parents (-1: the virtual root) of the minimum spanning tree described in the module doc, and
    the Hamming distance of every row to its parent (its degree for a root). Only pairs with
    H_ij < max(|N_i|, |N_j|) can be tree edges (otherwise the cycle through the virtual root has a
    lighter path), i.e. pairs whose overlap exceeds half the smaller degree: found by the sparse
    product A·Aᵀ, never a dense u×u matrix."""
    u = len(distinct)
    a = csr_matrix(distinct, dtype=np.int32)
    overlap = (a @ a.T).tocoo()
    i, j = overlap.row.astype(np.int64), overlap.col.astype(np.int64)
    hamming = degree[i] + degree[j] - 2 * overlap.data.astype(np.int64)
    keep = (i < j) & (hamming < np.maximum(degree[i], degree[j]))
    nodes = np.arange(u)
    edges = coo_matrix((np.concatenate([hamming[keep] + 1, degree + 1]).astype(np.float64),
                        (np.concatenate([i[keep], nodes]), np.concatenate([j[keep], np.full(u, u)]))),
                       shape=(u + 1, u + 1))
    tree = minimum_spanning_tree(edges.tocsr())
    tree = (tree + tree.T).tocsr()
    _, predecessors = breadth_first_order(tree, u, directed=False)
    parent = np.where(predecessors[:u] == u, -1, predecessors[:u]).astype(np.int64)
    to_parent = np.asarray(tree[nodes, np.where(parent >= 0, parent, u)]).ravel() - 1
    return parent, to_parent.astype(np.int64)


def _bound_paths(parent: np.ndarray, degree: np.ndarray, hamming: np.ndarray, cap: int) -> np.ndarray:
    """Make a row whose path from its root would carry more than `cap` terms a root (in place on
    `parent`; `hamming`: each row's distance to its parent); returns every row's depth in the
    resulting forest."""
    u = len(parent)
    children: list[list[int]] = [[] for _ in range(u)]
    for c in np.flatnonzero(parent >= 0):
        children[parent[c]].append(int(c))
    depth = np.zeros(u, dtype=np.int64)
    terms = np.zeros(u, dtype=np.int64)
    queue = [int(r) for r in np.flatnonzero(parent < 0)]
    terms[queue] = degree[queue]
    while queue:
        p = queue.pop()
        for c in children[p]:
            if terms[p] + hamming[c] > cap:
                parent[c], depth[c], terms[c] = -1, 0, degree[c]
            else:
                depth[c], terms[c] = depth[p] + 1, terms[p] + hamming[c]
            queue.append(c)
    return depth


def _split(rows: np.ndarray, columns: np.ndarray, values: np.ndarray, sampled: np.ndarray,
           held_of: np.ndarray, held_scale: np.ndarray) -> tuple[tuple, tuple]:
    """Terms on trained rows (row, client, value) and on held models, summed per (row, model):
    (row, model, value·scale of the model); both sorted by row, then column."""
    trained = sampled[columns]
    held = ~trained
    model = held_of[columns[held]]
    num_models = len(held_scale)
    key, inverse = np.unique(rows[held] * num_models + model, return_inverse=True)
    summed = np.bincount(inverse.reshape(-1), weights=values[held] * held_scale[model],
                         minlength=len(key))
    return ((rows[trained], columns[trained], values[trained]),
            (key // num_models, key % num_models, summed))


def _accumulate(target: torch.Tensor, rows: np.ndarray, columns: np.ndarray, values: np.ndarray,
                source: torch.Tensor, sparse_below: float,
                readable: torch.Tensor | None = None) -> None:
    """target += C·source for the [len(target), len(source)] matrix C given by its entries (sorted
    and unique), through torch.sparse when C is sparse enough to pay. With `readable`, only those
    rows of `source` may be read (the entries' columns lie among them)."""
    if len(values) == 0:
        return
    shape = (target.shape[0], source.shape[0])
    weights = torch.from_numpy(values).to(source.dtype)
    index = torch.from_numpy(np.stack([rows, columns]).astype(np.int64))
    if len(values) < sparse_below * shape[0] * shape[1]:
        target.addmm_(torch.sparse_coo_tensor(index, weights, shape, is_coalesced=True,
                                              check_invariants=False), source)
        return
    dense = torch.zeros(shape, dtype=source.dtype)
    dense[index[0], index[1]] = weights
    if readable is not None and len(readable) < shape[1]:
        target.addmm_(dense[:, readable], source[readable])
    else:
        target.addmm_(dense, source)
