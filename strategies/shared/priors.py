"""What the server knows before training: client graphs given to a method (a .npy / .csv file, the
label-sharing graph, a traffic data set's road graph), checked, and what the clients report about
their data in `query.identify` (`ClientReports`): their label sets, only when the run asks for them
(`label-sharing`), and their group / domain fields, the ground truth of every reported graph-quality
figure. The server opens no client data: in partitioned simulation too, each client reports its
share of the partition's ground truth (client_app/identify.py)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig

ADJACENCY_SUFFIXES: tuple[str, ...] = (".npy", ".csv")


def check_adjacency(matrix: np.ndarray, num_clients: int) -> np.ndarray:
    """A client graph a user supplied, as float32 [N, N]; raises ValueError saying what is wrong:
    not square, wrong size (N = num-clients), not finite, or negative."""
    matrix = np.asarray(matrix)
    allowed = (f"a square [num-clients, num-clients] = [{num_clients}, {num_clients}] matrix of "
               "finite, non-negative weights")
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"adjacency has shape {matrix.shape}; allowed: {allowed}")
    if matrix.shape[0] != num_clients:
        raise ValueError(f"adjacency has shape {matrix.shape} but num-clients = {num_clients}; "
                         f"allowed: {allowed}")
    if not np.issubdtype(matrix.dtype, np.number) or np.issubdtype(matrix.dtype, np.complexfloating):
        raise ValueError(f"adjacency has dtype {matrix.dtype}; allowed: {allowed}")
    matrix = matrix.astype(np.float64)
    bad = ~np.isfinite(matrix)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"adjacency has {int(bad.sum())} non-finite entries (NaN or inf), e.g. "
                         f"[{i}, {j}] = {matrix[i, j]}; allowed: {allowed}")
    if (matrix < 0).any():
        i, j = np.argwhere(matrix < 0)[0]
        raise ValueError(f"adjacency has {int((matrix < 0).sum())} negative entries, e.g. "
                         f"[{i}, {j}] = {matrix[i, j]:g}; allowed: {allowed}")
    return matrix.astype(np.float32)


def read_adjacency(path: str, num_clients: int) -> np.ndarray:
    """Read and check a client graph from `.npy` (a 2-D array) or `.csv` (comma-separated numbers,
    one row per line, no header); errors name the file, what was found and what is allowed."""
    from pathlib import Path

    path = Path(path).expanduser()
    if path.suffix.lower() not in ADJACENCY_SUFFIXES:
        raise ValueError(f"graph file {str(path)!r} has extension {path.suffix or '(none)'!r}; "
                         f"allowed: {', '.join(ADJACENCY_SUFFIXES)}")
    if not path.is_file():
        raise ValueError(f"graph file {str(path)!r} does not exist (resolved: {path.resolve()}); "
                         "give an existing .npy or .csv file")
    try:
        if path.suffix.lower() == ".npy":
            matrix = np.load(path, allow_pickle=False)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an empty file: reported below as shape (0,)
                matrix = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
    except (ValueError, OSError) as err:
        raise ValueError(f"graph file {str(path)!r} could not be read: {err}") from None
    try:
        return check_adjacency(matrix, num_clients)
    except ValueError as err:
        raise ValueError(f"graph file {str(path)!r}: {err}") from None


# --- what the clients report: label sets and ground truth (query.identify) -------------------------

NO_GROUP = -1  # IdentifyReply `groups`: the client's data has no group or domain field


@dataclass(frozen=True)
class ClientReport:
    """What one client said about its data in `query.identify` (one entry of `IdentifyReply`'s
    per-client lists): its distinct train labels (only when the run asked: `label-sharing`), its
    group (the partition's true cluster or first domain; local data: the majority of its npz `group`,
    else `domain`, array) and its train samples per domain id. None: not reported."""

    labels: tuple[int, ...] | None = None
    group: int | None = None
    domain_counts: tuple[int, ...] | None = None
    # a partition's client in a simulation whose partition has no clusters: its train samples per
    # label (the label-similarity ground truth); never reported with a node's own data
    label_counts: tuple[int, ...] | None = None

    @staticmethod
    def encode_ints(values: Any) -> str:
        """A list of ints as an IdentifyReply string entry ("3,0,7"; "" for none)."""
        return ",".join(str(int(v)) for v in values)

    @staticmethod
    def decode_ints(text: str, what: str) -> tuple[int, ...]:
        try:
            return tuple(int(v) for v in text.split(",")) if text else ()
        except ValueError:
            raise ValueError(f"identify reply: {what} entry {text!r} is not a comma-separated list "
                             "of integers") from None


def reports_of(info: Any) -> list[ClientReport]:
    """The `ClientReport` of every client an `IdentifyReply` hosts, in its order (slot: client-id
    order; named: `client-names` order)."""
    hosted = len(info.train_sizes)
    out = []
    for i in range(hosted):
        labels = (ClientReport.decode_ints(info.label_sets[i], "label-sets")
                  if info.label_sets else None)
        group = info.groups[i] if info.groups and info.groups[i] != NO_GROUP else None
        counts = (ClientReport.decode_ints(info.domain_counts[i], "domain-counts")
                  if info.domain_counts and info.domain_counts[i] else None)
        histogram = (ClientReport.decode_ints(info.label_counts[i], "label-counts")
                     if info.label_counts else None)
        out.append(ClientReport(labels, group, counts, histogram))
    return out


@dataclass(frozen=True, eq=False)
class ReportedTruth:
    """The ground truth the clients reported, in the shape method reporters read (the fields of a
    `datasets.partition.Partition` they use): `cluster_ids` (every client's group; a client left
    out of the run gets a group of its own, −1 − id), `label_graph` (from reported label sets) and
    the domain fields of a `domains` partition. Reporting only; any of them None when not every
    client reported it."""

    num_clients: int
    cluster_ids: np.ndarray | None = None
    label_graph: np.ndarray | None = None
    domain_names: tuple[str, ...] | None = None
    seen_domain_ids: frozenset[int] | None = None  # domains some training sample is in
    rotations: None = None  # (a Partition's per-client angles; the domain names carry them here)
    train_domains: None = None
    test_clients: None = None


class ClientReports:
    """Every client's `ClientReport` of a run, by client id, and what the server derives from them:
    the `label-sharing` graph (a method's given graph) and the ground truth of the reports (ARI,
    share of a graph inside true groups, NMI and per-domain accuracy of domain clusters). The server
    reads no data:
    what is not reported is absent, never rebuilt or guessed."""

    def __init__(self, num_clients: int, reports: dict[int, ClientReport],
                 left_out: Iterable[int] = (), train_sizes: dict[int, int] | None = None,
                 domain_names: tuple[str, ...] | None = None) -> None:
        self.num_clients = num_clients
        self.reports = dict(reports)
        self.left_out = frozenset(int(c) for c in left_out)
        self.train_sizes = dict(train_sizes or {})
        self.domain_names = domain_names

    def _present(self) -> list[int]:
        return [c for c in range(self.num_clients) if c not in self.left_out]

    def _all(self, field: str) -> bool:
        present = self._present()
        return bool(present) and all(
            c in self.reports and getattr(self.reports[c], field) is not None for c in present)

    def label_graph(self) -> np.ndarray | None:
        """float32 [K, K]: 1 where the label sets of clients i and j intersect, diagonal 1 (the
        partition's `label_graph` when the clients are a partition's); a client left out of the run
        shares no label. None unless every other client reported its label set."""
        if not self._all("labels"):
            return None
        sets = [self.reports[c].labels if c not in self.left_out else ()
                for c in range(self.num_clients)]
        present = np.zeros((self.num_clients, max((max(s) for s in sets if s), default=0) + 1),
                           dtype=np.float32)
        for client, labels in enumerate(sets):
            present[client, list(labels)] = 1.0
        graph = (present @ present.T > 0).astype(np.float32)
        np.fill_diagonal(graph, 1.0)
        return graph

    def required_label_graph(self, key: str) -> np.ndarray:
        """`label_graph` for the run-config `key` that asks for it; a ConfigError naming the key and
        the clients that reported no label set when one is missing."""
        graph = self.label_graph()
        if graph is None:
            from strategies.shared.settings import ConfigError

            missing = [c for c in self._present()
                       if c not in self.reports or self.reports[c].labels is None]
            raise ConfigError(f"run config: key '{key}' = 'label-sharing' builds the client graph "
                              f"from the label sets the clients report, but clients {missing[:8]} "
                              f"reported none (an older client app?); or set {key}='file' with "
                              f"{key}-file")
        return graph

    def reference_graph(self) -> np.ndarray | None:
        """The graph that orders a method's graph pictures: the label-sharing graph where every
        client reported its label set, else the true structure, else None."""
        graph = self.label_graph()
        if graph is None:
            structure = self.structure()
            graph = None if structure is None else structure[0]
        return graph

    def groups(self) -> np.ndarray | None:
        """int64 [K]: every client's reported group (left-out clients: −1 − id, a group of their
        own); None unless every other client reported one."""
        if not self._all("group"):
            return None
        return np.array([self.reports[c].group if c not in self.left_out else -1 - c
                         for c in range(self.num_clients)], dtype=np.int64)

    def structure(self) -> tuple[np.ndarray, str] | None:
        """The true structure a learned graph is scored against (`strategies.shared.graph`):
        `true-clusters`, 1 for two clients of the same reported group; else, where a partition's
        clients reported their train-label histograms, `label-similarity` (their cosine
        similarity); None without either."""
        groups = self.groups()
        if groups is not None:
            return (groups[:, None] == groups[None, :]).astype(np.float64), "true-clusters"
        if not self._all("label_counts"):
            return None
        width = max(len(self.reports[c].label_counts) for c in self._present())
        hist = np.zeros((self.num_clients, width), dtype=np.float64)
        for c in self._present():
            hist[c, :len(self.reports[c].label_counts)] = self.reports[c].label_counts
        norms = np.linalg.norm(hist, axis=1, keepdims=True)
        unit = hist / np.where(norms > 0, norms, 1.0)
        return np.clip(unit @ unit.T, 0.0, 1.0), "label-similarity"

    def seen_domains(self) -> frozenset[int] | None:
        """Domain ids some training sample is in (from the reported per-domain train counts; else
        the groups of the clients with training samples); None without groups."""
        if any(r.domain_counts is not None for r in self.reports.values()):
            return frozenset(d for r in self.reports.values() if r.domain_counts
                             for d, n in enumerate(r.domain_counts) if n > 0)
        groups = self.groups()
        if groups is None:
            return None
        return frozenset(int(groups[c]) for c in self._present() if self.train_sizes.get(c, 1) > 0)

    def truth(self) -> ReportedTruth | None:
        """What reporters read as the run's ground truth; None when the clients reported nothing."""
        groups, graph = self.groups(), self.label_graph()
        if groups is None and graph is None:
            return None
        names = self.domain_names
        if groups is not None and names is not None and groups.max(initial=-1) >= len(names):
            names = None  # the groups are not the configured domains
        return ReportedTruth(self.num_clients, groups, graph,
                             names if groups is not None else None,
                             self.seen_domains() if groups is not None else None)

    def describe(self) -> str:
        """One log line: what the clients reported."""
        parts = [f"groups from {sum(r.group is not None for r in self.reports.values())}",
                 f"label histograms from "
                 f"{sum(r.label_counts is not None for r in self.reports.values())}",
                 f"per-domain counts from "
                 f"{sum(r.domain_counts is not None for r in self.reports.values())}",
                 f"label sets from {sum(r.labels is not None for r in self.reports.values())}"]
        return f"of {len(self.reports)} clients: " + ", ".join(parts)


