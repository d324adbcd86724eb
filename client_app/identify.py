"""Client half of `query.identify`: report this node's partition slot, device, code fingerprint and the
train/test sizes of the clients it hosts (the server checks `num-examples` of replies against them)."""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict

from client_app.devices import resolve_device
from client_app.runtime import node_data_spec, partition_slot, run_config
from datasets.federated import client_sizes
from strategies.shared.provenance import code_fingerprint
from strategies.shared.messages import CONFIG, IdentifyReply


def identify(message: Message, context: Context) -> Message:
    partition_id, num_partitions = partition_slot(context)
    cfg = run_config(context)
    device = resolve_device(cfg.device)
    sizes = [client_sizes(node_data_spec(cfg, context), c)
             for c in range(partition_id, cfg.num_clients, num_partitions)]
    reply = IdentifyReply(
        partition_id=partition_id, num_partitions=num_partitions,
        code_fingerprint=code_fingerprint(), device=str(device),
        train_sizes=[train for train, _ in sizes], test_sizes=[test for _, test in sizes],
    )
    return Message(RecordDict({CONFIG: reply.config()}), reply_to=message)
