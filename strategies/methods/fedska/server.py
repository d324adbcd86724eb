"""`fedska`: unsupervised client-graph structure learning with a split-learning GNN encoder
(docs/methods/fedska.md; "Unsupervised Graph Structure-Assisted Personalized Federated Learning", ECAI 2023).

One Flower round (spec §3), all inside the strategy's train step:
1. `train.fedska`: clients start from w̄, train on CE + λ_S·(1 − cos(f^e(x), h^g)) (Eq 9–10) and reply
   their model and descriptor h̄^c (mean feature).
2. The server FedAvg-aggregates w̄, updates H^c (stale rows kept) and learns S from H^c by E_S steps of
   the denoising objective L_D through GNN_D (`models.gnn`, §2 Generator → Sparsify → Symmetrize →
   Denoising).
3. `query.ska_embed` (to the round's clients): per-slot features P_k [L, d] of the new w̄'s f^e.
4. E_g times: H^g = GNN_E(S, P) (Eq 7) → `query.ska_grad` with H^g_k and w̄'s head → the clients'
   G_k = ∂l_k/∂H^g_k (Eq 8) → one Adam step on θ_E with ∇θ_E = Σ_k backward(⟨H^g_k, G_k⟩). A client
   that does not answer is left out of that step's gradient.
5. H^g = GNN_E(S, P) (no grad) is stored per client and sent with its next `train.fedska`.
That is `fedska.schedule = separate` (2 + E_g phases per round). `fused` (default) carries steps 3 and
the last of step 4 on the train messages: a train message also asks for the slot features of the
global model it carries (w̄ of the previous round; with start='graph' as the extra `embed_model`
record) and, for the clients of the pending query, the slot-loss gradient at its `graph_target` with
the sent `head`; the reply answers both (computed before training, the separate queries' numbers).
After aggregation the server finishes the previous split learning (its last Adam step, from the
carried gradients), stores the carried features, runs E_g − 1 `query.ska_grad` phases and sends
H^g = GNN_E(S, P) as the next train messages' target, before its last step: 1 + max(E_g − 1, 0)
phases per round, the split learning one round behind (the targets of round t come from w̄ of t − 2).
Clients are evaluated with the model they trained (w̄ + E_c local epochs, §6.7); w̄ is reported as
the global model. With the safeguard on (`safeguard='mix'`) and start='graph', a client that has
trained is sent its graph start u_k instead: it holds the model it trained as its own already.
Under partial participation H^c and P keep the stale rows of absent clients.
`fedska.start='graph'` [D]: a client that has trained before starts from its row of the learned graph
applied to the clients' last trained models, u_k = Σ_j Ŝ_kj V_j (Ŝ = S row-normalised over the
clients that have trained), instead of w̄ ([P]/[C], `start='global'`); a client that never trained
starts from w̄. `fedska.similarity='standardized'` [D] standardises the descriptors' embeddings per
dimension over the clients before the cosine (`models.gnn.StructureLearner`).
`fedska.graph='label-sharing'` replaces the learned S by the normalised label-sharing graph (the
given-graph ablation, Table 3); `fedska.tau` > 0 blends that graph into the learned one ([C] τ=0.9).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from models.gnn import (
    GCNEncoder,
    symmetric_normalize,
)
from strategies.methods.fedska.settings import (
    DESCRIPTOR,
    EMBED_MODEL,
    GRAD,
    GRAD_G,
    GRAPH_TARGET,
    H_C,
    H_G,
    HEAD,
    QUERY_SKA_EMBED,
    QUERY_SKA_GRAD,
    SLOT_ENCODING,
    SLOT_FEATURES,
    SLOT_P,
    TRAIN_FEDSKA,
    FedSKATrain,
    FedSKATrainReply,
    SlotInstructions,
    SlotReply,
    round_uploads,
)
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.graph import fresh_graph, structure_share
from strategies.shared.messages import CONFIG, GLOBAL, METRICS, MODEL, PERSONAL
from strategies.shared.personalized import PersonalizedStrategy, weighted_mean
from strategies.shared.privacy import DP_UPLOAD
from strategies.shared.phases import CountsTraffic, Phase, PhasedStrategy, Steps
from strategies.shared.priors import ClientReports, check_adjacency
from strategies.methods.fedska.structure_learning import (
    StructureModel,
    encoder_gradient_step,
    random_knn_graph,
)

if TYPE_CHECKING:
    from datasets.partition import Partition
    from strategies.methods.fedska.settings import FedSKASection
    from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")

GRAPH_HISTORY_MAX_CLIENTS = 256  # keep every round's S (learned-graphs.npy, per-round heatmaps)
HEAD_PREFIX = "head."


class FedSKA(PersonalizedStrategy, PhasedStrategy, CountsTraffic):
    """FedSKA's server half (spec §3). Client models are rows of V (their last trained model).

    Under `dp = 'client'` (the aggregate layer): each trained model is clipped against the model
    the client started from; w̄ gets noise σ·C·(the largest n-weight) and every graph start u_k
    noise σ·C·(the largest weight of Ŝ's row k on a trained client); the descriptors, slot
    features and slot-loss gradients leave the clients clipped and noised (`dp-upload`), so S, P,
    GNN_E and H^g are computed from noised uploads only (docs/privacy.md). Under `dp = 'sample'`
    (DP-SGD on the clients) the same uploads leave the clients clipped and noised and are charged
    to `sample_uploads` (`strategies.shared.privacy.UploadLedger`), which the run's ledger composes
    with each client's DP-SGD steps; with `dp-target-epsilon` a client is sent a round's training
    only while the whole round (its steps and every upload) fits the target (`configure_train`)."""

    UPLOADS = (DESCRIPTOR, SLOT_FEATURES, GRAD)  # what a train reply may carry besides the model

    train_message_type = TRAIN_FEDSKA
    private_aggregates = True  # dp='client' runs it under the per-client aggregate layer
    private: Any = None  # that layer's AggregateNoise (set by it)
    sample_uploads: Any = None  # dp='sample': the UploadLedger of the noised uploads (build_fedska)
    # dp='sample' with a target: (σ, batch size, local epochs) of a round's DP-SGD, and each
    # client's train size (`take_reports`), to tell whether a whole round fits its target
    sample_schedule: tuple[float, int, int] | None = None
    train_sizes: dict[int, int] | None = None
    train_reply = FedSKATrainReply
    _structure_seconds: float | None = None  # the last structure-learning fit (for the progress log)
    # the run config key whose label-sharing prior is built from the label sets the clients report
    # (`take_reports`); None: no prior, or given at construction
    label_sets_key: str | None = None

    def __init__(self, num_clients: int, fraction_train: float, settings: FedSKASection, *,
                 seed: int, prior: np.ndarray | None = None,
                 reference: np.ndarray | None = None,
                 truth: tuple[np.ndarray, str] | None = None,
                 matrix_storage: ClientMatrixStorage | None = None,
                 evaluate_start: bool = False, label_sets_key: str | None = None) -> None:
        super().__init__(num_clients, fraction_train, matrix_storage=matrix_storage)
        # the safeguard on: a client holds its trained model as its own, so evaluation sends its graph
        # start u_k in place of it (start='graph')
        self.evaluate_start = evaluate_start
        if (settings.graph == "label-sharing" or settings.tau > 0) and prior is None \
                and not label_sets_key:
            raise ValueError("fedska.graph='label-sharing' and fedska.tau > 0 need the prior graph")
        self.label_sets_key = label_sets_key
        self.settings, self.seed = settings, seed
        self.prior_hat = (None if prior is None
                          else symmetric_normalize(torch.as_tensor(prior, dtype=torch.float32)))
        self.reference = reference  # a ground-truth graph (label sharing, groups): display only
        # the true structure S is scored against (`ClientReports.structure`)
        self.truth, self.truth_kind = truth if truth is not None else (None, "")
        self.descriptors: torch.Tensor | None = None  # H^c [K, d]
        self.described_round = torch.full((num_clients,), -1, dtype=torch.long)  # H^c_k's; −1: none
        self.num_slots: int | None = None  # L
        self.slots: torch.Tensor | None = None  # P [L, K, d]
        self.embedded = torch.zeros(num_clients, dtype=torch.bool)
        self.encodings: torch.Tensor | None = None  # H^g [L, K, d], sent next round
        self.graph = torch.eye(num_clients)  # S
        self.starts: torch.Tensor | None = None  # start='graph': u_k = Ŝ·V, sent next round
        self.structure: StructureModel | None = None
        self.encoder: GCNEncoder | None = None
        self.encoder_optimizer: torch.optim.Optimizer | None = None
        self.history: list[np.ndarray] = []
        self.denoising_losses: list[list[float]] = []
        self.split_losses: list[list[float]] = []
        self.shares: list[float | None] = []
        self.random_share: float | None = None
        self.phase_bytes: list[dict[str, dict[str, float]]] = []
        self._trained: list[int] = []
        self._structure_losses: list[float] = []  # the clients' mean L_S this round
        self._report: dict[str, Any] = {}
        self._split_due: tuple[ArrayRecord, list[int]] | None = None  # for after_aggregate
        self._mark: tuple[int, int] = (0, 0)
        self._round_bytes: dict[str, dict[str, float]] = {}
        # schedule=fused: the global model this round's train messages carry (its slot features
        # come back on the replies), those features, the gradient query left for the next train
        # messages (head, clients), the gradients and losses the replies carried
        self._sent_global: ArrayRecord | None = None
        self._carried_slots: dict[int, ArrayRecord] = {}
        self._pending: tuple[ArrayRecord, set[int]] | None = None
        self._carried_grads: dict[int, torch.Tensor] = {}
        self._carried_losses: list[float] = []
        self._completed_losses: list[float] = []
        self._online = num_clients  # reachable clients at the last after_aggregate
        # dp='client': the global model this round's train messages carry, and the clients sent
        # their graph start instead (what each trained model is clipped against)
        self._dp_global: ArrayRecord | None = None
        self._dp_from_start: set[int] = set()

    @property
    def described(self) -> torch.Tensor:
        """[K] bool: the clients whose descriptor H^c_k the server holds."""
        return self.described_round >= 0

    # --- messages -----------------------------------------------------------------------------
    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        """`train.fedska`: `global` w̄, `graph_target` {h_g: [L, d]} once the client has H^g, λ_S, L."""
        start = self.start_arrays(client)
        records: dict[str, Any] = {GLOBAL: arrays if start is None else start}
        slots = embed = None
        if self.encodings is not None and bool(self.embedded[client]):
            slots = self.num_slots
            records[GRAPH_TARGET] = ArrayRecord({H_G: _array(self.encodings[:, client, :])})
        if self.settings.schedule == "fused" and self.num_slots is not None:
            self._sent_global, embed = arrays, self.num_slots  # query.ska_embed of w̄, carried
            if start is not None:
                records[EMBED_MODEL] = arrays
            if self._pending is not None and client in self._pending[1] and slots is not None:
                records[HEAD] = self._pending[0]  # the last query.ska_grad, at graph_target
        records[CONFIG] = FedSKATrain.extending(config, lambda_s=self.settings.lambda_s,
                                                num_slots=slots, embed_slots=embed).config()
        if self.private is not None:
            self._dp_global = arrays
            if start is not None:
                self._dp_from_start.add(client)
        if self.uploads is not None:
            records[DP_UPLOAD] = self.uploads.upload_instructions(list(self.UPLOADS))
        return RecordDict(records)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Any) -> list[Message]:
        """As every per-client method's; under dp='sample' with a target, a sampled client whose
        next round (its DP-SGD steps and every noised upload of the round) would take its ε past
        the target is sent nothing (`_may_train`): its row of V, its descriptor and slots stay what
        the server has, as for a client that left."""
        if self.sample_schedule is None or self.sample_uploads.target_epsilon <= 0:
            return super().configure_train(server_round, arrays, config, grid)
        from flwr.serverapp.strategy.strategy_utils import sample_nodes

        self.bind(arrays)
        sampled, _ = sample_nodes(grid, 1, self.sample_size(len(grid.get_node_ids())))
        return [Message(self.train_content(c, arrays, config), dst_node_id=c,
                        message_type=self.train_message_type)
                for c in sorted(sampled) if self._may_train(c)]

    def _may_train(self, client: int) -> bool:
        """dp='sample' with a target: whether a round of `client` fits it: its DP-SGD steps (the
        schedule of its train size) and the most noised records one round can take from it (the
        descriptor, the slot features and one gradient per encoder step)."""
        from strategies.shared.privacy import sample_schedule

        noise, batch_size, epochs = self.sample_schedule
        n = int((self.train_sizes or {}).get(client, 0)) or int(self.num_examples[client])
        rate, steps = sample_schedule(n, batch_size, epochs)
        records = round_uploads(self.settings)
        if self.sample_uploads.affordable(client, records=records,
                                          entries=[(noise, rate, steps)] if n > 0 else []):
            return True
        if self.sample_uploads.withhold(client):
            log.info("FedSKA: client %d's next round would pass dp-target-epsilon; it is sent "
                     "nothing more (its rows stay as they are)", client)
        return False

    @property
    def uploads(self) -> Any:
        """What noises and accounts the clients' non-model uploads: the client-level layer, or
        under dp='sample' the UploadLedger; None with dp off."""
        return self.private if self.private is not None else self.sample_uploads

    def start_arrays(self, client: int) -> ArrayRecord | None:
        """`start='graph'`: the client's row u_k of Ŝ·V once it has trained; None = start from w̄."""
        if self.starts is None or int(self.last_trained[client]) < 0:
            return None
        return self.layout.arrays(self.starts[client])

    def absorb(self, client: int, content: RecordDict) -> None:
        """V_k ← the trained model; H^c_k ← its descriptor (a malformed one keeps the stale row);
        the client's mean L_S (1 − cos to h^g) is reported per round."""
        self.personal[client] = self.layout.row(content[MODEL])
        if self.private is not None:  # the model it started from + clip(its update, C)
            start = (self.starts[client] if client in self._dp_from_start
                     else self.layout.row(self._dp_global))
            self.personal[client] = self.private.clip(self.personal[client], start)
        if self.uploads is not None:
            self.uploads.charge_uploads([client], sum(name in content for name in self.UPLOADS))
        self._trained.append(client)
        metrics = FedSKATrainReply.read(content[METRICS])
        if metrics.structure_loss is not None:
            self._structure_losses.append(metrics.structure_loss)
        if SLOT_FEATURES in content:  # schedule=fused: query.ska_embed's answer
            self._carried_slots[client] = content[SLOT_FEATURES]
        if GRAD in content and self._pending is not None and self.encodings is not None:
            g = self._valid_gradient(client, content[GRAD], self.encodings)  # query.ska_grad's
            if g is not None:
                self._carried_grads[client] = g
                if metrics.split_loss is None:
                    raise ValueError(f"client {client}: a '{TRAIN_FEDSKA}' reply carrying '{GRAD}' needs "
                                     "'split-loss' in its metrics")
                self._carried_losses.append(metrics.split_loss)
        h_c = torch.from_numpy(np.asarray(content[DESCRIPTOR][H_C].numpy(), dtype=np.float32))
        if h_c.ndim != 1 or not bool(torch.isfinite(h_c).all()) or (
                self.descriptors is not None and len(h_c) != self.descriptors.shape[1]):
            log.warning("FedSKA: client %d sent a descriptor of shape %s (expected [d] finite); "
                        "its row stays stale", client, tuple(h_c.shape))
            return
        if self.descriptors is None:
            self.descriptors = torch.zeros(self.num_clients, len(h_c))
        self.descriptors[client] = h_c
        self.described_round[client] = self.last_trained[client]  # this round

    def evaluate_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        """The client's trained model (`personal`) and w̄ (`global`, reported as the global model).
        With `evaluate_start` (the safeguard on) `personal` is the client's graph start u_k once it
        has trained, the model its next training would start from: the client keeps its trained
        model as its own and mixes u_k, which brings its neighbours' newer models, with it."""
        start = self.start_arrays(client) if self.evaluate_start else None
        personal = self.personal_arrays(client) if start is None else start
        return RecordDict({GLOBAL: arrays, PERSONAL: personal, CONFIG: config})

    # --- server step ----------------------------------------------------------------------------
    def after_train(self, server_round: int) -> ArrayRecord | None:
        """Steps 2–3 of the round: FedAvg and structure learning; the split learning of GNN_E
        (steps 3–5) follows as the `after_aggregate` step, whose queries the runner sends."""
        if not self._trained:
            return None
        trained = sorted(self._trained)
        self._trained = []
        started = time.perf_counter()
        self._mark, self._round_bytes = (0, 0), {}  # the runner's counts restart every round
        self._close_phase("train", len(trained))
        index = torch.tensor(trained)
        mean = weighted_mean(self.personal[index], self.num_examples[index])
        if self.private is not None:
            self._dp_from_start = set()
            if not self._private_mean(server_round, mean, trained):
                return None  # the budget is spent: w̄ and the starts stay as they are
        arrays = self.layout.arrays(mean)
        report: dict[str, Any] = {}
        if self._structure_losses:
            report["fedska-structure-loss"] = float(np.mean(self._structure_losses))
            self._structure_losses = []
        embedded: list[int] = []
        if self.settings.schedule == "fused":  # the previous split learning ends, the next starts
            self._slot_count()
            if self._pending is not None:
                self._finish_pending_step()
            carried, self._carried_slots = self._carried_slots, {}
            embedded = [c for c in sorted(carried) if self._store_slots(c, carried[c])]
        if self.descriptors is not None:
            report.update(self._learn_structure(server_round))
        if self.settings.start == "graph":
            starts = self.graph_starts()
            if self.private is None or self._private_starts(server_round, starts):
                self.starts = starts
        report["fedska-server-seconds"] = time.perf_counter() - started
        self._report = report
        self._split_due = (arrays, embedded if self.settings.schedule == "fused" else trained)
        return arrays

    def after_aggregate(self, server_round: int, online: list[int]) -> Steps[None]:
        """Split learning of GNN_E on this round's global model and trained clients (§3 3–5)."""
        self._online = len(online)  # the evaluate phase's clients, for its bytes per client
        if self._split_due is None:
            return
        arrays, clients = self._split_due
        self._split_due = None
        started = time.perf_counter()
        split = (self._fused_split_learning(clients) if self.settings.schedule == "fused"
                 else self._split_learning(arrays, clients))
        self._report.update((yield from split))
        self._report["fedska-server-seconds"] += time.perf_counter() - started

    def take_reports(self, reports: ClientReports) -> None:
        """The clients' reports: the label-sharing prior (when `label_sets_key`), the true structure
        S is scored against and the display order of the graph pictures."""
        if self.sample_schedule is not None:  # dp='sample' with a target: each round's DP-SGD steps
            self.train_sizes = dict(reports.train_sizes)
        if self.label_sets_key:
            prior = check_adjacency(reports.required_label_graph(self.label_sets_key),
                                    self.num_clients)
            self.prior_hat = symmetric_normalize(torch.as_tensor(prior, dtype=torch.float32))
        structure = reports.structure()
        if structure is not None:
            self.truth, self.truth_kind = structure
        if self.reference is None:
            self.reference = reports.reference_graph()

    def _learn_structure(self, server_round: int) -> dict[str, Any]:
        """S from the descriptors of every client seen so far (§2), or with `descriptor-max-age`
        those sent in the last that many rounds; the other clients: self-loops."""
        s = self.settings
        oldest = server_round - s.descriptor_max_age if s.descriptor_max_age > 0 else -1
        nodes = torch.nonzero(self.described_round > oldest).squeeze(1)
        report: dict[str, Any] = {}
        if s.graph == "label-sharing":
            graph = self.prior_hat.clone()
            losses: list[float] = []
        else:
            graph = torch.eye(self.num_clients)
            losses = []
            if len(nodes) >= 2:
                if self.structure is None:
                    self.structure = StructureModel(self.descriptors.shape[1], s, self.seed)
                log.info("FedSKA: learning the client graph (%d denoising steps over %d clients; %s)",
                         s.structure_steps, len(nodes), "no estimate yet" if self._structure_seconds
                         is None else f"about {self._structure_seconds:.1f} s as last round")
                started = time.perf_counter()
                learned, losses = self.structure.fit(self.descriptors[nodes])
                self._structure_seconds = time.perf_counter() - started
                log.info("FedSKA: client graph learned in %.1f s%s", self._structure_seconds,
                         f" (denoising loss {losses[0]:.4f} → {losses[-1]:.4f})" if losses else "")
                graph[nodes.unsqueeze(1), nodes.unsqueeze(0)] = learned
            if s.tau > 0:
                graph = s.tau * self.prior_hat + (1.0 - s.tau) * graph
        self.graph = graph
        self.denoising_losses.append(losses)
        if losses:
            report["fedska-denoising-loss"] = losses
        if self.num_clients <= GRAPH_HISTORY_MAX_CLIENTS:
            self.history.append(graph.numpy().copy())
        if self.truth is not None:
            share = structure_share(graph.numpy(), self.truth)
            self.shares.append(share)
            report[f"fedska-share-{self.truth_kind}"] = share
            report["fedska-random-knn-share"] = self._random_share(self.truth)
        return report

    def _private_mean(self, server_round: int, mean: torch.Tensor, trained: list[int]) -> bool:
        """dp='client': w̄ (the n-weighted mean of the clipped models) noised in place with
        σ·C·(the largest weight); False when the target does not allow it."""
        share = torch.zeros(1, self.num_clients, dtype=torch.float64)
        examples = self.num_examples[trained].to(torch.float64)
        share[0, trained] = examples / examples.sum()
        sensitive = torch.zeros(self.num_clients, dtype=torch.bool)
        sensitive[trained] = True
        return self.private.noised(server_round, mean.unsqueeze(0), share, sensitive)

    def _private_starts(self, server_round: int, starts: torch.Tensor) -> bool:
        """dp='client': the graph starts of the clients that have trained (the only ones sent)
        noised in place with σ·C·(the row's largest weight on a trained client); False (the
        starts stay as they were) when the target does not allow it."""
        trained = self.last_trained >= 0
        rows = torch.nonzero(trained).squeeze(1)
        mix = fresh_graph(self.graph, trained.to(torch.float64))[rows]
        block = starts[rows]
        if not self.private.noised(server_round, block, mix, trained):
            return False
        starts[rows] = block
        return True

    def _private_query(self, server_round: int, clients: list[int], records: list[str]
                       ) -> list[ConfigRecord] | None:
        """dp='client' or 'sample': one `dp-upload` record per client of a query whose replies
        carry `records`; None (training stops) when their noise would take the client-level ε past
        its target."""
        if self.private is None:  # dp='sample': the target was kept when the round's training
            # went out (`_may_train`: only to clients whose whole round fits)
            return [self.sample_uploads.upload_instructions(records) for _ in clients]
        extra = torch.zeros(self.num_clients, dtype=torch.float64)
        extra[clients] = len(records) / self.private.upload_noise_multiplier ** 2
        if not self.private.affordable(extra):
            self.private.stop(server_round)
            return None
        return [self.private.upload_instructions(records) for _ in clients]

    def graph_starts(self) -> torch.Tensor:
        """U = Ŝ·V with Ŝ = S with the columns of never-trained clients set to 0, rows renormalised
        (`strategies.shared.graph.fresh_graph`): every trained client's start mixes only trained models."""
        trained = (self.last_trained >= 0).to(torch.float64)
        mix = fresh_graph(self.graph, trained).to(self.personal.dtype)
        return mix @ self.personal

    def _split_learning(self, arrays: ArrayRecord, trained: list[int]) -> Steps[dict[str, Any]]:
        """`query.ska_embed`, E_g rounds of `query.ska_grad` + Adam on GNN_E, then H^g (§3 3–5)."""
        slot_config = SlotInstructions(num_slots=self._slot_count(), seed=self.seed).config()
        messages = [Message(RecordDict({GLOBAL: arrays, CONFIG: slot_config}), dst_node_id=c,
                            message_type=QUERY_SKA_EMBED) for c in trained]
        if self.uploads is not None:
            uploads = self._private_query(getattr(self.private, "round", 0), trained,
                                          [SLOT_FEATURES])
            if uploads is None:
                return {}
            for message, upload in zip(messages, uploads):
                message.content[DP_UPLOAD] = upload
        replies = yield Phase(QUERY_SKA_EMBED, messages)
        if self.uploads is not None:
            self.uploads.charge_uploads(client for client, _ in replies)
        answered = [client for client, reply in replies
                    if self._store_slots(client, reply.content[SLOT_FEATURES])]
        self._close_phase("embed", len(trained))
        report: dict[str, Any] = {"fedska-embedded-clients": len(answered)}
        if self.slots is None:
            return report
        losses = yield from self._gradient_steps(_head_record(arrays), answered, self._encoder_steps())
        self._close_phase("grad", len(answered))
        return self._encode_and_report(losses, report)

    def _encode_and_report(self, losses: list[float], report: dict[str, Any]) -> dict[str, Any]:
        """After a round's split-learning steps: H^g = f(A, P) for the next train messages, the round's
        losses kept and reported."""
        if self.slots is not None:
            with torch.no_grad():
                self.encodings = self.encoder(self.graph, self.slots)
        self.split_losses.append(losses)
        if losses:
            report["fedska-split-loss"] = losses
        return report

    def _fused_split_learning(self, embedded: list[int]) -> Steps[dict[str, Any]]:
        """schedule=fused, after the round's aggregation: the slot features came on the train
        replies (of the global model sent with this round's messages); E_g − 1 `query.ska_grad`
        phases now, and the last query leaves with the next round's train messages (`_pending`):
        its encodings are the `graph_target` those messages carry, so H^g is sent before its last
        Adam step."""
        report: dict[str, Any] = {"fedska-embedded-clients": len(embedded)}
        steps = self._encoder_steps()
        losses = self._completed_losses
        self._completed_losses = []
        if self.slots is not None and embedded:
            head = _head_record(self._sent_global)
            losses += (yield from self._gradient_steps(head, embedded, max(steps - 1, 0)))
            if steps > 0:
                self._close_phase("grad", len(embedded))
                self._pending = (head, set(embedded))
        return self._encode_and_report(losses, report)

    def _finish_pending_step(self) -> None:
        """schedule=fused: the last gradient step of the previous round's split learning, from the
        gradients the train replies carried (at the encodings sent as `graph_target`; S and P are
        still those they were computed from)."""
        grads, losses = self._carried_grads, self._carried_losses
        self._carried_grads, self._carried_losses, self._pending = {}, [], None
        if grads:
            encoder_gradient_step(self.encoder, self.graph, self.slots, grads)
            self.encoder_optimizer.step()
            self._completed_losses.append(float(np.mean(losses)))

    def _slot_count(self) -> int:
        """L = max_k N_k over the clients seen so far, capped at max-slots (§3 [D]); fixed once set."""
        if self.num_slots is None:
            self.num_slots = int(min(float(self.num_examples.max()), self.settings.max_slots))
        return self.num_slots

    def _encoder_steps(self) -> int:
        """E_g; identity encoder: nothing to train."""
        return self.settings.encoder_steps if self.settings.encoder == "gcn" else 0

    def _store_slots(self, client: int, record: ArrayRecord) -> bool:
        """P_k ← the client's slot features [L, d] (a malformed reply keeps the stale rows)."""
        p = torch.from_numpy(np.asarray(record[SLOT_P].numpy(), dtype=np.float32))
        dim = (self.slots.shape[2] if self.slots is not None
               else self.descriptors.shape[1] if self.descriptors is not None else p.shape[-1])
        if p.shape != (self.num_slots, dim) or not bool(torch.isfinite(p).all()):
            log.warning("FedSKA: client %d sent slot features of shape %s (expected [%d, %d] "
                        "finite); its slots stay stale", client, tuple(p.shape), self.num_slots, dim)
            return False
        if self.slots is None:
            self.slots = torch.zeros(self.num_slots, self.num_clients, dim)
        self.slots[:, client, :] = p
        self.embedded[client] = True
        if self.encoder is None:
            with torch.random.fork_rng():
                torch.manual_seed(self.seed + 1)
                self.encoder = GCNEncoder(dim, self.settings.encoder)
            self.encoder_optimizer = torch.optim.Adam(
                self.encoder.parameters(), lr=self.settings.encoder_lr,
                weight_decay=self.settings.encoder_weight_decay)
        return True

    def _valid_gradient(self, client: int, record: ArrayRecord, encodings: torch.Tensor
                        ) -> torch.Tensor | None:
        g = torch.from_numpy(np.asarray(record[GRAD_G].numpy(), dtype=np.float32))
        if g.shape != encodings[:, client, :].shape or not bool(torch.isfinite(g).all()):
            log.warning("FedSKA: client %d sent a gradient of shape %s; skipped", client, tuple(g.shape))
            return None
        return g

    def _gradient_steps(self, head: ArrayRecord, clients: list[int], steps: int
                        ) -> Steps[list[float]]:
        """`steps` rounds of `query.ska_grad` to `clients` + one Adam step on GNN_E each (Eq 8); a
        client that does not answer is left out of that step. The clients' mean losses."""
        slot_config = SlotInstructions(num_slots=self.num_slots, seed=self.seed).config()
        losses = []
        for _ in range(steps):
            if not clients:
                break
            with torch.no_grad():
                encodings = self.encoder(self.graph, self.slots)
            messages = [Message(RecordDict({
                SLOT_ENCODING: ArrayRecord({H_G: _array(encodings[:, c, :])}), HEAD: head,
                CONFIG: slot_config}), dst_node_id=c, message_type=QUERY_SKA_GRAD) for c in clients]
            if self.uploads is not None:
                uploads = self._private_query(getattr(self.private, "round", 0), clients, [GRAD])
                if uploads is None:
                    break
                for message, upload in zip(messages, uploads):
                    message.content[DP_UPLOAD] = upload
            grads: dict[int, torch.Tensor] = {}
            client_losses = []
            replies = yield Phase(QUERY_SKA_GRAD, messages)
            if self.uploads is not None:
                self.uploads.charge_uploads(client for client, _ in replies)
            for client, reply in replies:
                g = self._valid_gradient(client, reply.content[GRAD], encodings)
                if g is not None:
                    grads[client] = g
                    client_losses.append(SlotReply.read(reply.content[METRICS]).loss)
            if grads:
                encoder_gradient_step(self.encoder, self.graph, self.slots, grads)
                self.encoder_optimizer.step()
                losses.append(float(np.mean(client_losses)))
        return losses

    # --- traffic by phase -----------------------------------------------------------------------
    def _close_phase(self, phase: str, clients: int) -> None:
        """Record the bytes (down, up) per addressed client exchanged since the last phase ended:
        `round_traffic` (set by the runner, `CountsTraffic`) counts every ArrayRecord sent and
        received this round."""
        down, up = self.round_traffic
        last_down, last_up = self._mark
        self._mark = (down, up)
        self._round_bytes[phase] = {"down": (down - last_down) / max(clients, 1),
                                    "up": (up - last_up) / max(clients, 1)}

    # --- reporting ----------------------------------------------------------------------------
    def _random_share(self, reference: np.ndarray) -> float | None:
        """The share inside the true structure of a random graph with k neighbours per row (the
        baseline)."""
        if self.random_share is None:
            k = max(1, min(self.settings.k, self.num_clients - 1))
            self.random_share = structure_share(random_knn_graph(self.num_clients, k, self.seed),
                                                reference)
        return self.random_share

    def round_report(self, server_round: int) -> dict[str, Any]:
        """Merged into rounds.jsonl: L_D per step, split-learning loss per E_g step, S's share on
        label-sharing pairs (and a random kNN graph's), bytes per client by phase."""
        report, self._report = self._report, {}
        if self._round_bytes:
            self._close_phase("evaluate", self._online)
            self.phase_bytes.append(self._round_bytes)
            report["fedska-bytes-per-client"] = self._round_bytes
            self._round_bytes = {}
        return report

    def client_graph(self) -> np.ndarray | None:
        """S, the learned client graph."""
        return self.graph.numpy()

    def report(self, directory: Path, truth: Partition | None) -> dict[str, Any]:
        """graph.npy/.png = S of the last round; graphs/round-NNN.png = S of every round and
        learned-graphs.npy (K ≤ 256); summary: losses, shares, bytes by phase."""
        from strategies.shared.graph import graph_display_order
        from strategies.shared.reporter import save_matrix

        reference = self.reference
        if reference is None and truth is not None:
            reference = truth.label_graph
        order = graph_display_order(reference)
        kind = "given label-sharing graph" if self.settings.graph == "label-sharing" else "learned S"
        save_matrix(directory, "graph", self.graph.numpy(), order=order,
                    title=f"FedSKA: {kind}, last round")
        if self.history:
            np.save(directory / "learned-graphs.npy", np.stack(self.history))
            (directory / "graphs").mkdir(exist_ok=True)
            for number, graph in enumerate(self.history, start=1):
                save_matrix(directory / "graphs", f"round-{number:03d}", graph, order=order,
                            title=f"FedSKA: {kind}, round {number}")
        out: dict[str, Any] = {
            "graph": self.settings.graph, "k": self.settings.k, "num-slots": self.num_slots,
            "edges-per-client": float((self.graph > 0).sum(dim=1).float().mean()),
            "denoising-loss": self.denoising_losses, "split-loss": self.split_losses,
            "bytes-per-client-by-phase": self.phase_bytes,
        }
        if self.truth is not None:
            out[f"share-{self.truth_kind}"] = self.shares
            out[f"share-{self.truth_kind}-final"] = structure_share(self.graph.numpy(), self.truth)
            out["random-knn-share"] = self._random_share(self.truth)
        return {"fedska": out}


def _head_record(arrays: ArrayRecord) -> ArrayRecord:
    """The global model's head f^s (`head.*` without the prefix)."""
    return ArrayRecord({key[len(HEAD_PREFIX):]: arrays[key] for key in arrays.keys()
                        if key.startswith(HEAD_PREFIX)})


def _array(tensor: torch.Tensor) -> Array:
    return Array(np.ascontiguousarray(tensor.detach().cpu().numpy().astype(np.float32)))


def build_fedska(cfg: RunConfig, storage: ClientMatrixStorage | None = None) -> FedSKA:
    """FedSKA from the run config, its client matrix kept by `storage`; the prior graph (given-graph
    mode, τ > 0) is loaded and checked before any client is contacted."""
    from strategies.shared.priors import given_graph

    from strategies.shared.privacy import UploadLedger

    s = cfg.fedska
    key = None
    if s.graph == "label-sharing" or s.tau > 0:
        key = "fedska.graph" if s.graph == "label-sharing" else "fedska.tau"
        given_graph(cfg, "label-sharing", "", key)  # checks the data set has labels to share
    # the prior: the label sets the clients report (FedSKA.take_reports); the truth: their groups
    strategy = FedSKA(cfg.num_clients, cfg.fraction_train, s, seed=cfg.seed,
                      matrix_storage=storage, evaluate_start=cfg.safeguard == "mix",
                      label_sets_key=key)
    strategy.sample_uploads = UploadLedger.of(cfg)
    if cfg.dp == "sample" and cfg.dp_target_epsilon > 0:
        strategy.sample_schedule = (cfg.dp_noise_multiplier, cfg.batch_size, cfg.local_epochs)
    return strategy