@runtime_checkable
class TakesClientReports(Protocol):
    """A strategy that uses what the clients report in `query.identify`. `label_sets_key`: the run
    config key whose `label-sharing` needs the clients' label sets (None: the run asks for none);
    the runner hands the reports to `take_reports` once every client has identified itself, before
    round 1."""

    label_sets_key: str | None

    def take_reports(self, reports: ClientReports) -> None: ...


def true_structure(partition: Any, labels: np.ndarray | None = None) -> tuple[np.ndarray, str] | None:
    """The ground truth a learned client graph is scored against, [K, K] in [0, 1], and its name.

    `true-clusters`: 1 for two clients of the same true cluster (label-clusters, domains: the
    partition's `cluster_ids`). Otherwise `label-similarity`: the cosine similarity of two clients'
    train-label histograms (needs the source `labels`), which stays informative where every pair
    shares some label (Dirichlet) and a binary label-sharing graph would be complete. Without
    either: `label-sharing`, the partition's binary label graph. None when nothing is known."""
    if partition is None:
        return None
    clusters = getattr(partition, "cluster_ids", None)
    if clusters is not None:
        clusters = np.asarray(clusters)
        return (clusters[:, None] == clusters[None, :]).astype(np.float64), "true-clusters"
    if labels is not None:
        labels = np.asarray(labels)
        classes = int(labels.max()) + 1 if labels.size else 1
        hist = np.stack([np.bincount(labels[idx], minlength=classes) for idx in
                         partition.train_indices]).astype(np.float64)
        norms = np.linalg.norm(hist, axis=1, keepdims=True)
        unit = hist / np.where(norms > 0, norms, 1.0)
        return np.clip(unit @ unit.T, 0.0, 1.0), "label-similarity"
    return np.asarray(partition.label_graph, dtype=np.float64), "label-sharing"


