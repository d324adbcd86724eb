"""Split a labelled data set among simulated clients (IID, label skew, clusters, domains, writers).

``make_partition`` is a pure function of (labels, spec, groups): every random draw
comes from ``np.random.SeedSequence(spec.seed)``, so all processes of a simulation
derive the same partition independently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datasets.domains import DOMAIN_FAMILIES, check_domain_names

PARTITION_SCHEMES: tuple[str, ...] = (
    "iid", "dirichlet", "shards", "label-clusters", "domains", "natural",
    "sensors",  # traffic only: one client per sensor (datasets/federated.py, datasets/traffic.py)
    "structured",  # FLT's structured non-IID: label clusters, power-law sizes, official test split
)
_DIRICHLET_ATTEMPTS = 100


@dataclass(frozen=True)
class PartitionSpec:
    """How to split a data set among clients; hashable so it can key caches."""

    scheme: str  # one of PARTITION_SCHEMES
    num_clients: int
    seed: int = 0
    test_fraction: float = 0.2
    alpha: float = 0.5  # dirichlet concentration
    shards_per_client: int = 2  # shards (q)
    num_clusters: int = 5  # label-clusters (C)
    labels_per_cluster: int = 2  # label-clusters (L)
    power_law: bool = False  # label-clusters: power-law client sizes within a cluster
    rotations: tuple[float, ...] = (0.0, 90.0, 180.0, 270.0)  # domains, degrees
    max_samples_per_client: int = 0  # 0 = no cap; else cap each client's pool before the split
    test_clients: float = 0.0  # domains: share of clients held out whole as test clients (0 = none)
    unseen_rotations: tuple[float, ...] = ()  # domains: angles only held-out test clients see
    family: str = "rotations"  # domains: "rotations" or "styles" (datasets.domains)
    styles: tuple[str, ...] = ("plain", "inverted", "noisy", "thick")  # domains, family "styles"
    unseen_styles: tuple[str, ...] = ()  # domains: styles only held-out test clients see
    domains_per_client: int = 1  # domains: k domains per train client, its images split between them

    def __post_init__(self) -> None:
        # A list of rotations (e.g. from a config file) would make the spec unhashable.
        object.__setattr__(self, "rotations", tuple(float(r) for r in self.rotations))
        object.__setattr__(self, "unseen_rotations", tuple(float(r) for r in self.unseen_rotations))
        object.__setattr__(self, "styles", tuple(self.styles))
        object.__setattr__(self, "unseen_styles", tuple(self.unseen_styles))

    @property
    def domain_names(self) -> tuple[str, ...]:
        """Names of the seen then the unseen domains of the chosen family (an angle: its degrees)."""
        if self.family == "styles":
            return self.styles + self.unseen_styles
        return tuple(f"{angle:g}" for angle in self.rotations + self.unseen_rotations)

    @property
    def num_seen_domains(self) -> int:
        return len(self.styles) if self.family == "styles" else len(self.rotations)


@dataclass(frozen=True, eq=False)
class Partition:
    """Per-client train/test indices into the source arrays plus ground truth about the split."""

    train_indices: tuple[np.ndarray, ...]  # per client, int64, sorted
    test_indices: tuple[np.ndarray, ...]  # per client, int64, sorted, disjoint from train
    cluster_ids: np.ndarray | None  # int64 [K]: label cluster / domain per client, else None
    label_graph: np.ndarray  # float32 [K, K]: 1 where two clients share a train label; diagonal 1
    rotations: np.ndarray | None  # float64 [K] degrees per client for rotation "domains", else None
    test_clients: np.ndarray | None = None  # int64 ids of held-out test clients ("domains"), else None
    # "domains": per image, the id of its true domain (aligned with train_indices / test_indices),
    # and the domains' names (ids index them); cluster_ids then holds each client's first domain
    train_domains: tuple[np.ndarray, ...] | None = None
    test_domains: tuple[np.ndarray, ...] | None = None
    domain_names: tuple[str, ...] | None = None

    @property
    def num_clients(self) -> int:
        return len(self.train_indices)


def make_partition(labels: np.ndarray, spec: PartitionSpec, groups: np.ndarray | None = None,
                   train_count: int = 0) -> Partition:
    """Split sample indices ``0..len(labels)-1`` among ``spec.num_clients`` clients, each into train/test.

    ``groups`` (one natural group id per sample, e.g. a FEMNIST writer) is needed by "natural" only;
    ``train_count`` (samples ``0..train_count-1`` are the official train split) by "structured" only.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels must be >= 0, got minimum {labels.min()}")
    _validate(spec, len(labels))
    if spec.scheme == "structured":
        return _structured(labels, spec, train_count)
    pool_rng, cap_rng, split_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(3))
    pools, cluster_ids, rotations = _assign_pools(labels, spec, groups, pool_rng)
    if spec.max_samples_per_client > 0:
        pools = [_cap(pool, spec.max_samples_per_client, cap_rng) for pool in pools]
    image_domain = _image_domains(pools, spec, len(labels)) if spec.scheme == "domains" else None
    held_out = heldout_test_clients(spec)
    if held_out is None:
        splits = [_split_train_test(pool, spec.test_fraction, split_rng) for pool in pools]
    else:  # whole clients: a train client keeps all its pool for training, a test client for test
        empty = np.empty(0, dtype=np.int64)
        splits = [(empty, np.sort(pool)) if client in held_out else (np.sort(pool), empty)
                  for client, pool in enumerate(np.asarray(p, dtype=np.int64) for p in pools)]
    train = tuple(train for train, _ in splits)
    test = tuple(test for _, test in splits)
    per_image = {}
    if image_domain is not None:
        per_image = dict(train_domains=tuple(image_domain[t] for t in train),
                         test_domains=tuple(image_domain[t] for t in test),
                         domain_names=spec.domain_names)
    return Partition(
        train_indices=train,
        test_indices=test,
        cluster_ids=cluster_ids,
        label_graph=label_graph(labels, train),
        rotations=rotations,
        test_clients=held_out,
        **per_image,
    )


