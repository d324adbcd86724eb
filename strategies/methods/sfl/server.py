"""`sfl` and `sfl-star`: Structured Federated Learning (docs/methods/sfl.md; IJCAI 2022).

The server keeps every client's latest upload v_i as row i of V [N, P] (clients that were not sampled
keep their stale row, §6.5) and propagates V over the row-normalised client graph with a weight-free
GCN: U = α·Â^L·V + (1−α)·V (§2 (3)); row i of U is client i's personalized model u_i, and the global
model is the unweighted read-out w = (1/N)·Σ_i u_i (§6.6). Clients start from w and train on their task
loss plus λ1·||θ − u_i||_2 + λ2·||θ − w||_2 (message `train.sfl`, client half in `client_app/methods/sfl.py`);
they are evaluated with u_i on their own test split (§6.3).

The prior graph A is a server artifact (§3), taken from `sfl.graph`: `label-sharing` (clients that
share a train label, from the label sets the clients report in `query.identify`, which the run then
asks them for: it reveals which labels each client holds), `road`
(the traffic data set's Gaussian-kernel sensor graph, `datasets.traffic.road_graph`), `file`
(`sfl.graph-file`, a checked .npy / .csv adjacency), or `none` (SFL* with β = 1 only).
`sfl-star` (SFL*) also learns A_learn from the distances between the client models each round
(`strategies.methods.sfl.graph_learner`, §2 (5)) and uses A = (1−β)·Â_prior + β·A_learn.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies.methods.sfl.settings import TRAIN_SFL, SFLTrain
from strategies.methods.sfl.gcn import GCNPropagation
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.graph import (
    fresh_graph,
    row_normalize,
    structure_share,
    uniform_share,
)
from strategies.methods.sfl.graph_learner import GraphLearner, blend
from strategies.shared.messages import CONFIG, GLOBAL, MODEL, PERSONAL
from strategies.shared.personalized import PersonalizedStrategy
from strategies.shared.priors import ClientReports, check_adjacency, given_graph

if TYPE_CHECKING:
    from datasets.partition import Partition
    from strategies.shared.run_config import RunConfig
    from strategies.methods.sfl.settings import SFLSection

log = logging.getLogger("flwr.bouquet")

GRAPH_HISTORY_MAX_CLIENTS = 256  # keep every round's graph (for learned-graphs.npy) up to this N


class SFL(PersonalizedStrategy):
    """SFL (given graph) and, with a `learner`, SFL* (learned graph blended into the prior).

    Its per-client aggregates are `aggregates` (U = P·V), what the learner measures `measured`
    and where a client's training started `start_of`: under `dp = 'client'` the layer of
    strategies/shared/private_aggregation.py takes these (docs/privacy.md)."""

    train_message_type = TRAIN_SFL
    private_aggregates = True  # dp='client' runs it under the per-client aggregate layer

    def __init__(self, num_clients: int, fraction_train: float, settings: SFLSection, *,
                 prior: np.ndarray | None, learner: GraphLearner | None = None,
                 reference: np.ndarray | None = None, graph_source: str = "",
                 truth: tuple[np.ndarray, str] | None = None,
                 matrix_storage: ClientMatrixStorage | None = None,
                 label_sets_key: str | None = None) -> None:
        """`label_sets_key`: the prior is the label-sharing graph of the label sets the clients
        report (`take_reports`, before round 1; `prior` is then None until they have)."""
        super().__init__(num_clients, fraction_train, matrix_storage=matrix_storage)
        if prior is None and learner is None and not label_sets_key:
            raise ValueError("SFL needs a prior graph, a graph learner, or both")
        self.settings = settings
        self.learner = learner
        self.label_sets_key = label_sets_key
        self.graph_source = graph_source or settings.graph
        self.reference = reference  # a ground-truth graph (label sharing, groups): display only
        # the true structure A_learn is scored against (`ClientReports.structure`)
        self.truth, self.truth_kind = truth if truth is not None else (None, "")
        self.aggregated: torch.Tensor | None = None  # U [N, P]
        self.global_row: torch.Tensor | None = None  # w of the last read-out
        self.updates: torch.Tensor | None = None  # SFL*, gl-features=updates: last v_i − start
        self.learned: torch.Tensor | None = None  # A_learn of the last round (SFL*)
        self._set_prior(prior)
        self.history: list[np.ndarray] = []  # per-round Â of SFL* (small N only)
        self.shares: list[float | None] = []  # per-round share of A_learn inside the true structure
        self.seconds: list[float] = []  # per-round server aggregation time (learner + GCN + read-out)
        self._absorbed = 0
        self._report: dict[str, Any] = {}

    def _set_prior(self, prior: np.ndarray | None) -> None:
        """A (checked), Â = rownorm(A); SFL: Â is the graph of every round and its propagation."""
        self.prior = None if prior is None else check_adjacency(prior, self.num_clients)
        self.prior_hat = None if prior is None else row_normalize(self.prior)
        self.graph_hat = self.prior_hat if self.learner is None else None  # Â used in the last round
        self.propagation: GCNPropagation | None = None  # SFL*: rebuilt every round
        if self.learner is None and self.prior_hat is not None:
            s = self.settings
            self.propagation = GCNPropagation(self.prior_hat, s.hops, s.alpha, s.propagation)

    def take_reports(self, reports: ClientReports) -> None:
        """The clients' reports: the label-sharing prior (when `label_sets_key`), the true structure
        A_learn is scored against and the display order of the graph pictures."""
        if self.label_sets_key:
            graph = reports.required_label_graph(self.label_sets_key)
            self._set_prior(graph)
            log.info("SFL: prior graph 'label-sharing' (from the label sets the clients reported): "
                     "%d clients, %.1f neighbours per client (self included)",
                     len(graph), float((graph > 0).sum(axis=1).mean()))
        structure = reports.structure()
        if structure is not None:
            self.truth, self.truth_kind = structure
        if self.reference is None:
            self.reference = reports.reference_graph()

    # --- messages -----------------------------------------------------------------------------
    def bind(self, arrays: ArrayRecord) -> None:
        first = self.layout is None
        super().bind(arrays)  # V: every row = w0 (§3)
        if first:
            self.aggregated = self.matrix_storage.copy(self.personal)  # U = V at the start
            self.global_row = self.personal[0].clone()  # w = w0
            if self.learner is not None and self.settings.gl_features == "updates":
                self.updates = self.matrix_storage.zeros_like(self.personal)

    def personal_arrays(self, client: int) -> ArrayRecord:
        """u_i: row i of U (what client i is pulled toward and evaluated with)."""
        return self.layout.arrays(self.aggregated[client])

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        """`train.sfl`: ArrayRecords `global` (w) and `personal` (u_i), λ1, λ2 and reg-grad (§3)."""
        s = self.settings
        sfl = SFLTrain.extending(config, lambda_personal=s.lambda_personal,
                                 lambda_global=s.lambda_global, reg_grad=s.reg_grad, start=s.start)
        return RecordDict({GLOBAL: arrays, PERSONAL: self.personal_arrays(client),
                           CONFIG: sfl.config()})

    def absorb(self, client: int, content: RecordDict) -> None:
        """V_i ← v_i, the model the client trained (`model`); with `gl-features=updates` also the
        client's update v_i − (the model it started from: u_i or w)."""
        self.personal[client] = self.layout.row(content[MODEL])
        if self.updates is not None:
            self.updates[client] = self.personal[client] - self.start_of(client)
        self._absorbed += 1

    def start_of(self, client: int) -> torch.Tensor:
        """The model client `client` started its training from: u_i or w (`sfl.start`)."""
        return self.aggregated[client] if self.settings.start == "personal" else self.global_row

    # --- server step --------------------------------------------------------------------------
    def row_weights(self, server_round: int) -> torch.Tensor | None:
        """The weight of every row of V in the propagation and the read-out: `sfl.rows='trained'`
        gives a never-trained client's row (still w0) weight 0 and a row last trained a rounds ago
        `staleness-decay`^a; `rows='all'` (spec) reads every row alike (None)."""
        if self.settings.rows == "all":
            return None
        return self.freshness(server_round, self.settings.staleness_decay)

    def after_train(self, server_round: int) -> ArrayRecord | None:
        """SFL*: learn A_learn and blend; then U = α·Â^L·V + (1−α)·V and w = mean_i U_i (§3.3),
        over the rows that `row_weights` lets in (Â's columns weighted and rows renormalised)."""
        if not self._absorbed:
            return None
        self._absorbed = 0
        started = time.perf_counter()
        report: dict[str, Any] = {}
        weights = self.row_weights(server_round)
        trained = None if weights is None else weights > 0
        if self.learner is not None:
            self.learned = self.learner.fit(self.learner_features(), include=trained)
            graph = blend(self.prior_hat, self.learned, self.settings.beta)
            self._use_graph(graph, weights)
            if self.truth is not None:
                share = structure_share(self.learned.numpy(), self.truth)
                self.shares.append(share)
                if share is not None:
                    report[f"sfl-learned-share-{self.truth_kind}"] = share
            if self.num_clients <= GRAPH_HISTORY_MAX_CLIENTS:
                self.history.append(self.graph_hat.numpy().copy())
            report["sfl-learner-loss"] = self.learner.losses[-1]
        elif weights is not None:
            self._use_graph(self.prior_hat, weights)
        base = self.prior_hat if self.learner is None else graph if weights is not None else None
        self.aggregated, global_row = sfl_step(self.aggregates(server_round), self.personal,
                                               weights, base, out=self.aggregated)
        self.global_row = global_row
        seconds = time.perf_counter() - started
        self.seconds.append(seconds)
        report["sfl-aggregation-seconds"] = seconds
        report["sfl-propagation"] = self.propagation.describe()
        if weights is not None:
            report["sfl-trained-rows"] = int(trained.sum())
        self._report = report
        return self.layout.arrays(global_row)

    def aggregates(self, server_round: int) -> GCNPropagation:
        """This round's per-client aggregates U = P·V: the planned propagation (`apply`, and its
        weights over the rows of V, `operator`)."""
        return self.propagation

    def measured(self) -> torch.Tensor:
        """The rows SFL*'s learner measures: V (spec), or with `gl-features=updates` the updates."""
        return self.personal if self.updates is None else self.updates

    def learner_features(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """What SFL*'s learner measures distances between: `rows` (default `measured`), with
        `gl-features=updates` each scaled to unit norm (distances then order pairs by the cosine of
        the updates, which rows of different ages keep comparable)."""
        rows = self.measured() if rows is None else rows
        if self.updates is None:
            return rows
        norms = rows.norm(dim=1, keepdim=True)
        return rows / torch.where(norms > 0, norms, torch.ones_like(norms))

    def _use_graph(self, graph: torch.Tensor | np.ndarray, weights: torch.Tensor | None) -> None:
        """Â for this round's propagation: rownorm(A) (spec), or with the row weights
        rownorm(A·diag(m)); the plan is rebuilt only when Â changes."""
        graph_hat = (row_normalize(graph) if weights is None
                     else fresh_graph(torch.as_tensor(np.asarray(graph)), weights))
        if (self.propagation is not None and self.graph_hat is not None
                and torch.equal(graph_hat, self.graph_hat)):
            return
        self.graph_hat = graph_hat
        self.propagation = GCNPropagation(graph_hat, self.settings.hops, self.settings.alpha,
                                          self.settings.propagation)

    # --- reporting ----------------------------------------------------------------------------
    def round_report(self, server_round: int) -> dict[str, Any]:
        """Merged into rounds.jsonl: server seconds, propagation plan, trained rows; SFL*: learner
        loss and the share of A_learn's weight inside the true structure (when it is known)."""
        report, self._report = self._report, {}
        return report

    def client_graph(self) -> np.ndarray | None:
        """Â of the last round (the prior, or SFL*'s blend of prior and learned graph)."""
        return None if self.graph_hat is None else self.graph_hat.numpy()

    def report(self, directory: Path, truth: Partition | None) -> dict[str, Any]:
        """graph.npy/.png = Â of the last round; SFL*: learned-graph (A_learn of the last round),
        learned-graphs.npy (Â of every round, N ≤ 256) and prior-graph when a prior was used."""
        from strategies.shared.graph import graph_display_order
        from strategies.shared.reporter import save_matrix

        reference = self.reference
        if reference is None and truth is not None:
            reference = truth.label_graph
        order = graph_display_order(reference)
        name = "SFL*" if self.learner is not None else "SFL"
        out: dict[str, Any] = {
            "graph-source": self.graph_source if self.prior is not None else "none",
            "hops": self.settings.hops, "alpha": self.settings.alpha,
            "propagation": self.propagation.describe() if self.propagation else None,
            "aggregation-seconds-median": float(np.median(self.seconds)) if self.seconds else None,
        }
        if self.graph_hat is not None:
            graph = self.graph_hat.numpy()
            save_matrix(directory, "graph", graph, order=order,
                        title=f"{name}: Â used in the last round (row-normalised)")
            out["edges-per-client"] = float((graph > 0).sum(axis=1).mean())
            if self.truth is not None:
                out[f"graph-share-{self.truth_kind}"] = structure_share(graph, self.truth)
                out[f"uniform-share-{self.truth_kind}"] = uniform_share(self.truth)
        if self.prior is not None and self.learner is not None:
            save_matrix(directory, "prior-graph", self.prior_hat.numpy(), order=order,
                        title="SFL*: prior Â_prior (row-normalised)")
        if self.learner is not None and self.learned is not None:
            save_matrix(directory, "learned-graph", self.learned.numpy(), order=order,
                        title=f"SFL*: A_learn (top-{self.learner.k} per row of A_L), last round")
            if self.history:
                np.save(directory / "learned-graphs.npy", np.stack(self.history))
            out.update({
                "beta": self.settings.beta, "learner-k": self.learner.k,
                "learner-loss": self.learner.losses,
            })
            if self.truth is not None:
                out[f"learned-share-{self.truth_kind}"] = self.shares
                out[f"learned-share-{self.truth_kind}-final"] = structure_share(
                    self.learned.numpy(), self.truth)
        return {"sfl": out}


# --- building from the run config -----------------------------------------------------------------
def sfl_step(propagation: GCNPropagation, rows: torch.Tensor, weights: torch.Tensor | None,
             graph: torch.Tensor | np.ndarray | None, out: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """SFL's server step on plain tensors (§3.3): U = α·Â^L·V + (1−α)·V with the planned
    `propagation`, and the global model w = the mean of U's rows (spec, `weights` None) or their
    `weights`-weighted mean, where a client that never trained and has no trained neighbour in
    `graph` gets w as its row. Returns (U, w)."""
    aggregated = propagation.apply(rows, out=out)
    if weights is None:
        return aggregated, aggregated.mean(dim=0)  # read-out: unweighted mean (§6.6)
    global_row = (weights / weights.sum()).to(torch.float32) @ aggregated
    reached = torch.as_tensor(np.asarray(graph), dtype=torch.float64) @ weights
    orphans = (weights <= 0) & (reached <= 0)  # no trained neighbour: the global model
    if bool(orphans.any()):
        aggregated[orphans] = global_row
    return aggregated, global_row


def prior_graph(cfg: RunConfig) -> np.ndarray:
    """The prior client graph A [N, N] of `sfl.graph`, checked (`strategies.shared.priors.given_graph`);
    a ConfigError naming the key, the value and what is allowed otherwise."""
    if cfg.sfl.graph == "none":
        from strategies.shared.settings import ConfigError

        raise ConfigError(
            f"run config: key 'sfl.graph' = 'none' is invalid: method '{cfg.method}' needs a prior "
            "client graph; allowed: 'label-sharing' (image data sets), 'road' (traffic data sets), "
            "'file' (with sfl.graph-file); or method 'sfl-star' with sfl.beta=1.0, which learns the "
            "graph alone")
    return given_graph(cfg, cfg.sfl.graph, cfg.sfl.graph_file, "sfl.graph")


def build_sfl(cfg: RunConfig, learn: bool, storage: ClientMatrixStorage | None = None) -> SFL:
    """`sfl` (learn=False) or `sfl-star` (learn=True) from the run config, its [N, P] matrices kept by
    `storage`. Every graph is loaded and checked here, before any client is contacted. SFL* with β = 1
    uses no prior (none is loaded)."""
    s = cfg.sfl
    needs_prior = not learn or s.beta < 1.0
    if learn and not needs_prior and s.graph != "none":
        log.info("SFL*: sfl.beta=1.0 uses the learned graph alone; sfl.graph=%r is not loaded",
                 s.graph)
    if learn and needs_prior and s.graph == "none":
        from strategies.shared.settings import ConfigError

        raise ConfigError(
            f"run config: key 'sfl.graph' = 'none' is invalid: SFL* blends a prior graph with weight "
            f"1 − β = {1 - s.beta:g}; set sfl.beta=1.0 to learn the graph alone, or choose "
            "'label-sharing', 'road' or 'file'")
    prior = prior_graph(cfg) if needs_prior else None
    # label-sharing: built from the label sets the clients report (SFL.take_reports)
    label_sets_key = "sfl.graph" if needs_prior and prior is None else None
    learner = None
    if learn:
        learner = GraphLearner(
            cfg.num_clients, k=s.gl_k, dim=s.gl_dim, scale=s.gl_scale, init_std=s.gl_init_std,
            steps=s.gl_steps,
            lr=s.gl_lr, optimizer=s.gl_optimizer, weight_decay=s.gl_weight_decay,
            persist=s.gl_persist, target=s.gl_target, symmetric=s.gl_symmetric,
            self_loops=s.gl_self_loops, seed=cfg.seed, model=s.gl_model)
    if prior is not None:
        log.info("SFL: prior graph '%s': %d clients, %.1f neighbours per client (self included)",
                 s.graph, len(prior), float((prior > 0).sum(axis=1).mean()))
    return SFL(cfg.num_clients, cfg.fraction_train, s, prior=prior, learner=learner,
               graph_source=s.graph, matrix_storage=storage, label_sets_key=label_sets_key)


def build_plain(cfg: RunConfig, storage: ClientMatrixStorage) -> SFL:
    """`sfl`'s strategy: SFL over its given client graph."""
    return build_sfl(cfg, learn=False, storage=storage)


def build_star(cfg: RunConfig, storage: ClientMatrixStorage) -> SFL:
    """`sfl-star`'s strategy: SFL* over a graph learned from the client models."""
    return build_sfl(cfg, learn=True, storage=storage)
