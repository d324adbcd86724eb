"""`fedcg`: Cluster-driven Graph Federated Learning (docs/methods/fedcg.md; CVPR 2021 workshop).

One global model whose chosen conv layers are FedCG layers (`models.fedcg`): θ_a plus D residual
branches whose parameter rows V pass through a GCN over a D-node domain graph A (eq. 4–5). Domains
are discovered without labels: a frozen random teacher φ labels each image, a student ϕ learns it
(eq. 3), and every T rounds the teacher is replaced by the student. Server step per round (§3):
FedAvg (eq. 2, weights num-examples) of the model (θ_a, V, W, λ) and of the student; φ ← ϕ when
t mod T = 0; A ← eq. 6–7 from the new V once t ≥ adj-warmup (A = I before). A travels with the model
(ArrayRecord `graph`). Clients train with the teacher's one-hot domains (`train.fedcg`) and are tested
with the student's soft probabilities (`evaluate.fedcg`).

Balanced pseudo-domains (`fedcg.balance`, spec §6.9, strategies.methods.fedcg.domain_balance): a random teacher
tends to send every image to one domain, which leaves one branch trained and NMI at 0. Whenever the
teacher changes (round 1 and after every replacement) the server asks every online train client for
per-domain sums of the teacher's logits (`query.fedcg_balance`): `sinkhorn` (default) standardises
the logits with the federated mean and sd, then runs `fedcg.sinkhorn-iters` Sinkhorn column scalings
with the temperature raised to `fedcg.sinkhorn-temperature`, so the hard labels are balanced. Its
`fedcg.balance-schedule`: `sampled` (default) = one exchange per teacher, each client sending its
moments and `fedcg.balance-sample` of its teacher logit rows, the scalings run here on the pooled
sample; `exchange` (spec §6.9) = one exchange per scaling (D floats and a count each; no per-sample
value leaves a client). `centering` subtracts the federated mean logit (one exchange;
`fedcg.teacher-centering = true` is its earlier spelling); `none` is the paper's plain argmax. The labelling travels with the teacher
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
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from datasets.partition import Partition, heldout_test_clients
from datasets.sources import SOURCE_INFO
from models import build_model
from models.fedcg import DomainClassifier, FedCGModel
from strategies.methods.fedcg.settings import (
    ADJACENCY,
    BALANCE_STATISTICS,
    EVALUATE_FEDCG,
    GRAPH,
    QUERY_FEDCG_BALANCE,
    STUDENT,
    TEACHER,
    TEACHER_LABELLING,
    TRAIN_FEDCG,
    FedCGBalanceReply,
    FedCGBalanceRequest,
    FedCGTrain,
    FedCGTrainReply,
)
from strategies.methods.fedcg.domain_balance import (
    Labelling,
    sampled_marginals,
    sinkhorn_labelling,
    sinkhorn_steps,
    standardisation,
)
from strategies.methods.fedcg.domain_graph import inverse_distance_adjacency, random_adjacency, uniform_adjacency
from strategies.shared.messages import (
    CONFIG,
    METRICS,
    MODEL,
    PERSONAL,
    TRAIN_LOCAL,
    TrainReply,
)
from strategies.shared.params import ParameterLayout
from strategies.shared.privacy import DP_UPLOAD
from strategies.shared.personalized import weighted_mean
from strategies.shared.phases import ClientKeyed, Phase, PhasedStrategy, Replies, Steps
from strategies.shared.priors import ClientReports
from strategies.methods.fedcg.report import FedCGReporting, largest_share, nmi_from_counts

if TYPE_CHECKING:
    from strategies.methods.fedcg.privacy import FedCGSamplePrivacy
    from strategies.methods.fedcg.settings import FedCGSection
    from strategies.shared.run_config import RunConfig
    from strategies.shared.client_matrix import ClientMatrixStorage

log = logging.getLogger("flwr.bouquet")

BRANCH_SEED_OFFSET = 7919  # branch rows, W, λ and the domain classifiers: a stream apart from θ_a's


# --- eq. 6–7 and the other adjacencies -------------------------------------------------------------
# --- the strategy --------------------------------------------------------------------------------------
class FedCG(Strategy, FedCGReporting, PhasedStrategy, ClientKeyed):
    """FedCG server (see the module docstring)."""

    def __init__(self, settings: FedCGSection, *, num_clients: int, fraction_train: float,
                 dataset: str, model: str, seed: int, held_out: Sequence[int] | None = None,
                 truth: Partition | None = None) -> None:
        """`settings`: FedCG's section; the common settings it uses by name; `held_out`: whole test
        clients (None: every client trains and is tested)."""
        self.settings = settings
        self.fraction_train, self.dataset, self.model_name, self.seed = (fraction_train, dataset,
                                                                          model, seed)
        self.truth = truth
        everyone = list(range(num_clients))
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
        self.adjacencies: list[np.ndarray] = [self.adjacency.numpy().copy()]  # A after round t
        self.rounds: dict[int, dict[str, Any]] = {}  # per-round report (train + evaluation)

    # dp='sample' (strategies.methods.fedcg.privacy): the balance statistics' noise, accounting and
    # target; None with dp off
    sample_privacy: FedCGSamplePrivacy | None = None
    private_aggregates = True  # dp='client' runs it under the per-client aggregate layer
    private: Any = None  # that layer's AggregateNoise (set by it): the one n-weighted mean's noise

    @property
    def sample_uploads(self) -> Any:
        """The UploadLedger of the noised balance replies the run's DP-SGD ledger takes
        (server_app/privacy.py); None with dp off."""
        return None if self.sample_privacy is None else self.sample_privacy.uploads

    # --- state ----------------------------------------------------------------------------------
    def bind(self, arrays: ArrayRecord) -> None:
        if self.model is not None:
            return
        s = self.settings
        input_shape, num_classes = SOURCE_INFO[self.dataset]
        self.initial_backbone = arrays
        with torch.random.fork_rng(devices=[]):  # θ_a = the run's initial backbone; the rest seeded
            torch.manual_seed(self.seed + BRANCH_SEED_OFFSET)
            backbone = build_model(self.model_name, input_shape, num_classes)
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
            self.adjacency = random_adjacency(s.domains, s.beta, self.seed)
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
    def cluster_clients(self, config: ConfigRecord, online: list[int]) -> Steps[None]:
        """Every train client fine-tunes the initial backbone (`train.local`, kmeans-epochs); PCA to
        95% variance of the flattened models, sample-weighted KMeans(D) → one domain per client.
        A client without a model gets domain 0."""
        from sklearn.cluster import KMeans
        from sklearn.decomposition import PCA

        local = ConfigRecord(dict(config))
        local["local-epochs"] = self.settings.kmeans_epochs
        online = set(online)
        messages = [Message(RecordDict({PERSONAL: self.initial_backbone, CONFIG: local}),
                            dst_node_id=c, message_type=TRAIN_LOCAL)
                    for c in self.train_clients if c in online]
        layout = ParameterLayout.of(self.initial_backbone)
        clients, rows, weights = [], [], []
        for client, reply in (yield Phase("fedcg k-means", messages)):
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
        labels = KMeans(k, n_init=10, random_state=self.seed).fit_predict(
            points, sample_weight=np.asarray(weights, dtype=np.float64))
        self.client_domain.update({c: int(label) for c, label in zip(clients, labels)})

    # --- balanced pseudo-domains (§6.9) ----------------------------------------------------------
    def _ask_teacher(self, online: list[int], statistic: str, labelling: Labelling | None = None
                     ) -> Steps[list[FedCGBalanceReply]]:
        """One `query.fedcg_balance` exchange with every online train client; the well-formed
        replies in client-id order (a reply with sums of the wrong length or not finite, or a logit
        sample that is not [m ≤ balance-sample, D] finite rows, is logged and skipped)."""
        s = self.settings
        d = s.domains
        request = FedCGBalanceRequest(statistic=statistic)
        if statistic == "sample":
            request = FedCGBalanceRequest(statistic=statistic, sample_size=s.balance_sample,
                                          seed=self.seed, teacher_version=self.teacher_version)
        records = {TEACHER: self.teacher, CONFIG: request.config()}
        if labelling is not None:
            records[TEACHER_LABELLING] = labelling.record()
        content = RecordDict(records)
        online = set(online)
        asked = [c for c in self.train_clients if c in online]
        private = self.sample_privacy if self.private is None else self.private
        if private is None:
            messages = [Message(content, dst_node_id=c, message_type=QUERY_FEDCG_BALANCE)
                        for c in asked]
        else:  # DP: the statistics leave noised, within the target
            messages = [Message(RecordDict({**records, DP_UPLOAD: uploads}), dst_node_id=c,
                                message_type=QUERY_FEDCG_BALANCE)
                        for c, uploads in self._private_queries(asked)]
        answers = []
        replies = yield Phase(QUERY_FEDCG_BALANCE, messages)
        if private is not None:
            noised = [client for client, reply in replies if BALANCE_STATISTICS in reply.content]
            if self.private is None:
                self.sample_privacy.charge(noised)
            else:
                self.private.charge_uploads(noised)
        for client, reply in replies:
            if private is not None:
                if BALANCE_STATISTICS not in reply.content:
                    log.warning("fedcg: client %d's balance reply carries no '%s' record; skipped",
                                client, BALANCE_STATISTICS)
                    continue
                answer = FedCGBalanceReply.from_statistics(
                    FedCGBalanceReply.read(reply.content[METRICS]).num_examples,
                    reply.content[BALANCE_STATISTICS])
            else:
                answer = FedCGBalanceReply.read(reply.content[METRICS])
            sums = ([answer.soft_sum] if statistic == "marginals"
                    else [answer.logit_sum, answer.logit_square_sum])
            malformed = any(v is None or len(v) != d or not np.isfinite(v).all() for v in sums)
            if statistic == "sample":
                rows = answer.logit_sample
                malformed = malformed or rows is None or len(rows) % d != 0 or not np.isfinite(
                    rows).all() or len(rows) // d > min(s.balance_sample, answer.num_examples)
            if malformed:
                log.warning("fedcg: client %d sent malformed %s (expected %d finite floats each%s); "
                            "skipped", client, statistic, d,
                            f", at most {s.balance_sample} rows of logits" if statistic == "sample" else "")
                continue
            answers.append(answer)
        return answers

    def _private_queries(self, clients: list[int]) -> list[tuple[int, ConfigRecord]]:
        """(client, its `dp-upload` record) for each client a balance request may go to: under
        dp='sample' those the target allows (`FedCGSamplePrivacy.affordable`); under dp='client'
        every client while the noise of all their replies keeps every client within the target,
        none (and training stops) once it would not."""
        if self.private is None:
            return [(c, self.sample_privacy.instructions())
                    for c in self.sample_privacy.affordable(clients)]
        private = self.private
        if private.stopped_at is not None or not clients:
            return []
        extra = torch.zeros(len(private.rho), dtype=torch.float64)
        extra[clients] = 1.0 / private.upload_noise_multiplier ** 2
        if not private.affordable(extra):
            private.stop(private.round + 1)  # before the next round trains
            return []
        return [(c, private.upload_instructions([BALANCE_STATISTICS])) for c in clients]

    def update_labelling(self, online: list[int]) -> Steps[None]:
        """Form the labelling of the current teacher once (round 1 and after every φ ← ϕ): the
        federated mean (and, for sinkhorn, sd) of its logits, then the Sinkhorn offsets. With no
        usable reply the labelling stays unset (plain argmax) and is asked for again next time."""
        s = self.settings
        if not s.balanced or self.labelling_version == self.teacher_version:
            return
        self.labelling = None
        sampled = s.balance == "sinkhorn" and s.balance_schedule == "sampled"
        started = time.perf_counter()
        log.info("fedcg: labelling teacher %d: asking %d clients for its logits (%s)",
                 self.teacher_version, len(online), s.balance)
        moments = [a for a in (yield from self._ask_teacher(online, "sample" if sampled else "moments"))
                   if a.num_examples > 0]
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
        elif sampled:  # the column scalings on the pooled logit samples, here (one exchange in all)
            samples = [(a.num_examples, torch.tensor(a.logit_sample, dtype=torch.float64).reshape(-1, d))
                       for a in moments]
            labelling, report = sinkhorn_labelling(mean, sd, s.sinkhorn_iters, s.sinkhorn_temperature,
                                                   sampled_marginals(samples))
            report = {**report, "sampled-rows": sum(len(z) for _, z in samples)}
        else:
            steps = sinkhorn_steps(mean, sd, s.sinkhorn_iters, s.sinkhorn_temperature)
            try:
                labelling = next(steps)
                while True:
                    answers = [a for a in (yield from self._ask_teacher(online, "marginals", labelling))
                               if a.num_examples]
                    if not answers:
                        log.warning("fedcg: no client sent soft marginals; Sinkhorn stopped early")
                    labelling = steps.send(([a.num_examples for a in answers],
                                            [a.soft_sum for a in answers],
                                            [a.hard_counts for a in answers]) if answers else None)
            except StopIteration as done:
                labelling, report = done.value
        self.labelling, self.labelling_version = labelling, self.teacher_version
        self.balance_report = {"teacher-version": self.teacher_version,
                               "temperature": labelling.temperature,
                               "offset": labelling.offset.round(6).tolist(), **report}
        log.info("fedcg: %s labelling of teacher %d in %.1f s%s", s.balance, self.teacher_version,
                 time.perf_counter() - started,
                 f", last step's hard histogram {report['hard-histogram']}" if "hard-histogram" in report
                 else "")

    def teacher_records(self) -> dict[str, ArrayRecord]:
        """The teacher φ and, when balanced, its labelling (both sent wherever the teacher goes)."""
        records = {TEACHER: self.teacher}
        if self.labelling is not None and self.labelling_version == self.teacher_version:
            records[TEACHER_LABELLING] = self.labelling.record()
        return records

    # --- messages ---------------------------------------------------------------------------------
    def before_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                     online: list[int]) -> Steps[None]:
        """Exchanges due before training: K-means of the clients' models (once, clustering=kmeans)
        and the labelling of a new teacher (balancing queries)."""
        self.bind(arrays)
        if self.settings.clustering == "kmeans" and self.client_domain is None:
            yield from self.cluster_clients(config, online)
        yield from self.update_labelling(online)

    def before_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        online: list[int]) -> Steps[None]:
        """The labelling of a new teacher (its test histograms are reported under it); under
        dp='sample' not for the report alone (the next training asks)."""
        self.bind(arrays)
        if self.sample_privacy is None and self.private is None:
            yield from self.update_labelling(online)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """`train.fedcg` to a sample of the train clients: `model`, `student`, `teacher`, `graph`."""
        self.bind(arrays)
        s = self.settings
        online = set(grid.get_node_ids())
        candidates = [c for c in self.train_clients if c in online]
        if not candidates:
            return []
        size = max(int(len(self.train_clients) * self.fraction_train), 1)
        sampled = sorted(random.sample(candidates, min(size, len(candidates))))
        train = FedCGTrain.extending(config, domain_lr=s.domain_lr,
                                     true_domains=s.clustering == "oracle",
                                     withhold_statistics=True if self.private is not None else None)
        records = {MODEL: self.model, STUDENT: self.student, GRAPH: self.graph_record()}
        if s.clustering == "clf":
            records.update(self.teacher_records())
            replace = -(-server_round // s.teacher_period) * s.teacher_period  # next multiple of T
            log.info("fedcg: round %d: %d clients train with teacher %d (the student replaces it "
                     "after round %d)", server_round, len(sampled), self.teacher_version, replace)
        else:
            log.info("fedcg: round %d: %d clients train (%s domains)", server_round, len(sampled),
                     s.clustering)
        messages = []
        for client in sampled:
            client_config = train.config() if self.client_domain is None else train.model_copy(
                update={"client_domain": self.client_domain[client]}).config()
            messages.append(Message(RecordDict({**records, CONFIG: client_config}), dst_node_id=client,
                                    message_type=TRAIN_FEDCG))
        return messages

    def aggregate_train(self, server_round: int, replies: Replies
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedAvg of `model` and `student`; φ ← ϕ every T rounds; A ← eq. 6–7 after the warm-up."""
        s = self.settings
        clients, models, students, metrics = [], [], [], []
        for client, reply in replies:
            if reply.has_error():
                continue
            clients.append(client)
            models.append(self.model_layout.row(reply.content[MODEL]))
            students.append(self.student_layout.row(reply.content[STUDENT]))
            metrics.append(FedCGTrainReply.read(reply.content[METRICS]))
        if not metrics:
            return None, None
        weights = torch.tensor([m.num_examples for m in metrics], dtype=torch.float32)
        if float(weights.sum()) <= 0:
            return None, None
        if self.private is not None:  # dp='client': clipped updates, a noised mean (or none)
            if not self._private_mean(server_round, clients, models, students, weights):
                return self.model, MetricRecord({"train-loss": float(np.dot(
                    (weights / weights.sum()).numpy(), [m.train_loss for m in metrics]))})
        else:
            self.model = self.model_layout.arrays(weighted_mean(torch.stack(models), weights))
            self.student = self.student_layout.arrays(weighted_mean(torch.stack(students), weights))
        replaced = s.clustering == "clf" and server_round % s.teacher_period == 0
        if replaced:
            self.teacher = self.student
            self.teacher_version += 1
            log.info("fedcg: round %d: the student becomes teacher %d", server_round,
                     self.teacher_version)
        if s.adjacency == "distance" and server_round >= s.adj_warmup:
            self.adjacency = inverse_distance_adjacency(self.node_rows(), s.beta)
        self.adjacencies.append(self.adjacency.numpy().copy())
        share = (weights / weights.sum()).numpy()
        report = self.rounds.setdefault(server_round, {})
        train_loss = float(np.dot(share, [m.train_loss for m in metrics]))
        if any(m.domain_counts is None for m in metrics):  # dp='sample': no counts were sent
            report.update({"adjacency": self.adjacency.numpy().round(6).tolist(),
                           "lambda": self.lambdas(),
                           "student-loss": float(np.dot(share, [m.student_loss for m in metrics])),
                           "teacher-replaced": replaced})
            if self.balance_report:
                report["balance"] = self.balance_report
            return self.model, MetricRecord({"train-loss": train_loss})
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
        return self.model, MetricRecord({"train-loss": train_loss})

    def _private_mean(self, server_round: int, clients: list[int], models: list[torch.Tensor],
                      students: list[torch.Tensor], weights: torch.Tensor) -> bool:
        """dp='client' (`AggregateNoise`): each client's update of the model and the student
        together clipped to dp-clip-norm against what it was sent, their n-weighted mean released
        with Gaussian noise of std σ·C·(the largest weight), charged per client; False (the model
        and the student stay as they are) when the target does not allow it."""
        private = self.private
        sent_model = self.model_layout.row(self.model)
        start = torch.cat([sent_model, self.student_layout.row(self.student)])
        rows = torch.stack([private.clip(torch.cat([m, st]), start)
                            for m, st in zip(models, students)]).to(torch.float64)
        share = torch.zeros(1, len(private.rho), dtype=torch.float64)
        share[0, clients] = weights.to(torch.float64) / float(weights.sum())
        sensitive = torch.zeros(len(private.rho), dtype=torch.bool)
        sensitive[clients] = True
        mean = share[:, clients] @ rows
        if not private.noised(server_round, mean, share, sensitive):
            log.info("fedcg: round %d: the noised mean would pass dp-target-epsilon; the model and "
                     "the student stay as they are", server_round)
            return False
        split = len(sent_model)
        self.model = self.model_layout.arrays(mean[0, :split].to(sent_model.dtype))
        self.student = self.student_layout.arrays(mean[0, split:].to(sent_model.dtype))
        return True

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """`evaluate.fedcg` to every test client: `model`, `student`, `teacher` (for the report), A."""
        self.bind(arrays)
        records = {MODEL: self.model, STUDENT: self.student, GRAPH: self.graph_record(),
                   **self.teacher_records(), CONFIG: config}
        online = set(grid.get_node_ids())
        return [Message(RecordDict(records), dst_node_id=c, message_type=EVALUATE_FEDCG)
                for c in self.test_clients if c in online]

    def aggregate_evaluate(self, server_round: int, replies: Replies) -> MetricRecord | None:
        return self.evaluation_report(server_round, replies)

    label_sets_key = None  # FedCG asks the clients for no label sets

    def take_reports(self, reports: ClientReports) -> None:
        """The true domains the clients reported (their group and per-domain train counts), for the
        per-domain accuracy and NMI figures; none reported: those figures are left out."""
        truth = reports.truth()
        if truth is not None and truth.cluster_ids is not None:
            self.truth = truth
        else:
            log.info("fedcg: no client reported a group or domain field: no per-domain accuracy or "
                     "NMI figures")


def build_fedcg(cfg: RunConfig) -> FedCG:
    """FedCG; its ground truth (true domains: reporting only) is what the clients report
    (`FedCG.take_reports`); under dp='sample' with its balance statistics' noise and accounting."""
    strategy = fedcg_for(cfg)
    if cfg.dp == "sample":
        from strategies.methods.fedcg.privacy import FedCGSamplePrivacy

        strategy.sample_privacy = FedCGSamplePrivacy.of(cfg)
    return strategy


def fedcg_for(cfg: RunConfig, truth: Partition | None = None) -> FedCG:
    """FedCG on the run config's `fedcg` section and the common settings it uses."""
    return FedCG(cfg.fedcg, num_clients=cfg.num_clients, fraction_train=cfg.fraction_train,
                 dataset=cfg.dataset, model=cfg.model, seed=cfg.seed,
                 held_out=heldout_test_clients(cfg.data_spec.partition), truth=truth)


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> FedCG:
    """The strategy of a run (its `Method` builder, `strategies.methods.fedcg.server:build`)."""
    return build_fedcg(cfg)  # keeps no client matrix