def heldout_test_clients(spec: PartitionSpec) -> np.ndarray | None:
    """Ids of the whole clients held out for testing under "domains" with ``test_clients`` > 0: the
    last T = round(test_clients·K) ids (at least 1, at most K − 1); None when clients are not held out.

    Train clients 0..K−T−1 take the seen domains in turn; test client j (0-based among the test
    clients) takes domain j mod (D + U) of the seen + unseen domains (``rotations + unseen_rotations``
    or ``styles + unseen_styles``), so with at least D + U test clients every seen and every unseen
    domain has test clients. A test client always holds one domain (``domains_per_client`` applies
    to train clients).
    """
    if spec.test_clients <= 0:
        return None
    k = spec.num_clients
    count = min(max(int(np.floor(spec.test_clients * k + 0.5)), 1), k - 1)
    return np.arange(k - count, k, dtype=np.int64)


def label_graph(labels: np.ndarray, index_sets: tuple[np.ndarray, ...] | list[np.ndarray]) -> np.ndarray:
    """float32 [K, K]: 1 where the label sets of clients i and j intersect; diagonal always 1."""
    num_labels = int(labels.max()) + 1 if labels.size else 1
    present = np.zeros((len(index_sets), num_labels), dtype=np.float32)
    for client, indices in enumerate(index_sets):
        present[client, labels[indices]] = 1.0
    graph = (present @ present.T > 0).astype(np.float32)
    np.fill_diagonal(graph, 1.0)
    return graph


# --- validation -----------------------------------------------------------------------------


def _validate(spec: PartitionSpec, num_samples: int) -> None:
    """Reject bad spec values with a message naming the parameter, its value and what is allowed."""
    checks = [
        (spec.scheme in PARTITION_SCHEMES, "scheme", spec.scheme, f"one of {', '.join(PARTITION_SCHEMES)}"),
        (spec.num_clients >= 1, "num_clients", spec.num_clients, "an integer >= 1"),
        (spec.num_clients <= num_samples, "num_clients", spec.num_clients,
         f"at most the number of samples ({num_samples})"),
        (0.0 <= spec.test_fraction < 1.0, "test_fraction", spec.test_fraction, "a value in [0, 1)"),
        (spec.alpha > 0, "alpha", spec.alpha, "a value > 0"),
        (spec.shards_per_client >= 1, "shards_per_client", spec.shards_per_client, "an integer >= 1"),
        (spec.num_clusters >= 1, "num_clusters", spec.num_clusters, "an integer >= 1"),
        (spec.labels_per_cluster >= 1, "labels_per_cluster", spec.labels_per_cluster, "an integer >= 1"),
        (len(spec.rotations) >= 1, "rotations", spec.rotations, "a non-empty tuple of degrees"),
        (spec.max_samples_per_client >= 0, "max_samples_per_client", spec.max_samples_per_client,
         "0 (no cap) or a positive integer"),
        (0.0 <= spec.test_clients < 1.0, "test_clients", spec.test_clients, "a share in [0, 1)"),
        (spec.test_clients == 0 or spec.scheme == "domains", "test_clients", spec.test_clients,
         "0 unless the scheme is 'domains' (held-out test clients are a 'domains' option)"),
        (spec.test_clients == 0 or spec.num_clients >= 2, "num_clients", spec.num_clients,
         ">= 2 when test clients are held out (at least one train and one test client)"),
        (not spec.unseen_rotations or spec.test_clients > 0, "unseen_rotations", spec.unseen_rotations,
         "empty unless test clients are held out (only test clients see unseen domains)"),
        (not spec.unseen_styles or spec.test_clients > 0, "unseen_styles", spec.unseen_styles,
         "empty unless test clients are held out (only test clients see unseen domains)"),
        (spec.family in DOMAIN_FAMILIES, "family", spec.family, f"one of {', '.join(DOMAIN_FAMILIES)}"),
        (spec.family != "styles" or len(spec.styles) >= 1, "styles", spec.styles, "a non-empty tuple of styles"),
        (1 <= spec.domains_per_client <= spec.num_seen_domains, "domains_per_client",
         spec.domains_per_client, f"between 1 and the {spec.num_seen_domains} seen domains"),
    ]
    for ok, name, value, allowed in checks:
        if not ok:
            raise ValueError(f"invalid {name}={value!r}: must be {allowed}")
    if spec.scheme == "domains":
        check_domain_names(spec.family, spec.domain_names)


