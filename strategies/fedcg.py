"""`fedcg`: Cluster-driven Graph Federated Learning (specs/fedcg.md; CVPR 2021 workshop).

One global model whose chosen conv layers are FedCG layers (`models.fedcg`): θ_a plus D residual
branches whose parameter rows V pass through a GCN over a D-node domain graph A (eq. 4–5). Domains
are discovered without labels: a frozen random teacher φ labels each image, a student ϕ learns it
(eq. 3), and every T rounds the teacher is replaced by the student. Server step per round (§3):
FedAvg (eq. 2, weights num-examples) of the model (θ_a, V, W, λ) and of the student; φ ← ϕ when
t mod T = 0; A ← eq. 6–7 from the new V once t ≥ adj-warmup (A = I before). A travels with the model
(ArrayRecord `graph`). Clients train with the teacher's one-hot domains (`train.fedcg`) and are tested
with the student's soft probabilities (`evaluate.fedcg`).

Balanced pseudo-domains (`fedcg.balance`, spec §6.9, strategies.domain_balance): a random teacher
tends to send every image to one domain, which leaves one branch trained and NMI at 0. Whenever the
teacher changes (round 1 and after every replacement) the server asks every online train client for
per-domain sums of the teacher's logits (`query.fedcg_balance`: D floats and a count per exchange;
no images, labels or per-sample values leave a client): `sinkhorn` (default) standardises the logits
with the federated mean and sd, then runs `fedcg.sinkhorn-iters` Sinkhorn column-scaling exchanges
with the temperature raised to `fedcg.sinkhorn-temperature`, so the hard labels are balanced;
`centering` subtracts the federated mean logit (one exchange; `fedcg.teacher-centering = true` is
its earlier spelling); `none` is the paper's plain argmax. The labelling travels with the teacher
(`teacher_labelling`) and stays fixed while it is frozen, so d̂ is a fixed function of (teacher,
image); it is part of the strategy and so of every checkpoint. Controls: `fedcg.domains = 1` (the
residual capacity alone) and `fedcg.clustering = oracle` (train with each image's true domain).

With held-out test clients (`domain-test-clients` > 0, the paper's protocol) only train clients are
sampled for training and only test clients are evaluated: the global accuracy is over the union of
the test clients' images. Ablation switches (`fedcg.*`): adjacency distance / identity / uniform /
random, use-w, relu, residual, layers last / all, clustering clf / kmeans.

Reports: per round (rounds.jsonl `fedcg`) A, λ per FedCG layer, the hard histogram of the
pseudo-domains and its largest share, the student's histogram, student–teacher agreement, the
balancing (soft marginals and hard histogram of its last step), NMI against the true domains (per
image where the data know each image's domain); at the end (summary.json `fedcg`, artifacts) the
final NMI and largest share, the adjacency heatmaps, `adjacencies.npy` [rounds + 1, D, D], `fedcg.png`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy

from datasets.partition import Partition, heldout_test_clients
from datasets.sources import SOURCE_INFO
from models import build_model
from models.fedcg import DomainClassifier, FedCGModel
from strategies.clients import ClientGrid
from strategies.domain_balance import Labelling, Marginals, sinkhorn_labelling, standardisation
from strategies.graph import pairwise_row_distances
from strategies.messages import (
    ADJACENCY, CONFIG, FEDCG_METRICS, GRAPH, METRICS, MODEL, PERSONAL, QUERY_FEDCG_BALANCE, STUDENT,
    TEACHER, TEACHER_LABELLING, EVALUATE_FEDCG, TRAIN_FEDCG, TRAIN_LOCAL, EvaluateReply,
    FedCGBalanceReply, FedCGBalanceRequest, FedCGEvaluateCounts, FedCGTrainReply, TrainReply,
)
from strategies.params import ParameterLayout
from strategies.personalized import weighted_mean

if TYPE_CHECKING:
    from server_app.config import RunConfig

log = logging.getLogger("flwr.bouquet")

EPSILON = 1e-8  # ε of eq. 6
BRANCH_SEED_OFFSET = 7919  # branch rows, W, λ and the domain classifiers: a stream apart from θ_a's
MAX_HEATMAPS = 12  # panels of adjacency-rounds.png


# --- eq. 6–7 and the other adjacencies -------------------------------------------------------------
def normalized_adjacency(h: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 7: A_ii = β, A_ij = (1 − β)·h_ij / Σ_{d≠i} h_id; rows sum to 1 (D = 1: A = [[1]])."""
    d = len(h)
    if d == 1:
        return torch.ones(1, 1)
    h = h.to(torch.float64).clone()
    h.fill_diagonal_(0.0)
    a = (1.0 - beta) * h / h.sum(dim=1, keepdim=True)
    a.fill_diagonal_(beta)
    return a.to(torch.float32)


