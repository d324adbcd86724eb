"""`fedu`: FedU, federated multi-task learning with Laplacian regularisation over a given client graph
(Dinh et al., 2021; the baseline of the FedSKA paper, reference `serverFedU.py` / `userFedU.py`).

Every sampled client trains its own model v_k alone (`train.local`, plain SGD: the client half of
`local`), then the server takes one gradient step of the Laplacian regulariser
(λ/2)·Σ_{k,l} a_kl·||v_k − v_l||² over the models trained this round:

    v_k ← v_k − η·λ·Σ_{l ∈ S_t, l ≠ k} a_kl·(v_k − v_l)        (η = the local learning rate)

with a the row-normalised client graph (`fedu.graph`: the label-sharing ground truth, the road
graph of a traffic data set, or a file). [D] the step is taken from one snapshot of the round's models
(Jacobi) as one matrix product; the reference loops over clients and lets later clients see earlier
clients' already-updated models. Clients that were not sampled keep their (stale) row. Each client is
evaluated with its own v_k.

A client that has never trained still holds the initial model. `fedu.untrained=neighbours` replaces its
row, after every round, by the graph-weighted mean of its trained neighbours' rows,
v_k = Σ_l a_kl·m_l·v_l / Σ_l a_kl·m_l (m_l = 1 once client l has trained), so that under partial
participation it is evaluated with, and first trains from, what its neighbours learned (a client with
no trained neighbour keeps the initial model); `initial` is the reference behaviour, under which
λ = 0 is `local`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies.methods.fedu.settings import FedUSection
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.graph import row_normalize
from strategies.shared.priors import ClientReports, check_adjacency, given_graph
from strategies.shared.messages import CONFIG, PERSONAL, TRAIN_LOCAL
from strategies.shared.personalized import PersonalizedStrategy

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")


def laplacian_step(rows: torch.Tensor, adjacency: torch.Tensor, step: float) -> torch.Tensor:
    """V ← V − step·(D − A_off)·V for the rows of one round, with A_off = A without its diagonal and
    D = diag(A_off·1): row k moves by −step·Σ_{l≠k} a_kl (v_k − v_l) (FedU's server update)."""
    off = adjacency.to(rows.dtype).clone()
    off.fill_diagonal_(0.0)
    laplacian = torch.diag(off.sum(dim=1)) - off
    return rows - step * (laplacian @ rows)


def rows_from_trained_neighbours(rows: torch.Tensor, adjacency: torch.Tensor, trained: torch.Tensor
                                 ) -> torch.Tensor:
    """Rows [N, P] where every untrained row k (trained[k] false) becomes Σ_l a_kl·m_l·v_l / Σ_l a_kl·m_l
    over the trained rows l (m = trained as 0/1): row k of rownorm(A·diag(m)), whose rows without a
    trained neighbour are self-loops, so those rows stay. Trained rows stay."""
    untrained = ~trained
    if not bool(untrained.any()):
        return rows
    mixing = row_normalize(adjacency * trained.to(adjacency.dtype))
    out = rows.clone()
    out[untrained] = mixing[untrained].to(rows.dtype) @ rows
    return out


class FedU(PersonalizedStrategy):
    """Local training + one Laplacian-regularisation step over the given graph per round."""

    train_message_type = TRAIN_LOCAL
    # 'fedu.graph' when the graph is the label-sharing graph of the label sets the clients report
    # (`take_reports`, before round 1); None: given at construction
    label_sets_key: str | None = None

    def __init__(self, num_clients: int, fraction_train: float, settings: FedUSection, *,
                 graph: np.ndarray | None, lr: float,
                 matrix_storage: ClientMatrixStorage | None = None) -> None:
        """`settings` is the `fedu` section; `graph` the loaded given graph [K, K] (None: the
        label-sharing graph the clients' reports give, `take_reports`); `lr` the common local
        learning rate η (the Laplacian step is η·λ)."""
        super().__init__(num_clients, fraction_train, matrix_storage=matrix_storage)
        self.label_sets_key = "fedu.graph" if graph is None else None
        self.graph = None if graph is None else row_normalize(check_adjacency(graph, num_clients))
        self.lam, self.lr = settings.lambda_, lr
        self.untrained = settings.untrained
        self._trained: list[int] = []

    def take_reports(self, reports: ClientReports) -> None:
        """The label-sharing graph of the label sets the clients reported (when `label_sets_key`)."""
        if not self.label_sets_key:
            return
        graph = reports.required_label_graph(self.label_sets_key)
        self.graph = row_normalize(check_adjacency(graph, self.num_clients))
        log.info("FedU: graph 'label-sharing' (from the label sets the clients reported), %.1f "
                 "neighbours per client (self included)", float((graph > 0).sum(axis=1).mean()))

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({PERSONAL: self.personal_arrays(client), CONFIG: config})

    def absorb(self, client: int, content: RecordDict) -> None:
        super().absorb(client, content)
        self._trained.append(client)

    def after_train(self, server_round: int) -> ArrayRecord | None:
        """The Laplacian step among the clients trained this round (the reference's selected users)."""
        if not self._trained:
            return None
        trained = torch.tensor(sorted(self._trained))
        self._trained = []
        sub = self.graph[trained][:, trained]
        self.personal[trained] = laplacian_step(self.personal[trained], sub, self.lr * self.lam)
        if self.untrained == "neighbours":
            self.personal = rows_from_trained_neighbours(self.personal, self.graph, self.last_trained >= 0)
        return None

    def client_graph(self) -> np.ndarray | None:
        """The given graph, row-normalised."""
        return self.graph.numpy()

    def report(self, directory: Any, truth: Any) -> dict[str, Any]:
        from strategies.shared.reporter import save_matrix

        save_matrix(directory, "graph", self.graph.numpy(), title="FedU: given graph (row-normalised)")
        return {"fedu": {"lambda": self.lam, "step": self.lr * self.lam, "untrained": self.untrained,
                         "edges-per-client": float((self.graph > 0).sum(dim=1).float().mean())}}


def build_fedu(cfg: RunConfig, storage: ClientMatrixStorage | None = None) -> FedU:
    """FedU from the run config, its client matrix kept by `storage`; the graph is loaded and checked
    before any client is contacted."""
    s = cfg.fedu
    graph = given_graph(cfg, s.graph, s.graph_file, "fedu.graph")  # label-sharing: None until reported
    log.info("FedU: graph '%s', %s neighbours per client (self included), λ = %g, untrained rows: %s",
             s.graph, "the clients' label sets give its" if graph is None else
             f"{float((graph > 0).sum(axis=1).mean()):.1f}", s.lambda_, s.untrained)
    return FedU(cfg.num_clients, cfg.fraction_train, s, graph=graph, lr=cfg.lr, matrix_storage=storage)