def structure_truth(cfg: RunConfig) -> tuple[np.ndarray, str] | None:
    """The true client structure of the run's partition, rebuilt from the data set, for offline
    analysis that holds the whole data set (benchmarks); the ServerApp never calls it (its truth is
    what the clients report, `ClientReports`). Same true cluster where the partition has clusters,
    else the clients' label-histogram similarity; None when the data set is not available."""
    from datasets.federated import load_partition
    from datasets.sources import DataNotFoundError, dataset_task

    try:
        source, partition = load_partition(cfg.data_spec)
    except (DataNotFoundError, OSError):
        return None
    labels = (getattr(source, "labels", None) if dataset_task(cfg.dataset) == "classification"
              else None)
    return true_structure(partition, labels)


def road_graph(cfg: RunConfig) -> np.ndarray:
    """The traffic data set's sensor graph (Gaussian kernel, self-loops) for the K client sensors."""
    from datasets import traffic

    return traffic.road_graph(cfg.dataset, cfg.data_root, cfg.num_clients,
                              cfg.data_spec.traffic_days)


def given_graph(cfg: RunConfig, source: str, graph_file: str, key: str,
                reports: ClientReports | None = None) -> np.ndarray | None:
    """A given client graph [K, K] for a method's `<key>` setting, checked (square, K = num-clients,
    finite, non-negative): `label-sharing` (from the label sets the clients report in
    `query.identify`: `reports`; None while they have not yet reported, the strategy then takes it
    from `take_reports`), `road` (a traffic data set's sensor graph) or `file` (`<key>-file`,
    .npy/.csv). A ConfigError names the key, the value and what is allowed."""
    from datasets import traffic
    from datasets.sources import DataNotFoundError, dataset_task
    from strategies.shared.settings import ConfigError

    def invalid(why: str, name: str = key, value: Any = source) -> ConfigError:
        return ConfigError(f"run config: key '{name}' = {value!r} is invalid: {why}")

    if source == "file":
        try:
            return read_adjacency(graph_file, cfg.num_clients)
        except ValueError as err:
            raise invalid(str(err), f"{key}-file", graph_file) from None
    if source == "road":
        if cfg.dataset not in traffic.TRAFFIC_DATASETS:
            raise invalid(f"the road graph comes with the traffic data sets "
                          f"({', '.join(traffic.TRAFFIC_DATASETS)}), not dataset '{cfg.dataset}'; "
                          "use 'label-sharing' or 'file'")
        try:
            graph = road_graph(cfg)
        except (DataNotFoundError, OSError, ValueError) as err:
            raise invalid(f"the road graph could not be read: {err}") from None
    elif source == "label-sharing":
        if dataset_task(cfg.dataset) != "classification":
            raise invalid(f"dataset '{cfg.dataset}' has no labels to share; use 'road' or 'file'")
        if reports is None:
            return None
        graph = reports.required_label_graph(key)
    else:
        raise invalid("allowed: 'label-sharing', 'road', 'file'")
    try:
        return check_adjacency(graph, cfg.num_clients)
    except ValueError as err:
        raise invalid(str(err)) from None