def inverse_distance_adjacency(rows: torch.Tensor, beta: float, eps: float = EPSILON) -> torch.Tensor:
    """Eq. 6–7 on the raw branch rows V [D, Σq]: h_ij = 1 / (||θ^i − θ^j||_2 + ε), then eq. 7."""
    return normalized_adjacency(1.0 / (pairwise_row_distances(rows) + eps), beta)


def uniform_adjacency(num_domains: int, beta: float) -> torch.Tensor:
    """Eq. 7 with equal h: A_ii = β, A_ij = (1 − β)/(D − 1)."""
    return normalized_adjacency(torch.ones(num_domains, num_domains), beta)


def random_adjacency(num_domains: int, beta: float, seed: int) -> torch.Tensor:
    """Eq. 7 with h_ij ~ U(0, 1) drawn once from `seed`."""
    h = torch.rand(num_domains, num_domains, generator=torch.Generator().manual_seed(seed))
    return normalized_adjacency(h + EPSILON, beta)


# --- clustering quality ------------------------------------------------------------------------------
def nmi_from_counts(table: np.ndarray) -> float | None:
    """NMI (arithmetic normalisation, as sklearn's default) between true groups (rows) and discovered
    domains (columns) of a contingency table of sample counts; None without samples."""
    from sklearn.metrics import normalized_mutual_info_score

    table = np.asarray(table, dtype=np.int64)
    if table.sum() == 0:
        return None
    rows, cols = np.nonzero(table)
    counts = table[rows, cols]
    return float(normalized_mutual_info_score(np.repeat(rows, counts), np.repeat(cols, counts)))


def domain_name(truth: Partition, client: int) -> str:
    """The name of a client's (first) true domain: its rotation in degrees, or its style."""
    if truth.domain_names is not None:
        return truth.domain_names[int(truth.cluster_ids[client])]
    return f"{float(truth.rotations[client]):g}"


def seen_domains(truth: Partition) -> set[int]:
    """Ids of the domains that some training image is in."""
    if truth.train_domains is not None:
        return {int(d) for domains in truth.train_domains for d in np.unique(domains)}
    return {int(truth.cluster_ids[c]) for c in range(truth.num_clients) if len(truth.train_indices[c])}


def accuracy_by_domain(correct: dict[int, float], examples: dict[int, float], truth: Partition,
                       test_clients: Iterable[int]) -> dict[str, Any]:
    """Accuracy (%) over the union of the listed clients' test images, per true domain (named by its
    rotation or style; a test client's first domain), and over the seen (training) and unseen
    domains. Any global-model method's per-client `correct` / `num-examples` fit (benchmarks use it
    for FedAvg too)."""
    by_name: dict[str, list[float]] = {}
    seen = seen_domains(truth)
    groups: dict[str, list[float]] = {"seen": [0.0, 0.0], "unseen": [0.0, 0.0]}
    for client in test_clients:
        if client not in examples:
            continue
        pair = by_name.setdefault(domain_name(truth, client), [0.0, 0.0])
        pair[0] += correct[client]
        pair[1] += examples[client]
        group = groups["seen" if int(truth.cluster_ids[client]) in seen else "unseen"]
        group[0] += correct[client]
        group[1] += examples[client]
    out: dict[str, Any] = {"by-domain": {name: 100.0 * c / n for name, (c, n) in by_name.items() if n}}
    for name, (c, n) in groups.items():
        if n:
            out[name] = 100.0 * c / n
    return out


