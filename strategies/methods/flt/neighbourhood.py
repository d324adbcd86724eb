"""FLT's graph-weighted averaging W ← D⁻¹(Ã diag(n)) W (`neighbourhood_average`) and its per-round
step over the held client models (`NeighbourhoodModels`, summed with `strategies.methods.flt.neighbourhood_sums`).
No Python loop over parameters."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from strategies.methods.flt.neighbourhood_sums import SumTree


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
    The sums are planned once per graph (`strategies.methods.flt.neighbourhood_sums.SumTree`): a distinct row is
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
