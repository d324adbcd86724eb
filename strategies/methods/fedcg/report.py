"""FedCG's reporting: evaluation results per true domain and per assignment
(soft / hard), NMI of the discovered domains against the true ones (per image where the data know
each image's domain), and the artifacts: adjacency heatmaps, `adjacencies.npy`, `fedcg.png`.

`FedCGReporting` is the reporter half of the `FedCG` strategy (it reads the strategy's per-round
records and state); the functions also serve the benchmarks, for any global-model method.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import MetricRecord

from datasets.partition import Partition
from strategies.methods.fedcg.settings import FEDCG_METRICS, FedCGEvaluateCounts
from strategies.shared.messages import METRICS, EvaluateReply
from strategies.shared.phases import Replies
from strategies.shared.priors import ReportedTruth
from strategies.shared.reporter import MethodReporter

MAX_HEATMAPS = 12  # panels of adjacency-rounds.png


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


def domain_name(truth: Partition | ReportedTruth, client: int) -> str:
    """The name of a client's (first) true domain: its rotation in degrees, or its style (the run
    config's names); else its id."""
    if truth.domain_names is not None:
        return truth.domain_names[int(truth.cluster_ids[client])]
    if truth.rotations is not None:
        return f"{float(truth.rotations[client]):g}"
    return str(int(truth.cluster_ids[client]))


def seen_domains(truth: Partition | ReportedTruth) -> set[int]:
    """Ids of the domains that some training image is in."""
    if getattr(truth, "seen_domain_ids", None) is not None:  # reported by the clients
        return set(truth.seen_domain_ids)
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


class FedCGReporting(MethodReporter):
    """The reporting of `FedCG`: what its evaluation replies say, and its artifacts."""

    def evaluation_report(self, server_round: int, replies: Replies) -> MetricRecord | None:
        """`FedCG.aggregate_evaluate`: global accuracy over the test clients' images; accuracy per
        true domain and per assignment; test-set NMI."""
        correct: dict[int, float] = {}
        examples: dict[int, float] = {}
        student_counts, teacher_counts, truth_counts = {}, {}, {}
        by_assignment: dict[str, dict[int, float]] = {"soft": {}, "hard": {}}
        for client, reply in replies:
            if reply.has_error():
                continue
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
        from strategies.shared.reporter import save_matrix

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
        agreement = [(r, self.rounds[r]["student-agreement"]) for r in rounds
                     if "student-agreement" in self.rounds[r]]  # not sent under dp='sample'
        if agreement:
            ax2.plot(*zip(*agreement), label="agreement")
        for key in ("pseudo-domain-nmi", "student-nmi"):
            points = [(r, self.rounds[r].get(key)) for r in sorted(self.rounds)
                      if self.rounds[r].get(key) is not None]
            if points:
                ax2.plot(*zip(*points), label=key)
        ax2.set_title("student–teacher agreement, NMI")
        ax2.legend(fontsize=7)
        counted = [r for r in rounds if "domain-histogram" in self.rounds[r]]
        if counted:
            hist = np.array([self.rounds[r]["domain-histogram"] for r in counted], dtype=np.float64)
            hist = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
            ax3.stackplot(counted, hist.T, labels=[f"domain {d}" for d in range(hist.shape[1])])
            ax3.legend(fontsize=7, loc="upper right")
        ax3.set_title("pseudo-domain histogram (share)" if counted
                      else "pseudo-domain histogram: not sent under dp='sample'")
        for ax in (ax1, ax2, ax3):
            ax.set_xlabel("round")
        fig.tight_layout()
        fig.savefig(directory / "fedcg.png", dpi=110)
        plt.close(fig)