def _require(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"invalid {name}={value!r}: {allowed}")


# --- schemes --------------------------------------------------------------------------------

_Pools = tuple[list[np.ndarray], np.ndarray | None, np.ndarray | None]


def _assign_pools(
    labels: np.ndarray, spec: PartitionSpec, groups: np.ndarray | None, rng: np.random.Generator
) -> _Pools:
    """Per-client sample pools plus (cluster_ids, rotations) for the chosen scheme."""
    k = spec.num_clients
    if spec.scheme == "sensors":
        raise ValueError("scheme 'sensors' (one client per sensor) splits the traffic data sets only: "
                         "metr-la, pems-bay, traffic-synthetic")
    if spec.scheme == "iid":
        return _iid(len(labels), k, rng), None, None
    if spec.scheme == "dirichlet":
        return _dirichlet(labels, k, spec.alpha, rng), None, None
    if spec.scheme == "shards":
        return _shards(labels, k, spec.shards_per_client, rng), None, None
    if spec.scheme == "label-clusters":
        return _label_clusters(labels, spec, rng)
    if spec.scheme == "domains":
        domains = client_domains(spec)[:, 0].copy()
        angles = None
        if spec.family == "rotations":
            angles = np.asarray(spec.rotations + spec.unseen_rotations, dtype=np.float64)[domains]
        return _iid(len(labels), k, rng), domains, angles
    return _natural(groups, len(labels), k, rng), None, None


def client_domains(spec: PartitionSpec) -> np.ndarray:
    """int64 [K, k]: the domains of every client under "domains". Train client i holds the seen
    domains i, i+1, ..., i+k−1 (mod the number of seen domains), so with k ≥ 2 neighbouring
    clients share domains and no client is one domain; a held-out test client holds one domain
    (see ``heldout_test_clients``) and its row repeats it."""
    seen, k = spec.num_seen_domains, spec.domains_per_client
    rows = (np.arange(spec.num_clients)[:, None] + np.arange(k)[None, :]) % seen
    held_out = heldout_test_clients(spec)
    if held_out is not None:  # test clients cycle over seen + unseen domains
        rows[held_out] = (np.arange(len(held_out)) % len(spec.domain_names))[:, None]
    return rows.astype(np.int64)


def _image_domains(pools: list[np.ndarray], spec: PartitionSpec, num_samples: int) -> np.ndarray:
    """int64 [N]: each pooled sample's true domain (−1 outside every pool). A client's (shuffled)
    pool is cut into as many near-equal parts as it has distinct domains, part j in domain j."""
    domain_of = np.full(num_samples, -1, dtype=np.int64)
    for pool, row in zip(pools, client_domains(spec)):
        mine = list(dict.fromkeys(row.tolist()))  # distinct, in order
        for part, domain in zip(np.array_split(np.asarray(pool, dtype=np.int64), len(mine)), mine):
            domain_of[part] = domain
    return domain_of