def largest_share(histogram: list[int] | None) -> float | None:
    """The largest domain's share of the images of a histogram (None when empty)."""
    total = sum(histogram or [])
    return max(histogram) / total if total else None


# --- the strategy --------------------------------------------------------------------------------------
class FedCG(Strategy):
    """FedCG server (see the module docstring)."""

    def __init__(self, cfg: RunConfig, truth: Partition | None = None) -> None:
        self.cfg = cfg
        self.settings = cfg.fedcg
        self.truth = truth
        held_out = heldout_test_clients(cfg.data_spec.partition)
        everyone = list(range(cfg.num_clients))
        self.test_clients = everyone if held_out is None else [int(c) for c in held_out]
        self.train_clients = everyone if held_out is None else [c for c in everyone
                                                                if c not in set(self.test_clients)]
        self.model: ArrayRecord | None = None
        self.student: ArrayRecord | None = None
        self.teacher: ArrayRecord | None = None
        self.initial_backbone: ArrayRecord | None = None
        self.model_layout: ParameterLayout | None = None
        self.student_layout: ParameterLayout | None = None
        self.layer_names: tuple[str, ...] = ()
        self.adjacency = torch.eye(self.settings.domains)
        self.client_domain: dict[int, int] | None = None  # clustering=kmeans
        self.labelling: Labelling | None = None  # balance: how the current teacher's logits become d̂
        self.teacher_version = 0  # +1 at every φ ← ϕ
        self.labelling_version: int | None = None  # the teacher version the labelling belongs to
        self.balance_report: dict[str, Any] = {}  # the last balancing: its marginals and histogram
        self.clients: ClientGrid | None = None
        self.adjacencies: list[np.ndarray] = [self.adjacency.numpy().copy()]  # A after round t
        self.rounds: dict[int, dict[str, Any]] = {}  # per-round report (train + evaluation)

    # --- state ----------------------------------------------------------------------------------
    def _bind(self, arrays: ArrayRecord, grid: ClientGrid) -> None:
        self.clients = grid
        if self.model is not None:
            return
        cfg, s = self.cfg, self.settings
        input_shape, num_classes = SOURCE_INFO[cfg.dataset]
        self.initial_backbone = arrays
        with torch.random.fork_rng(devices=[]):  # θ_a = the run's initial backbone; the rest seeded
            torch.manual_seed(cfg.seed + BRANCH_SEED_OFFSET)
            backbone = build_model(cfg.model, input_shape, num_classes)
            backbone.load_state_dict(arrays.to_torch_state_dict())
            model = FedCGModel(backbone, s.spec)  # V rows (layer init), W (Glorot), λ = lambda-init
            teacher = DomainClassifier(input_shape, s.domains, s.domain_stride, s.classifier_pool)
            student = DomainClassifier(input_shape, s.domains, s.domain_stride, s.classifier_pool)
        self.layer_names = model.layer_names
        self.model = ArrayRecord(model.state_dict())
        self.teacher = ArrayRecord(teacher.state_dict())
        self.student = ArrayRecord(student.state_dict())
        self.model_layout = ParameterLayout.of(self.model)
        self.student_layout = ParameterLayout.of(self.student)
        if s.adjacency == "uniform":
            self.adjacency = uniform_adjacency(s.domains, s.beta)
        elif s.adjacency == "random":
            self.adjacency = random_adjacency(s.domains, s.beta, cfg.seed)
        self.adjacencies = [self.adjacency.numpy().copy()]

    def graph_record(self) -> ArrayRecord:
        return ArrayRecord({ADJACENCY: Array(self.adjacency.numpy().astype(np.float32))})

    def node_rows(self) -> torch.Tensor:
        """V of every FedCG layer side by side [D, Σ q] (eq. 6's input)."""
        return torch.cat([torch.from_numpy(self.model[f"{name}.V"].numpy()) for name in self.layer_names],
                         dim=1)

    def lambdas(self) -> dict[str, float]:
        return {name: float(self.model[f"{name}.lambda"].numpy()[0]) for name in self.layer_names}

    def summary(self) -> None:
        log.info("FedCG: D=%d, T=%d, adjacency %s, FedCG layers %s, %d train / %d test clients",
                 self.settings.domains, self.settings.teacher_period, self.settings.adjacency,
                 ", ".join(self.layer_names), len(self.train_clients), len(self.test_clients))

    # --- clustering=kmeans: one K-means of the client models before round 1 ([C offline_kmeans]) ---
    def cluster_clients(self, config: ConfigRecord, grid: ClientGrid) -> None:
        """Every train client fine-tunes the initial backbone (`train.local`, kmeans-epochs); PCA to
        95% variance of the flattened models, sample-weighted KMeans(D) → one domain per client.
        A client without a model gets domain 0."""
        from sklearn.cluster import KMeans
        from sklearn.decomposition import PCA

        local = ConfigRecord(dict(config))
        local["local-epochs"] = self.settings.kmeans_epochs
        online = set(grid.get_node_ids())
        messages = [Message(RecordDict({PERSONAL: self.initial_backbone, CONFIG: local}),
                            dst_node_id=c, message_type=TRAIN_LOCAL)
                    for c in self.train_clients if c in online]
        layout = ParameterLayout.of(self.initial_backbone)
        clients, rows, weights = [], [], []
        for client, reply in grid.exchange(messages, self.cfg.round_timeout, "fedcg k-means"):
            clients.append(client)
            rows.append(layout.row(reply.content[PERSONAL]).numpy())
            weights.append(TrainReply.read(reply.content[METRICS]).num_examples)
        self.client_domain = {c: 0 for c in self.train_clients}
        if not rows:
            return
        points = np.stack(rows).astype(np.float64)
        if len(points) > 1:
            points = PCA(n_components=0.95, svd_solver="full").fit_transform(points)
        k = min(self.settings.domains, len(points))
        labels = KMeans(k, n_init=10, random_state=self.cfg.seed).fit_predict(
            points, sample_weight=np.asarray(weights, dtype=np.float64))
        self.client_domain.update({c: int(label) for c, label in zip(clients, labels)})

    # --- balanced pseudo-domains (§6.9) ----------------------------------------------------------
    def _ask_teacher(self, grid: ClientGrid, statistic: str, labelling: Labelling | None = None
                     ) -> list[FedCGBalanceReply]:
        """One `query.fedcg_balance` exchange with every online train client; the well-formed
        replies in client-id order (a reply with sums of the wrong length or not finite is logged
        and skipped)."""
        d = self.settings.domains
        records = {TEACHER: self.teacher, CONFIG: FedCGBalanceRequest(statistic=statistic).config()}
        if labelling is not None:
            records[TEACHER_LABELLING] = labelling.record()
        content = RecordDict(records)
        online = set(grid.get_node_ids())
        messages = [Message(content, dst_node_id=c, message_type=QUERY_FEDCG_BALANCE)
                    for c in self.train_clients if c in online]
        answers = []
        for client, reply in grid.exchange(messages, self.cfg.round_timeout, QUERY_FEDCG_BALANCE):
            answer = FedCGBalanceReply.read(reply.content[METRICS])
            sums = [answer.logit_sum, answer.logit_square_sum] if statistic == "moments" else [answer.soft_sum]
            if any(v is None or len(v) != d or not np.isfinite(v).all() for v in sums):
                log.warning("fedcg: client %d sent malformed %s (expected %d finite floats each); "
                            "skipped", client, statistic, d)
                continue
            answers.append(answer)
        return answers

    def update_labelling(self, grid: ClientGrid) -> None:
        """Form the labelling of the current teacher once (round 1 and after every φ ← ϕ): the
        federated mean (and, for sinkhorn, sd) of its logits, then the Sinkhorn offsets. With no
        usable reply the labelling stays unset (plain argmax) and is asked for again next time."""
        s = self.settings
        if not s.balanced or self.labelling_version == self.teacher_version:
            return
        self.labelling = None
        moments = [a for a in self._ask_teacher(grid, "moments") if a.num_examples > 0]
        if not moments:
            log.warning("fedcg: no client sent teacher logit sums; pseudo-domains stay unbalanced "
                        "until the next round asks again")
            return
        mean, sd = standardisation([a.num_examples for a in moments], [a.logit_sum for a in moments],
                                   [a.logit_square_sum for a in moments])
        d = s.domains
        if s.balance == "centering":
            labelling = Labelling(mean, np.ones(d), np.zeros(d), 1.0)
            report: dict[str, Any] = {}
        else:
            def marginals(labelling: Labelling) -> Marginals | None:
                answers = [a for a in self._ask_teacher(grid, "marginals", labelling) if a.num_examples]
                if not answers:
                    log.warning("fedcg: no client sent soft marginals; Sinkhorn stopped early")
                    return None
                return ([a.num_examples for a in answers], [a.soft_sum for a in answers],
                        [a.hard_counts for a in answers])

            labelling, report = sinkhorn_labelling(mean, sd, s.sinkhorn_iters, s.sinkhorn_temperature,
                                                   marginals)
        self.labelling, self.labelling_version = labelling, self.teacher_version
        self.balance_report = {"teacher-version": self.teacher_version,
                               "temperature": labelling.temperature,
                               "offset": labelling.offset.round(6).tolist(), **report}
        log.info("fedcg: %s labelling of teacher %d%s", s.balance, self.teacher_version,
                 f", last step's hard histogram {report['hard-histogram']}" if report else "")

    def teacher_records(self) -> dict[str, ArrayRecord]:
        """The teacher φ and, when balanced, its labelling (both sent wherever the teacher goes)."""
        records = {TEACHER: self.teacher}
        if self.labelling is not None and self.labelling_version == self.teacher_version:
            records[TEACHER_LABELLING] = self.labelling.record()
        return records

    # --- messages ---------------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: ClientGrid) -> Iterable[Message]:
        """`train.fedcg` to a sample of the train clients: `model`, `student`, `teacher`, `graph`."""
        self._bind(arrays, grid)
        s = self.settings
        config["server-round"] = server_round
        if s.clustering == "kmeans" and self.client_domain is None:
            self.cluster_clients(config, grid)
        self.update_labelling(grid)
        online = set(grid.get_node_ids())
        candidates = [c for c in self.train_clients if c in online]
        if not candidates:
            return []
        size = max(int(len(self.train_clients) * self.cfg.fraction_train), 1)
        sampled = sorted(random.sample(candidates, min(size, len(candidates))))
        config["domain-lr"] = s.domain_lr
        config["num-domains"] = s.domains
        if s.clustering == "oracle":
            config["true-domains"] = True
        records = {MODEL: self.model, STUDENT: self.student, GRAPH: self.graph_record()}
        if s.clustering == "clf":
            records.update(self.teacher_records())
        messages = []
        for client in sampled:
            client_config = config
            if self.client_domain is not None:
                client_config = ConfigRecord(dict(config))
                client_config["client-domain"] = self.client_domain[client]
            messages.append(Message(RecordDict({**records, CONFIG: client_config}), dst_node_id=client,
                                    message_type=TRAIN_FEDCG))
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedAvg of `model` and `student`; φ ← ϕ every T rounds; A ← eq. 6–7 after the warm-up."""
        s = self.settings
        clients, models, students, metrics = [], [], [], []
        for reply in replies:
            if reply.has_error():
                continue
            clients.append(self.clients.client_id(reply))
            models.append(self.model_layout.row(reply.content[MODEL]))
            students.append(self.student_layout.row(reply.content[STUDENT]))
            metrics.append(FedCGTrainReply.read(reply.content[METRICS]))
        if not metrics:
            return None, None
        weights = torch.tensor([m.num_examples for m in metrics], dtype=torch.float32)
        if float(weights.sum()) <= 0:
            return None, None
        self.model = self.model_layout.arrays(weighted_mean(torch.stack(models), weights))
        self.student = self.student_layout.arrays(weighted_mean(torch.stack(students), weights))
        replaced = s.clustering == "clf" and server_round % s.teacher_period == 0
        if replaced:
            self.teacher = self.student
            self.teacher_version += 1
        if s.adjacency == "distance" and server_round >= s.adj_warmup:
            self.adjacency = inverse_distance_adjacency(self.node_rows(), s.beta)
        self.adjacencies.append(self.adjacency.numpy().copy())
        share = (weights / weights.sum()).numpy()
        report = self.rounds.setdefault(server_round, {})
        histogram = np.sum([m.domain_counts for m in metrics], axis=0).tolist()
        report.update({
            "adjacency": self.adjacency.numpy().round(6).tolist(),
            "lambda": self.lambdas(),
            "student-loss": float(np.dot(share, [m.student_loss for m in metrics])),
            "student-agreement": float(np.dot(share, [m.student_agreement for m in metrics])),
            "domain-histogram": histogram,  # the hard pseudo-domains the round trained with
            "largest-domain-share": largest_share(histogram),
            "student-histogram": np.sum([m.student_counts for m in metrics], axis=0).tolist(),
            "teacher-replaced": replaced,
        })
        if self.balance_report:
            report["balance"] = self.balance_report
        truth_table = self._truth_table(clients, [m.domain_counts for m in metrics],
                                        [m.truth_counts for m in metrics])
        if truth_table is not None:
            report["pseudo-domain-nmi"] = nmi_from_counts(truth_table)
            report["student-nmi-train"] = nmi_from_counts(self._truth_table(
                clients, [m.student_counts for m in metrics], [m.student_truth_counts for m in metrics]))
        train_loss = float(np.dot(share, [m.train_loss for m in metrics]))
        return self.model, MetricRecord({"train-loss": train_loss})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: ClientGrid) -> Iterable[Message]:
        """`evaluate.fedcg` to every test client: `model`, `student`, `teacher` (for the report), A."""
        self._bind(arrays, grid)
        config["server-round"] = server_round
        config["soft"] = self.settings.soft
        self.update_labelling(grid)
        records = {MODEL: self.model, STUDENT: self.student, GRAPH: self.graph_record(),
                   **self.teacher_records(), CONFIG: config}
        online = set(grid.get_node_ids())
        return [Message(RecordDict(records), dst_node_id=c, message_type=EVALUATE_FEDCG)
                for c in self.test_clients if c in online]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Global accuracy over the test clients' images; accuracy per true domain; test-set NMI."""
        correct: dict[int, float] = {}
        examples: dict[int, float] = {}
        student_counts, teacher_counts, truth_counts = {}, {}, {}
        by_assignment: dict[str, dict[int, float]] = {"soft": {}, "hard": {}}
        for reply in replies:
            if reply.has_error():
                continue
            client = self.clients.client_id(reply)
            result = EvaluateReply.read(reply.content[METRICS])
            correct[client], examples[client] = float(result.correct), float(result.num_examples)
            if FEDCG_METRICS in reply.content:
                counts = FedCGEvaluateCounts.read(reply.content[FEDCG_METRICS])
                student_counts[client] = counts.student_counts
                teacher_counts[client] = counts.teacher_counts
                truth_counts[client] = counts.truth_counts
                by_assignment["soft"][client] = counts.soft_correct
                by_assignment["hard"][client] = counts.hard_correct
        total = sum(examples.values())
        if not total:
            return None
        report = self.rounds.setdefault(server_round, {})
        if self.labelling is not None:
            report["teacher-labelling"] = {"mean": self.labelling.mean.round(6).tolist(),
                                           "offset": self.labelling.offset.round(6).tolist(),
                                           "temperature": self.labelling.temperature}
        report["test-student-histogram"] = np.sum(list(student_counts.values()), axis=0).tolist() \
            if student_counts else []
        for assignment, values in by_assignment.items():
            if len(values) == len(correct):
                report[f"global-accuracy-{assignment}"] = 100.0 * sum(values.values()) / total
        if self.truth is not None and self.truth.cluster_ids is not None:
            report["accuracy"] = accuracy_by_domain(correct, examples, self.truth, self.test_clients)
            for assignment, values in by_assignment.items():
                if len(values) == len(correct):
                    report[f"accuracy-{assignment}"] = accuracy_by_domain(
                        values, examples, self.truth, self.test_clients)
            seen = self._seen_clients(student_counts)
            report["student-nmi"] = nmi_from_counts(self._truth_table(
                seen, [student_counts[c] for c in seen], [truth_counts[c] for c in seen]))
            report["teacher-nmi"] = nmi_from_counts(
                self._truth_table(seen, [teacher_counts[c] for c in seen]))
        return MetricRecord({"accuracy": sum(correct.values()) / total})

    # --- reporting ------------------------------------------------------------------------------
    def _seen_clients(self, counts: dict[int, list[int]]) -> list[int]:
        """Clients (with counts) whose (first) true domain is one the training images are in."""
        seen = seen_domains(self.truth)
        return [c for c in sorted(counts) if int(self.truth.cluster_ids[c]) in seen]

    def _truth_table(self, clients: list[int], counts: list[list[int]],
                     per_image: list[list[int] | None] | None = None) -> np.ndarray | None:
        """Contingency table [true domains, D] of discovered-domain counts (None without truth):
        per image where every client split its counts by true domain (`per_image`, flattened
        [G, D]), else each client's counts added to its (first) true domain."""
        if self.truth is None or self.truth.cluster_ids is None or not counts:
            return None
        if len(clients) != len(counts):
            return None
        d = self.settings.domains
        groups = len(self.truth.domain_names) if self.truth.domain_names is not None else \
            int(self.truth.cluster_ids.max()) + 1
        if per_image and all(t is not None and len(t) == groups * d for t in per_image):
            return np.sum([np.asarray(t, dtype=np.int64).reshape(groups, d) for t in per_image], axis=0)
        table = np.zeros((groups, d), dtype=np.int64)
        for client, row in zip(clients, counts):
            table[int(self.truth.cluster_ids[client])] += np.asarray(row, dtype=np.int64)
        return table

    def round_report(self, server_round: int) -> dict[str, Any]:
        """Merged into rounds.jsonl: this round's `fedcg` block."""
        return {"fedcg": self.rounds.get(server_round, {})}

    def report(self, directory: Path, truth: Partition | None) -> dict[str, Any]:
        """Artifacts (adjacency heatmaps, adjacencies.npy, fedcg.png) and summary.json's `fedcg`."""
        from server_app.reporting import save_matrix

        s = self.settings
        if self.truth is None and truth is not None:
            self.truth = truth
        np.save(directory / "adjacencies.npy", np.stack(self.adjacencies))
        save_matrix(directory, "adjacency", self.adjacencies[-1], title="domain adjacency A (final)",
                    labels="domain")
        self._plot(directory)
        last = max(self.rounds) if self.rounds else 0
        final = self.rounds.get(last, {})
        start = self.rounds.get(0, {})
        out: dict[str, Any] = {
            "layers": list(self.layer_names),
            "lambda": self.lambdas() if self.model is not None else {},
            "adjacency": self.adjacencies[-1].round(6).tolist(),
            "train-clients": len(self.train_clients),
            "test-clients": len(self.test_clients),
            "student-agreement": [self.rounds[r].get("student-agreement") for r in sorted(self.rounds)
                                  if r > 0],
            "domain-histogram": final.get("domain-histogram"),
            "largest-domain-share": final.get("largest-domain-share"),
            "test-student-histogram": final.get("test-student-histogram"),
            "test-largest-domain-share": largest_share(final.get("test-student-histogram")),
            "balance": self.balance_report,
            "settings": {"domains": s.domains, "teacher-period": s.teacher_period,
                         "adjacency": s.adjacency, "soft": s.soft, "clustering": s.clustering,
                         "balance": s.balance, "sinkhorn-iters": s.sinkhorn_iters,
                         "sinkhorn-temperature": s.sinkhorn_temperature,
                         "classifier-pool": s.classifier_pool, "teacher-centering": s.teacher_centering},
        }
        if "student-nmi" in final:
            trained = [self.rounds[r] for r in sorted(self.rounds) if "pseudo-domain-nmi" in self.rounds[r]]
            out["nmi"] = {"student-final": final.get("student-nmi"),
                          "teacher-round-0": start.get("teacher-nmi"),
                          "student-round-0": start.get("student-nmi"),
                          "pseudo-domain-final": trained[-1]["pseudo-domain-nmi"] if trained else None,
                          "student-train-final": trained[-1].get("student-nmi-train") if trained else None}
        for key in ("accuracy", "accuracy-soft", "accuracy-hard", "global-accuracy-soft",
                    "global-accuracy-hard"):
            if key in final:
                out[key] = final[key]
        if self.client_domain is not None:
            out["client-domain"] = self.client_domain
        return {"fedcg": out}

    def _plot(self, directory: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps = np.unique(np.linspace(0, len(self.adjacencies) - 1,
                                      min(MAX_HEATMAPS, len(self.adjacencies))).astype(int))
        fig, axes = plt.subplots(1, len(steps), figsize=(2.2 * len(steps), 2.4), squeeze=False)
        for ax, t in zip(axes[0], steps):
            ax.imshow(self.adjacencies[t], vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_title(f"A after round {t}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.tight_layout()
        fig.savefig(directory / "adjacency-rounds.png", dpi=100)
        plt.close(fig)

        rounds = [r for r in sorted(self.rounds) if r > 0 and "lambda" in self.rounds[r]]
        if not rounds:
            return
        fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.6))
        for name in self.layer_names:
            ax1.plot(rounds, [self.rounds[r]["lambda"][name] for r in rounds], label=name)
        ax1.set_title("λ per FedCG layer")
        ax1.legend(fontsize=7)
        ax2.plot(rounds, [self.rounds[r]["student-agreement"] for r in rounds], label="agreement")
        for key in ("pseudo-domain-nmi", "student-nmi"):
            points = [(r, self.rounds[r].get(key)) for r in sorted(self.rounds)
                      if self.rounds[r].get(key) is not None]
            if points:
                ax2.plot(*zip(*points), label=key)
        ax2.set_title("student–teacher agreement, NMI")
        ax2.legend(fontsize=7)
        hist = np.array([self.rounds[r]["domain-histogram"] for r in rounds], dtype=np.float64)
        hist = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
        ax3.stackplot(rounds, hist.T, labels=[f"domain {d}" for d in range(hist.shape[1])])
        ax3.set_title("pseudo-domain histogram (share)")
        ax3.legend(fontsize=7, loc="upper right")
        for ax in (ax1, ax2, ax3):
            ax.set_xlabel("round")
        fig.tight_layout()
        fig.savefig(directory / "fedcg.png", dpi=110)
        plt.close(fig)


def build_fedcg(cfg: RunConfig) -> FedCG:
    """FedCG with the partition's ground truth (true domains: reporting only) when the server can
    rebuild it from the data set."""
    from datasets.federated import load_partition
    from datasets.sources import DataNotFoundError

    try:
        truth = load_partition(cfg.data_spec)[1]
    except (DataNotFoundError, OSError) as err:
        log.info("fedcg: no ground truth for reporting (%s)", err)
        truth = None
    return FedCG(cfg, truth)
