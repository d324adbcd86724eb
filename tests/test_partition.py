"""Tests for datasets.partition: sizes, label sets, determinism, graph, validation."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from datasets.partition import PARTITION_SCHEMES, Partition, PartitionSpec, label_graph, make_partition


def _balanced_labels(num_classes: int = 10, per_class: int = 100, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def _pool_sizes(partition: Partition) -> list[int]:
    return [len(tr) + len(te) for tr, te in zip(partition.train_indices, partition.test_indices)]


def _label_sets(labels: np.ndarray, partition: Partition) -> list[set[int]]:
    return [set(np.unique(labels[np.concatenate([tr, te])]).tolist())
            for tr, te in zip(partition.train_indices, partition.test_indices)]


def _assert_well_formed(partition: Partition, num_samples: int) -> None:
    """Indices are int64, train/test disjoint per client, and no sample goes to two clients."""
    seen: list[np.ndarray] = []
    for train, test in zip(partition.train_indices, partition.test_indices):
        assert train.dtype == np.int64 and test.dtype == np.int64
        assert not set(train.tolist()) & set(test.tolist())
        seen += [train, test]
    everything = np.concatenate(seen)
    assert len(np.unique(everything)) == len(everything)
    assert everything.min() >= 0 and everything.max() < num_samples


ALL_SPECS = [
    PartitionSpec("iid", 7),
    PartitionSpec("dirichlet", 8, alpha=0.3),
    PartitionSpec("shards", 10, shards_per_client=3),
    PartitionSpec("label-clusters", 9, num_clusters=3, labels_per_cluster=3),
    PartitionSpec("label-clusters", 9, num_clusters=3, labels_per_cluster=3, power_law=True),
    PartitionSpec("domains", 6),
]


def test_scheme_names() -> None:
    assert PARTITION_SCHEMES == ("iid", "dirichlet", "shards", "label-clusters", "domains", "natural", "sensors",
                                 "structured")


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: f"{s.scheme}-pl{s.power_law}")
def test_well_formed_and_deterministic(spec: PartitionSpec) -> None:
    labels = _balanced_labels()
    first = make_partition(labels, spec)
    _assert_well_formed(first, len(labels))
    assert first.num_clients == spec.num_clients
    again = make_partition(labels, spec)
    for a, b in zip(first.train_indices + first.test_indices, again.train_indices + again.test_indices):
        np.testing.assert_array_equal(a, b)
    other = make_partition(labels, replace(spec, seed=1))
    assert any(not np.array_equal(a, b) for a, b in zip(first.train_indices, other.train_indices))


def test_iid_sizes_within_one() -> None:
    partition = make_partition(_balanced_labels(per_class=103), PartitionSpec("iid", 7))
    sizes = _pool_sizes(partition)
    assert sum(sizes) == 1030 and max(sizes) - min(sizes) <= 1
    assert partition.cluster_ids is None and partition.rotations is None


def test_train_test_split_fraction() -> None:
    partition = make_partition(_balanced_labels(), PartitionSpec("iid", 10, test_fraction=0.25))
    assert all(len(te) == 25 and len(tr) == 75 for tr, te in zip(partition.train_indices, partition.test_indices))
    tiny = make_partition(np.array([0, 1, 0, 1]), PartitionSpec("iid", 2, test_fraction=0.1))
    assert [len(te) for te in tiny.test_indices] == [1, 1]  # >= 1 test sample once a pool has 2
    no_test = make_partition(np.array([0, 1, 0, 1]), PartitionSpec("iid", 2, test_fraction=0.0))
    assert [len(tr) for tr in no_test.train_indices] == [2, 2]


def test_shards_exact_sizes_and_labels() -> None:
    labels = _balanced_labels(per_class=100)  # 1000 samples, 20 shards of 50 -> each shard one label
    partition = make_partition(labels, PartitionSpec("shards", 10, shards_per_client=2))
    assert _pool_sizes(partition) == [100] * 10
    assert all(1 <= len(s) <= 2 for s in _label_sets(labels, partition))
    for train, test in zip(partition.train_indices, partition.test_indices):
        counts = np.bincount(labels[np.concatenate([train, test])])
        assert set(counts[counts > 0].tolist()) <= {50, 100}  # whole shards of a single label


def test_shards_drop_remainder() -> None:
    labels = _balanced_labels(per_class=101)  # 1010 samples, 30 shards of 33, 20 samples dropped
    partition = make_partition(labels, PartitionSpec("shards", 10, shards_per_client=3))
    assert _pool_sizes(partition) == [99] * 10
    assert all(len(s) <= 2 * 3 for s in _label_sets(labels, partition))  # a shard spans <= 2 labels


def test_label_clusters_disjoint_groups_equal_sizes() -> None:
    labels = _balanced_labels(per_class=60)
    spec = PartitionSpec("label-clusters", 10, num_clusters=5, labels_per_cluster=2)
    partition = make_partition(labels, spec)
    np.testing.assert_array_equal(partition.cluster_ids, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    assert _pool_sizes(partition) == [60] * 10
    for client, label_set in enumerate(_label_sets(labels, partition)):
        cluster = partition.cluster_ids[client]
        assert label_set <= {2 * cluster, 2 * cluster + 1}
    assert partition.rotations is None


def test_label_clusters_uneven_blocks_and_unused_labels() -> None:
    labels = _balanced_labels(per_class=30)
    partition = make_partition(labels, PartitionSpec("label-clusters", 7, num_clusters=3, labels_per_cluster=3))
    np.testing.assert_array_equal(partition.cluster_ids, [0, 0, 0, 1, 1, 2, 2])
    used = np.concatenate(partition.train_indices + partition.test_indices)
    assert set(np.unique(labels[used]).tolist()) == set(range(9))  # label 9 is in no group
    sizes = _pool_sizes(partition)
    assert sizes[:3] == [30, 30, 30] and sizes[3:] == [45, 45, 45, 45]


def test_label_clusters_power_law_sizes() -> None:
    labels = _balanced_labels(per_class=200)
    spec = PartitionSpec("label-clusters", 10, num_clusters=2, labels_per_cluster=5, power_law=True)
    sizes = np.array(_pool_sizes(make_partition(labels, spec)))
    assert sizes.min() >= 2 and sizes[:5].sum() == 1000 and sizes[5:].sum() == 1000
    assert all(np.all(np.diff(block) <= 0) for block in (sizes[:5], sizes[5:]))  # decreasing within a cluster
    assert sizes.max() > 3 * sizes.min()


def test_label_clusters_too_many_labels() -> None:
    spec = PartitionSpec("label-clusters", 10, num_clusters=4, labels_per_cluster=3)
    with pytest.raises(ValueError, match=r"num_clusters.*4 \* 3 = 12.*10 classes"):
        make_partition(_balanced_labels(), spec)


def test_dirichlet_smaller_alpha_more_skew() -> None:
    labels = _balanced_labels(per_class=200)

    def mean_labels(alpha: float) -> float:
        partition = make_partition(labels, PartitionSpec("dirichlet", 20, alpha=alpha))
        return float(np.mean([len(s) for s in _label_sets(labels, partition)]))

    assert mean_labels(0.1) < 5.0 < 9.5 < mean_labels(100.0)
    sizes = _pool_sizes(make_partition(labels, PartitionSpec("dirichlet", 20, alpha=0.1)))
    assert sum(sizes) == 2000 and min(sizes) >= 2


def test_dirichlet_gives_up_with_clear_error() -> None:
    labels = np.repeat(np.arange(10), 3)  # 30 samples for 15 clients at tiny alpha
    with pytest.raises(ValueError, match="alpha=0.001.*num_clients=15"):
        make_partition(labels, PartitionSpec("dirichlet", 15, alpha=0.001))


def test_domains_rotations_cyclic() -> None:
    partition = make_partition(_balanced_labels(), PartitionSpec("domains", 6, rotations=(0.0, 90.0, 45.0)))
    np.testing.assert_array_equal(partition.rotations, [0, 90, 45, 0, 90, 45])
    np.testing.assert_array_equal(partition.cluster_ids, [0, 1, 2, 0, 1, 2])
    sizes = _pool_sizes(partition)
    assert max(sizes) - min(sizes) <= 1


def test_natural_groups() -> None:
    groups = np.repeat(np.arange(5), [3, 4, 5, 6, 7])
    labels = np.arange(len(groups)) % 3
    partition = make_partition(labels, PartitionSpec("natural", 3), groups=groups)
    _assert_well_formed(partition, len(labels))
    chosen = [set(groups[np.concatenate([tr, te])].tolist()) for tr, te in
              zip(partition.train_indices, partition.test_indices)]
    assert all(len(c) == 1 for c in chosen) and len(set.union(*chosen)) == 3
    for client, (group,) in enumerate(chosen):  # a client holds its whole writer
        assert _pool_sizes(partition)[client] == int(np.sum(groups == group))
    with pytest.raises(ValueError, match="groups"):
        make_partition(labels, PartitionSpec("natural", 3))
    with pytest.raises(ValueError, match="num_clients=6.*5 natural groups"):
        make_partition(labels, PartitionSpec("natural", 6), groups=groups)


def test_max_samples_per_client_caps_deterministically() -> None:
    labels = _balanced_labels()
    spec = PartitionSpec("iid", 4, max_samples_per_client=30)
    first, again = make_partition(labels, spec), make_partition(labels, spec)
    assert _pool_sizes(first) == [30] * 4
    for a, b in zip(first.train_indices, again.train_indices):
        np.testing.assert_array_equal(a, b)
    uncapped = make_partition(labels, PartitionSpec("iid", 4))
    for capped, full_train, full_test in zip(first.train_indices, uncapped.train_indices, uncapped.test_indices):
        assert set(capped.tolist()) <= set(np.concatenate([full_train, full_test]).tolist())


def test_label_graph_hand_made() -> None:
    labels = np.array([0, 1, 2, 3, 1])
    index_sets = [np.array([0, 1]), np.array([2]), np.array([4, 3]), np.array([], dtype=np.int64)]
    expected = np.array([[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=np.float32)
    graph = label_graph(labels, index_sets)
    assert graph.dtype == np.float32
    np.testing.assert_array_equal(graph, expected)


def test_partition_label_graph_uses_train_labels() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    spec = PartitionSpec("label-clusters", 4, num_clusters=4, labels_per_cluster=1, test_fraction=0.0)
    np.testing.assert_array_equal(make_partition(labels, spec).label_graph, np.eye(4, dtype=np.float32))
    partition = make_partition(_balanced_labels(), PartitionSpec("shards", 10))
    np.testing.assert_array_equal(partition.label_graph, label_graph(_balanced_labels(), partition.train_indices))


def test_label_graph_symmetric_iid_is_full() -> None:
    labels = _balanced_labels()
    for spec in ALL_SPECS:
        graph = make_partition(labels, spec).label_graph
        assert graph.shape == (spec.num_clients,) * 2
        np.testing.assert_array_equal(graph, graph.T)
        np.testing.assert_array_equal(np.diag(graph), 1.0)
    np.testing.assert_array_equal(make_partition(labels, PartitionSpec("iid", 5)).label_graph, 1.0)


@pytest.mark.parametrize(
    ("changes", "parameter"),
    [
        ({"scheme": "random"}, "scheme"),
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": 101}, "num_clients"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"test_fraction": -0.1}, "test_fraction"),
        ({"alpha": 0.0}, "alpha"),
        ({"shards_per_client": 0}, "shards_per_client"),
        ({"scheme": "shards", "num_clients": 30, "shards_per_client": 4}, "shards_per_client"),
        ({"num_clusters": 0}, "num_clusters"),
        ({"labels_per_cluster": 0}, "labels_per_cluster"),
        ({"rotations": ()}, "rotations"),
        ({"max_samples_per_client": -1}, "max_samples_per_client"),
    ],
)
def test_validation_names_parameter(changes: dict, parameter: str) -> None:
    spec = replace(PartitionSpec("iid", 4), **changes)
    value = repr(getattr(spec, parameter))
    with pytest.raises(ValueError, match=re.escape(f"{parameter}={value}")):
        make_partition(_balanced_labels(per_class=10), spec)


def test_spec_is_hashable_with_list_rotations() -> None:
    spec = PartitionSpec("domains", 4, rotations=[0, 90])  # type: ignore[arg-type]
    assert spec.rotations == (0.0, 90.0)
    assert hash(spec) == hash(PartitionSpec("domains", 4, rotations=(0.0, 90.0)))


def test_domains_styles_k_domains_per_client_with_per_image_truth() -> None:
    labels = _balanced_labels()
    spec = PartitionSpec("domains", 10, family="styles", domains_per_client=2, test_clients=0.3,
                         unseen_styles=("blurred",))
    partition = make_partition(labels, spec)
    assert partition.domain_names == ("plain", "inverted", "noisy", "thick", "blurred")
    assert partition.rotations is None
    for client in range(7):  # train client c: domains c and c+1 (mod 4), its images split evenly
        domains = partition.train_domains[client]
        assert len(domains) == len(partition.train_indices[client])
        assert set(domains.tolist()) == {client % 4, (client + 1) % 4}
        assert abs(int(np.sum(domains == client % 4)) - int(np.sum(domains != client % 4))) <= 1
        assert partition.cluster_ids[client] == client % 4
    for j, client in enumerate(range(7, 10)):  # test clients: one domain each, seen and unseen in turn
        assert set(partition.test_domains[client].tolist()) == {j % 5}
        assert len(partition.train_domains[client]) == 0
    seen = np.concatenate(partition.train_domains)
    assert 4 not in seen  # the unseen style only at test time
    one = make_partition(labels, PartitionSpec("domains", 4, family="styles"))
    for client in range(4):
        assert set(np.concatenate([one.train_domains[client], one.test_domains[client]]).tolist()) == {client}
    rotated = make_partition(labels, PartitionSpec("domains", 4, domains_per_client=3))
    assert rotated.domain_names == ("0", "90", "180", "270")
    assert set(rotated.train_domains[1].tolist()) == {1, 2, 3}


@pytest.mark.parametrize(("changes", "parameter"), [
    ({"family": "colours"}, "family"),
    ({"domains_per_client": 5}, "domains_per_client"),
    ({"domains_per_client": 0}, "domains_per_client"),
    ({"unseen_styles": ("blurred",)}, "unseen_styles"),
])
def test_domain_validation_names_parameter(changes: dict, parameter: str) -> None:
    spec = replace(PartitionSpec("domains", 4, family="styles"), **changes)
    with pytest.raises(ValueError, match=re.escape(f"{parameter}=")):
        make_partition(_balanced_labels(per_class=10), spec)
    with pytest.raises(ValueError, match="unknown style 'sepia'"):
        make_partition(_balanced_labels(per_class=10), PartitionSpec("domains", 4, family="styles",
                                                                     styles=("plain", "sepia")))


def test_style_transforms_keep_the_range_and_are_deterministic() -> None:
    import torch

    from datasets.domains import STYLES, apply_domains

    images = torch.rand(6, 1, 28, 28)
    domains = torch.tensor([0, 1, 2, 3, 4, 5])
    names = tuple(STYLES)
    out = apply_domains(images, domains, "styles", names, seed=3)
    assert out.shape == images.shape and float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    torch.testing.assert_close(out[0], images[0])  # plain
    torch.testing.assert_close(out[1], 1.0 - images[1])  # inverted
    assert not torch.equal(out[2], images[2])  # noisy
    assert bool((out[3] >= images[3]).all())  # thick: a max filter never darkens a stroke
    torch.testing.assert_close(apply_domains(images, domains, "styles", names, seed=3), out)
    assert not torch.equal(apply_domains(images, domains, "styles", names, seed=4)[2], out[2])
