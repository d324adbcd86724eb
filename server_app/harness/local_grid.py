"""`LocalGrid`: an in-process Flower Grid that delivers messages to a ClientApp directly.

It hosts `num_nodes` virtual SuperNodes in this process (node_config `partition-id`/`num-partitions`
as Flower's simulation sets them, or each node's own `node_configs` entry, e.g. its `data-dir`) and runs each message through the real `ClientApp`, one after the
other: no Ray, no subprocesses, deterministic. Tests and benchmarks use it to run whole federations
in one process; `flwr run` uses Flower's own simulation runtime.
"""

from __future__ import annotations

import copy
import traceback
import uuid
from collections.abc import Iterable
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

def set_task_identity() -> None:
    """Give this process the (run, node, task) identity Flower 1.39 needs to build a `Message`
    outside a running ServerApp or ClientApp (in-process grids, tests); an identity already set is
    kept."""
    for name in ("run_id", "node_id", "task_id"):
        if getattr(TaskIdentity, f"_{name}") is None:
            setattr(TaskIdentity, name, 1)


CLIENT_APP_EXCEPTION = 2  # Flower's error code for an exception raised in a ClientApp
FIRST_NODE_ID = 1000


class LocalGrid(Grid):
    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: dict[str, Any],
                 node_configs: list[dict[str, Any]] | None = None) -> None:
        """`node_configs`: one node_config per virtual node (then `num_nodes` is their count), e.g.
        `[{"data-dir": "/data/a"}, {"data-dir": "/data/b"}]`; default: partition slots."""
        set_task_identity()
        self.client_app = client_app
        if node_configs is None:
            node_configs = [{"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)]
        self.contexts = {
            FIRST_NODE_ID + i: Context(
                run_id=1, node_id=FIRST_NODE_ID + i, node_config=dict(config),
                state=RecordDict(), run_config=dict(run_config),
            )
            for i, config in enumerate(node_configs)
        }
        self.offline: set[int] = set()  # nodes a test has taken down
        self.replies: dict[str, Message] = {}  # message id -> reply not yet pulled

    @property
    def run(self):  # noqa: D401 - Grid API
        raise NotImplementedError("LocalGrid has no Flower Run object")

    def set_run(self, run) -> None:
        raise NotImplementedError("LocalGrid has no Flower Run object")

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return [n for n in self.contexts if n not in self.offline]

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Deliver each message to its node's ClientApp now; the reply waits for `pull_messages`."""
        ids = []
        for message in list(messages):
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            ids.append(message.metadata.message_id)
            reply = self._deliver(message)
            if reply is not None:
                self.replies[message.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))

    def _deliver(self, message: Message) -> Message | None:
        node = message.metadata.dst_node_id
        if node in self.offline or node not in self.contexts:
            return None  # like a node that never answers: no reply within the timeout
        delivered = Message(copy.deepcopy(message.content), dst_node_id=node,
                            message_type=message.metadata.message_type,
                            group_id=message.metadata.group_id)
        delivered.metadata.__dict__["_message_id"] = message.metadata.message_id
        try:
            return self.client_app(delivered, self.contexts[node])
        except Exception as err:  # a crashing ClientApp becomes an error reply, as in Flower
            reason = f"{type(err)}:<'{err}'>\n{traceback.format_exc(limit=3)}"
            return Message(Error(CLIENT_APP_EXCEPTION, reason), reply_to=delivered)