def _iid(num_samples: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle, then K contiguous pools whose sizes differ by at most one."""
    return list(np.array_split(rng.permutation(num_samples), k))


def _dirichlet(labels: np.ndarray, k: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Label skew: each class is spread over clients with proportions ~ Dir(alpha * 1_K).

    Draws again (up to 100 times) until every client holds at least 2 samples.
    """
    _require(2 * k <= len(labels), "num_clients", k,
             f"dirichlet needs at least 2 samples per client ({len(labels)} samples available)")
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(_DIRICHLET_ATTEMPTS):
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        for indices in by_class:
            shuffled = rng.permutation(indices)
            cuts = (np.cumsum(rng.dirichlet(np.full(k, alpha)))[:-1] * len(shuffled)).astype(np.int64)
            for client, chunk in enumerate(np.split(shuffled, cuts)):
                parts[client].append(chunk)
        pools = [np.concatenate(chunks) for chunks in parts]
        if min(len(pool) for pool in pools) >= 2:
            return pools
    raise ValueError(
        f"dirichlet partition with alpha={alpha} and num_clients={k} left some client with < 2 samples "
        f"in {_DIRICHLET_ATTEMPTS} draws; use a larger alpha or fewer clients"
    )


def _shards(labels: np.ndarray, k: int, q: int, rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al. shards: sort by label, cut K*q equal shards (remainder dropped), q random shards each."""
    num_shards = k * q
    _require(num_shards <= len(labels), "shards_per_client", q,
             f"num_clients * shards_per_client = {num_shards} exceeds the {len(labels)} samples")
    shuffled = rng.permutation(len(labels))
    ordered = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shard_size = len(labels) // num_shards
    shards = ordered[: num_shards * shard_size].reshape(num_shards, shard_size)
    return [shards[chosen].reshape(-1) for chosen in rng.permutation(num_shards).reshape(k, q)]


def _label_clusters(labels: np.ndarray, spec: PartitionSpec, rng: np.random.Generator) -> _Pools:
    """C clusters own disjoint label groups {c*L, ..., c*L+L-1}; clients form C contiguous blocks.

    Client blocks come from ``np.array_split(range(K), C)`` (sizes differ by <= 1). Each
    cluster's samples are shuffled and split among its clients: near-equal sizes, or
    power-law sizes (see ``_power_law_sizes``). Labels outside every group are unused.
    """
    k, c, per = spec.num_clients, spec.num_clusters, spec.labels_per_cluster
    num_classes = int(labels.max()) + 1
    _require(c * per <= num_classes, "num_clusters", c,
             f"num_clusters * labels_per_cluster = {c} * {per} = {c * per} exceeds the {num_classes} classes")
    _require(c <= k, "num_clusters", c, f"needs at least one client per cluster (num_clients={k})")
    cluster_ids = np.empty(k, dtype=np.int64)
    pools: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * k
    for cluster, members in enumerate(np.array_split(np.arange(k), c)):
        cluster_ids[members] = cluster
        samples = rng.permutation(np.flatnonzero((labels >= cluster * per) & (labels < (cluster + 1) * per)))
        minimum = 2 if spec.power_law else 1
        _require(len(samples) >= minimum * len(members), "num_clients", k,
                 f"cluster {cluster} has {len(samples)} samples for {len(members)} clients "
                 f"(needs >= {minimum} per client)")
        if spec.power_law:
            chunks = np.split(samples, np.cumsum(_power_law_sizes(len(samples), len(members)))[:-1])
        else:
            chunks = np.array_split(samples, len(members))
        for client, chunk in zip(members, chunks):
            pools[client] = chunk
    return pools, cluster_ids, None


def _power_law_sizes(total: int, k: int) -> np.ndarray:
    """Zipf-like sizes: client j of a cluster gets ~ total * (j+1)^-1 / H_k, and always >= 2 samples."""
    weights = 1.0 / np.arange(1, k + 1)
    sizes = 2 + np.floor(weights / weights.sum() * (total - 2 * k)).astype(np.int64)
    sizes[0] += total - sizes.sum()
    return sizes


def _natural(groups: np.ndarray | None, num_samples: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One client per natural group (writer); with more groups than clients, a seeded choice of K."""
    if groups is None:
        raise ValueError("scheme 'natural' needs per-sample groups (the LEAF sources femnist, shakespeare and celeba provide them)")
    groups = np.asarray(groups)
    _require(groups.shape == (num_samples,), "groups", f"array of shape {groups.shape}",
             f"must hold one group id per sample ({num_samples})")
    order = np.argsort(groups, kind="stable")
    names, starts = np.unique(groups[order], return_index=True)
    _require(len(names) >= k, "num_clients", k, f"exceeds the {len(names)} natural groups of the data")
    members = np.split(order, starts[1:])
    return [members[g] for g in rng.permutation(len(names))[:k]]


# --- per-client post-processing -------------------------------------------------------------


def _cap(pool: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    """Deterministic subsample of at most ``cap`` indices."""
    return pool if len(pool) <= cap else rng.choice(pool, size=cap, replace=False)


def _split_train_test(pool: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled disjoint split; with fraction > 0 a pool of >= 2 samples gets >= 1 test and >= 1 train sample."""
    shuffled = rng.permutation(np.asarray(pool, dtype=np.int64))
    num_test = int(np.floor(fraction * len(shuffled) + 0.5))
    if fraction > 0 and len(shuffled) >= 2:
        num_test = min(max(num_test, 1), len(shuffled) - 1)
    return np.sort(shuffled[num_test:]), np.sort(shuffled[:num_test])


# --- FLT's structured non-IID ---------------------------------------------------------------


def structured_sizes(total: int, clients: int) -> np.ndarray:
    """FLT's power-law client sizes within a cluster: n_j = ⌊F + exp(x·j²)⌋ for j = 1..M, F = ⌊K/(2M)⌋,
    x solved (bisection) so that Σ_j (F + exp(x·j²)) = K; the rounding remainder goes to client 1."""
    _require(total >= 2 * clients, "num_clients", clients,
             f"a cluster of {total} train samples takes at most {total // 2} clients (>= 2 samples each)")
    j2 = np.arange(1, clients + 1, dtype=np.float64) ** 2
    floor = float(total // (2 * clients))

    def excess(x: float) -> float:
        return float(np.sum(floor + np.exp(x * j2))) - total

    low, high = -1.0, np.log(float(total)) / j2[-1] + 1e-12  # excess(low) < 0 <= excess(high)
    for _ in range(200):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if excess(middle) < 0 else (low, middle)
    sizes = np.floor(floor + np.exp(high * j2)).astype(np.int64)
    sizes[0] += total - int(sizes.sum())
    if sizes[0] < 0:  # the solved sum overshot by rounding: take the surplus from the largest
        sizes[-1] += sizes[0]
        sizes[0] = 0
    return sizes


def _structured(labels: np.ndarray, spec: PartitionSpec, train_count: int) -> Partition:
    """FLT's "Structured Non-IID" (EMNIST balanced): C = num_clusters clusters of L = labels_per_cluster
    classes in order (0..L−1, L..2L−1, ...; the last cluster takes the classes left, e.g. 2 of 47 with
    C=10, L=5); clients form C contiguous blocks; a cluster's official-train samples, sorted by class,
    are cut in order into power-law sizes (`structured_sizes`); every client of a cluster tests on all
    official-test samples of its cluster's classes. With max_samples_per_client > 0 each client's
    train and test sets are capped by a seeded subsample."""
    k, c, per = spec.num_clients, spec.num_clusters, spec.labels_per_cluster
    _require(0 < train_count < len(labels), "scheme", "structured",
             "needs a data set with an official train/test split (emnist: train then test); this one "
             f"gives none (train_count={train_count} of {len(labels)} samples)")
    num_classes = int(labels.max()) + 1
    _require((c - 1) * per < num_classes, "num_clusters", c,
             f"(num_clusters - 1) * labels_per_cluster = {(c - 1) * per} leaves the last cluster no "
             f"class of the {num_classes}")
    _require(c <= k, "num_clusters", c, f"needs at least one client per cluster (num_clients={k})")
    cap_rng = np.random.default_rng(np.random.SeedSequence(spec.seed).spawn(3)[1])
    is_train = np.arange(len(labels)) < train_count
    cluster_ids = np.empty(k, dtype=np.int64)
    train: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * k
    test: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * k
    for cluster, members in enumerate(np.array_split(np.arange(k), c)):
        cluster_ids[members] = cluster
        classes = np.arange(cluster * per, min((cluster + 1) * per, num_classes))
        mine = np.isin(labels, classes)
        pool = np.flatnonzero(mine & is_train)
        pool = pool[np.argsort(labels[pool], kind="stable")]  # classes in order
        held = np.flatnonzero(mine & ~is_train)
        sizes = structured_sizes(len(pool), len(members))
        for client, chunk in zip(members, np.split(pool, np.cumsum(sizes)[:-1])):
            train[client], test[client] = chunk, held
    if spec.max_samples_per_client > 0:
        train = [_cap(pool, spec.max_samples_per_client, cap_rng) for pool in train]
        test = [_cap(pool, spec.max_samples_per_client, cap_rng) for pool in test]
    train_t = tuple(np.sort(np.asarray(t, dtype=np.int64)) for t in train)
    return Partition(
        train_indices=train_t,
        test_indices=tuple(np.sort(np.asarray(t, dtype=np.int64)) for t in test),
        cluster_ids=cluster_ids,
        label_graph=label_graph(labels, train_t),
        rotations=None,
    )
