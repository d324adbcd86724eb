"""Client half of `query.identify`: report which clients this node hosts, its device, its code
fingerprint and the train/test sizes of its clients (the server checks `num-examples` of replies
against them).

A node with a partition slot (node_config `partition-id`/`num-partitions`) reports the slot. A node
with its own data (node_config `data-dir`) reports the names of the clients found there
(`datasets.local.discover`); a client whose data cannot be used as the run declares it (a corrupt
image, a wrong shape, no samples, labels outside the declared classes) is reported under
`failed-names` with the reason, naming this node and the file, and the server leaves it out of the
run.
"""

from __future__ import annotations

import logging

from flwr.app import Context, Message, RecordDict

from client_app.devices import resolve_device
from client_app.runtime import data_dir, local_clients, node_data_spec, partition_slot, run_config
from datasets.federated import client_sizes
from datasets.local import Expected, LocalDataError, load_local
from strategies.shared.provenance import code_fingerprint
from strategies.shared.messages import CONFIG, IdentifyReply

log = logging.getLogger(__name__)


def identify(message: Message, context: Context) -> Message:
    cfg = run_config(context)
    device = resolve_device(cfg.device)
    common = dict(code_fingerprint=code_fingerprint(), device=str(device))
    if data_dir(context) is not None:
        reply = _named_clients(context, cfg, common)
    else:
        partition_id, num_partitions = partition_slot(context)
        sizes = [client_sizes(node_data_spec(cfg, context), c)
                 for c in range(partition_id, cfg.num_clients, num_partitions)]
        reply = IdentifyReply(
            partition_id=partition_id, num_partitions=num_partitions,
            train_sizes=[train for train, _ in sizes], test_sizes=[test for _, test in sizes],
            **common,
        )
    return Message(RecordDict({CONFIG: reply.config()}), reply_to=message)


def _named_clients(context: Context, cfg, common: dict) -> IdentifyReply:
    expected = Expected.of(cfg)
    names, train, test, failed, reasons = [], [], [], [], []
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
    return IdentifyReply(client_names=names, train_sizes=train, test_sizes=test,
                         failed_names=failed, failed_reasons=reasons, **common)
