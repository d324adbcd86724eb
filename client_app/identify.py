"""Client half of `query.identify`: report which clients this node hosts, its device, its code
fingerprint and the train/test sizes of its clients (the server checks `num-examples` of replies
against them).

A node with a partition slot (node_config `partition-id`/`num-partitions`) reports the slot. A node
with its own data (node_config `data-dir`) reports the names of the clients found there
(`datasets.local.discover`); a client whose data cannot be used as the run declares it (a corrupt
image, a wrong shape, no samples, labels outside the declared classes) is reported under
`failed-names` with the reason, naming this node and the file, and the server leaves it out of the
run.

Each hosted client also reports what the run's server needs to know about its data
(`strategies.shared.priors.ClientReport`), and nothing else: its distinct train labels only when the
request asks for them (a `label-sharing` client graph), its group id and its train samples per
domain id where its data has them. A partition slot reports its clients' share of the partition's
ground truth (true cluster or first domain, per-image domains); a node with its own data reports its
npz `group` array (the client's majority group), else its `domain` array (majority domain), and the
per-domain counts of its `domain` array. The server reads no client data: its label-sharing graph
and every ground-truth figure come from these reports.
"""

from __future__ import annotations

import logging

import numpy as np
from flwr.app import Context, Message, RecordDict

from client_app.devices import resolve_device
from client_app.node import data_dir, local_clients, node_data_spec, partition_slot, run_config
from datasets.federated import DataSpec, client_sizes, load_partition
from datasets.local import Expected, LocalData, LocalDataError, load_local
from strategies.shared.priors import NO_GROUP, ClientReport
from strategies.shared.provenance import code_fingerprint
from strategies.shared.messages import CONFIG, IdentifyReply, IdentifyRequest

log = logging.getLogger(__name__)


def identify(message: Message, context: Context) -> Message:
    cfg = run_config(context)
    device = resolve_device(cfg.device)
    common = dict(code_fingerprint=code_fingerprint(), device=str(device))
    label_sets = (CONFIG in message.content
                  and IdentifyRequest.read(message.content[CONFIG]).label_sets)
    if data_dir(context) is not None:
        reply = _named_clients(context, cfg, common, label_sets)
    else:
        partition_id, num_partitions = partition_slot(context)
        spec = node_data_spec(cfg, context)
        hosted = range(partition_id, cfg.num_clients, num_partitions)
        sizes = [client_sizes(spec, c) for c in hosted]
        reply = IdentifyReply(
            partition_id=partition_id, num_partitions=num_partitions,
            train_sizes=[train for train, _ in sizes], test_sizes=[test for _, test in sizes],
            **_report_fields([_partition_report(spec, c, label_sets) for c in hosted]),
            **common,
        )
    return Message(RecordDict({CONFIG: reply.config()}), reply_to=message)


def _named_clients(context: Context, cfg, common: dict, label_sets: bool) -> IdentifyReply:
    expected = Expected.of(cfg)
    names, train, test, failed, reasons, reports = [], [], [], [], [], []
    for client in local_clients(context):
        try:
            data = load_local(client, expected)
        except LocalDataError as err:
            reason = f"node {context.node_id}, client {client.name!r}: {err}"
            log.warning("%s; the client is left out", reason)
            failed.append(client.name)
            reasons.append(reason)
            continue
        names.append(client.name)
        train.append(len(data.train_y))
        test.append(len(data.test_y))
        reports.append(_local_report(data, label_sets and expected.task == "classification"))
    return IdentifyReply(client_names=names, train_sizes=train, test_sizes=test,
                         failed_names=failed, failed_reasons=reasons, **_report_fields(reports),
                         **common)


# --- what each client reports about its data (strategies.shared.priors.ClientReport) ---------------

def _report_fields(reports: list[ClientReport]) -> dict:
    """IdentifyReply's per-client report lists: each one entry per hosted client, or left out when
    no hosted client has that field."""
    fields: dict = {}
    if any(r.labels is not None for r in reports):
        fields["label_sets"] = [ClientReport.encode_ints(r.labels or ()) for r in reports]
    if any(r.group is not None for r in reports):
        fields["groups"] = [NO_GROUP if r.group is None else int(r.group) for r in reports]
    if any(r.domain_counts is not None for r in reports):
        fields["domain_counts"] = [ClientReport.encode_ints(r.domain_counts or ()) for r in reports]
    if any(r.label_counts is not None for r in reports):
        fields["label_counts"] = [ClientReport.encode_ints(r.label_counts or ()) for r in reports]
    return fields


def _partition_report(spec: DataSpec, client: int, label_sets: bool) -> ClientReport:
    """A partition's client: its labels (when asked), true cluster / first domain and train samples
    per true domain, from the partition this node rebuilds anyway; without clusters, its train
    samples per label (the simulation's label-similarity ground truth)."""
    from datasets.sources import SOURCE_INFO, dataset_task

    source, partition = load_partition(spec)
    labels = getattr(source, "labels", None) if dataset_task(spec.dataset) == "classification" \
        else None
    train = partition.train_indices[client]
    label_set = tuple(int(v) for v in np.unique(labels[train])) if label_sets and \
        labels is not None else None
    group = None if partition.cluster_ids is None else int(partition.cluster_ids[client])
    counts = None
    if partition.train_domains is not None:
        counts = tuple(int(n) for n in np.bincount(partition.train_domains[client]))
    histogram = None
    if group is None and labels is not None:
        histogram = tuple(int(n) for n in np.bincount(labels[train],
                                                      minlength=SOURCE_INFO[spec.dataset][1]))
    return ClientReport(label_set, group, counts, histogram)


def _majority(values: np.ndarray) -> int:
    """The most frequent id (the smallest of a tie)."""
    ids, counts = np.unique(values, return_counts=True)
    return int(ids[np.argmax(counts)])


def _local_report(data: LocalData, label_sets: bool) -> ClientReport:
    """A client with its own data: its train labels (when asked); its group: the majority of its
    `group` array, else of its `domain` array; its train samples per `domain` id."""
    labels = tuple(int(v) for v in np.unique(data.train_y)) if label_sets else None
    group = None
    for train, test in ((data.train_groups, data.test_groups),
                        (data.train_domains, data.test_domains)):
        if train is not None:
            both = np.concatenate([train, test if test is not None else train[:0]])
            if len(both):
                group = _majority(both)
            break
    counts = None
    if data.train_domains is not None:
        counts = tuple(int(n) for n in np.bincount(data.train_domains))
    return ClientReport(labels, group, counts)
