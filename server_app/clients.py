"""Stable client identity on top of Flower's node ids.

A Flower node id changes between runs (simulation) and restarts (deployment without auth); a Bouquet
client id does not. A SuperNode started with node_config `partition-id=p num-partitions=n` hosts the
logical clients `{c < num_clients : c mod n == p}`: one client per node in a deployment (n equal to
num-clients), several per node in a small local simulation. `ClientGrid` looks like a Flower `Grid`
whose node ids *are* client ids, so Flower's own strategies (FedAvg, FedProx) sample and address
clients unchanged; it rewrites each message to the hosting node and remembers which client a reply
came from.

A SuperNode with its own data (node_config `data-dir`, `datasets.local`) announces its clients by
name instead. The run's client set is fixed once the nodes have announced `num-clients` names: client
ids are the names' positions in sorted order (so folders `client-000 ... client-NNN` exported from a
partition get the partition's ids), and every message carries the name as well. A client whose node
could not use its data is left out of the run (never sampled; the summary lists it with the reason).
A node that identifies itself later hosts the known names it announces (a restarted SuperNode); a name
that was not in the set when the run started is not part of this run (logged) and joins the next one.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flwr.app import ArrayRecord, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

from strategies.shared.fusion import fuse, is_fused, split_reply, split_request
from strategies.shared.messages import IDENTIFY, IdentifyReply, IdentifyRequest, with_client
from strategies.shared.priors import ClientReport, reports_of
from server_app.validation import INVALID_REPLY, ReplyValidator

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.15  # s between pulls of outstanding replies (Flower's Grid.send_and_receive: 3 s)
PUSH_ATTEMPTS = 3  # pushes of one phase's messages when the SuperLink loses the push session
PUSH_RETRY_WAIT = 1.0  # s between them


def push(grid: Grid, messages: list[Message]) -> list[str]:
    """`grid.push_messages`, pushed again (`PUSH_ATTEMPTS` in all, `PUSH_RETRY_WAIT` s apart) when
    the SuperLink no longer knows the push session of the messages' objects, as when it restarts
    between Flower's message push and its object push. A message the SuperLink had already stored
    comes back with an empty id and is not waited for (its client misses the phase)."""
    for attempt in range(1, PUSH_ATTEMPTS):
        try:
            return list(grid.push_messages(messages))
        except ObjectPushError as err:
            log.warning("pushing %d message(s) failed (%s); pushing again in %.0f s (%d of %d)",
                        len(messages), err, PUSH_RETRY_WAIT, attempt + 1, PUSH_ATTEMPTS)
            time.sleep(PUSH_RETRY_WAIT)
    return list(grid.push_messages(messages))


def push_and_pull(grid: Grid, messages: list[Message], timeout: float,
                  poll_interval: float = POLL_INTERVAL) -> list[Message]:
    """`Grid.send_and_receive` with a short poll: push `messages`, then pull their replies every
    `poll_interval` s until all have arrived or `timeout` s have passed. A reply that arrives later
    is never pulled (it is ignored, as Flower's own loop ignores it); replies to other messages are
    dropped."""
    deadline = time.monotonic() + timeout
    outstanding = {message_id for message_id in push(grid, messages) if message_id}
    replies: list[Message] = []
    while outstanding:
        for reply in grid.pull_messages(sorted(outstanding)):
            if reply.metadata.reply_to_message_id in outstanding:
                outstanding.discard(reply.metadata.reply_to_message_id)
                replies.append(reply)
        left = deadline - time.monotonic()
        if not outstanding or left <= 0:
            break
        time.sleep(min(poll_interval, left))
    return replies


@dataclass(frozen=True)
class NodeSlot:
    """What a node told us about itself in `query.identify`."""

    node_id: int
    partition_id: int | None  # None: the node holds its own data and hosts the clients `names`
    num_partitions: int | None
    device: str
    names: tuple[str, ...] = ()

    def hosted(self, num_clients: int, index: dict[str, int]) -> list[int]:
        """The client ids this node hosts: its slot's, or those of its names in the run's set."""
        if self.partition_id is None:
            return [index[name] for name in self.names if name in index]
        return list(range(self.partition_id, num_clients, self.num_partitions or 1))


class ClientSetError(RuntimeError):
    """The nodes' clients do not make up the run's client set (too many names, mixed hosting)."""


class CodeMismatchError(RuntimeError):
    """A node runs different Bouquet code than the server (stale app on the node)."""


def array_bytes(content: RecordDict) -> int:
    """Bytes of every ArrayRecord in a message, as serialised for the wire."""
    return sum(
        record.count_bytes() for record in content.values() if isinstance(record, ArrayRecord)
    )


class ClientGrid:
    """A Grid view addressed by stable client ids; counts the bytes of each client's messages and
    validates every reply (`server_app.validation`): an invalid one is handed on as an error reply."""

    def __init__(self, grid: Grid, num_clients: int, code_fingerprint: str,
                 validator: ReplyValidator | None = None, label_sets: bool = False) -> None:
        self.grid = grid
        # what clients report about their data (strategies.shared.priors): by client id, and by
        # name until named clients have ids; `label_sets`: ask for their label sets
        self.label_sets = label_sets
        self.reports: dict[int, ClientReport] = {}
        self._announced_reports: dict[str, ClientReport] = {}
        self.validator = validator or ReplyValidator()
        self.num_clients = num_clients
        self.code_fingerprint = code_fingerprint
        self.slots: dict[int, NodeSlot] = {}
        self.identify_failures: dict[int, str] = {}  # node id -> error reason, latest refresh
        self._host: dict[int, int] = {}  # client id -> node id
        # nodes with their own data: client name -> id, fixed once num-clients names are announced
        # (empty until then, and in partitioned runs); ids left out with the reason, and the
        # announcements (name -> (node, train, test) or (node, reason)) not yet given an id
        self.names: dict[str, int] = {}
        self.left_out: dict[int, tuple[int, str]] = {}  # client id -> (node id, reason)
        self._announced: dict[str, tuple[int, Any]] = {}
        self._ignored: set[str] = set()  # late names already logged
        self._name: dict[int, str] = {}  # client id -> name, as messages are addressed
        self._client_of_message: dict[str, int] = {}
        self.bytes_down: dict[int, int] = defaultdict(int)
        self.bytes_up: dict[int, int] = defaultdict(int)
        self.phases = 0  # exchanges with clients since the last take_traffic (identify excluded)
        # the round the runner is in, stamped on every message as its group id: clients seed the
        # draws they take from global generators with it (client_app/seeding.py)
        self.round = 0

    # --- membership -------------------------------------------------------------------------
    def refresh(self, timeout: float) -> None:
        """Identify nodes that joined, forget nodes that left, and recompute who hosts whom."""
        online = set(self.grid.get_node_ids())
        for gone in set(self.slots) - online:
            del self.slots[gone]
        new = sorted(online - set(self.slots))
        self.identify_failures = {}
        if new:
            request = RecordDict(
                {"config": IdentifyRequest(
                    code_fingerprint=self.code_fingerprint, num_clients=self.num_clients,
                    label_sets=self.label_sets,
                ).config()}
            )
            messages = [Message(request, dst_node_id=n, message_type=IDENTIFY) for n in new]
            replies = push_and_pull(self.grid, messages, timeout)
            sent_to = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
            for reply in replies:
                node = sent_to.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
                if reply.has_error():
                    log.warning("node %s could not identify itself: %s", node, reply.error.reason)
                    self.identify_failures[node] = reply.error.reason
                    continue
                info = IdentifyReply.read(reply.content["config"])
                if info.code_fingerprint != self.code_fingerprint:
                    raise CodeMismatchError(
                        f"node {node} runs Bouquet code {info.code_fingerprint} but the server runs "
                        f"{self.code_fingerprint}; a stale app is being served. Stop the local "
                        "SuperLink (by its PID) and run `flwr run` again."
                    )
                if info.partition_id is None:
                    self._announce(node, info)
                    continue
                self.slots[node] = NodeSlot(node, info.partition_id, info.num_partitions, info.device)
                hosted = range(info.partition_id, self.num_clients, info.num_partitions)
                for client, train, test, report in zip(hosted, info.train_sizes, info.test_sizes,
                                                       reports_of(info)):
                    self.validator.declare(client, train, test)
                    self.reports.setdefault(client, report)
        kinds = {slot.partition_id is None for slot in self.slots.values()}
        if len(kinds) > 1:
            named = [n for n, slot in self.slots.items() if slot.partition_id is None]
            raise ClientSetError(
                f"nodes {named} hold their own data (node_config data-dir) but nodes "
                f"{sorted(set(self.slots) - set(named))} rebuild a partition (partition-id); start "
                "every SuperNode of a run the same way")
        self._fix_names()
        self._name = self.client_names()
        self._host = {}
        # In identification order: a SuperNode restarted under a new node id (before the SuperLink
        # noticed the old one is gone) hosts its clients from now on.
        for slot in self.slots.values():
            for client in slot.hosted(self.num_clients, self.names):
                if client not in self.left_out:
                    self._host[client] = slot.node_id

    def _announce(self, node: int, info: IdentifyReply) -> None:
        """Record the named clients a node announced (its slot hosts them once they have ids)."""
        self.slots[node] = NodeSlot(node, None, None, info.device, tuple(info.client_names))
        for name, train, test, report in zip(info.client_names, info.train_sizes, info.test_sizes,
                                             reports_of(info)):
            self._announced[name] = (node, (train, test))
            self._announced_reports.setdefault(name, report)
        for name, reason in zip(info.failed_names, info.failed_reasons):
            log.warning("node %s cannot use the data of client %r, which is left out of the run: %s",
                        node, name, reason)
            self._announced[name] = (node, reason)
        if self.names:  # the client set is fixed: known names are (re)hosted, new ones wait
            for name in [*info.client_names, *info.failed_names]:
                if name in self.names:
                    self._settle(name)
                elif name not in self._ignored:
                    self._ignored.add(name)
                    log.warning("node %s announced client %r after the run started; the run's "
                                "client set is fixed at its start, so %r is not part of this run "
                                "(it joins the next one)", node, name, name)

    def _fix_names(self) -> None:
        """Give the announced names their ids once there are num-clients of them."""
        if self.names or len(self._announced) < self.num_clients:
            return
        if len(self._announced) > self.num_clients:
            names = sorted(self._announced)
            raise ClientSetError(
                f"the nodes announced {len(names)} clients ({', '.join(names[:8])}"
                f"{', ...' if len(names) > 8 else ''}) but num-clients = {self.num_clients}; set "
                f"num-clients = {len(names)} or give the nodes fewer clients")
        self.names = {name: i for i, name in enumerate(sorted(self._announced))}
        for name in self.names:
            self._settle(name)
        log.info("client set: %s", ", ".join(f"{i}={n}" for n, i in self.names.items()))

    def _settle(self, name: str) -> None:
        """Declare a named client's sizes, or leave it out with its node's reason."""
        client = self.names[name]
        node, what = self._announced[name]
        if isinstance(what, str):
            self.left_out[client] = (node, what)
        elif client not in self.left_out:
            self.validator.declare(client, *what)
            self.reports.setdefault(client, self._announced_reports[name])

    def client_names(self) -> dict[int, str]:
        """Client id -> name (nodes with their own data; empty for a partitioned run)."""
        return {client: name for name, client in self.names.items()}

    def left_out_clients(self) -> list[dict[str, Any]]:
        """The clients left out of the run: id, name, node and why (summary's `left-out-clients`)."""
        names = self.client_names()
        return [{"client-id": c, "name": names.get(c, ""), "node": node, "reason": reason}
                for c, (node, reason) in sorted(self.left_out.items())]

    def missing_clients(self) -> list[int]:
        """Client ids with no node (all of them while named clients are still being announced);
        clients left out of the run are not missing."""
        return [c for c in range(self.num_clients) if c not in self._host and c not in self.left_out]

    def waiting_for(self) -> str:
        """What `missing_clients` waits for, in words (named clients: how many names so far)."""
        if self.names or not self._announced:
            return ""
        return (f"the nodes announced {len(self._announced)} of num-clients = {self.num_clients} "
                f"named clients ({', '.join(sorted(self._announced)[:8])})")

    def devices(self) -> dict[int, str]:
        return {c: self.slots[n].device for c, n in self._host.items()}

    # --- the Grid surface Flower strategies use ----------------------------------------------
    def get_node_ids(self) -> list[int]:
        """Client ids currently reachable, in order (so seeded sampling is reproducible)."""
        return sorted(self._host)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float) -> list[Message]:
        """Deliver messages addressed to client ids; replies of absent clients are simply missing."""
        routed = []
        for message in messages:
            client = message.metadata.dst_node_id
            if client not in self._host:
                log.warning("client %s is not reachable; skipped this round", client)
                continue
            out = Message(
                with_client(message.content, client, self._name.get(client)),
                dst_node_id=self._host[client],
                message_type=message.metadata.message_type,
                group_id=str(self.round),
            )
            self.bytes_down[client] += array_bytes(message.content)
            routed.append((client, out))
        if not routed:
            return []
        self.phases += 1
        replies = push_and_pull(self.grid, [m for _, m in routed], timeout)
        requests = {}
        for client, out in routed:
            self._client_of_message[out.metadata.message_id] = client
            requests[out.metadata.message_id] = out
        checked = []
        for reply in replies:
            client = self.client_id(reply)
            if not reply.has_error():
                request = requests[reply.metadata.reply_to_message_id]
                problem = self._problem(client, request, reply)
                if problem:
                    reply = Message(Error(INVALID_REPLY, f"invalid reply dropped ({problem})"),
                                    reply_to=request)
                else:
                    self.bytes_up[client] += array_bytes(reply.content)
            checked.append(reply)
        return checked

    def _problem(self, client: int, request: Message, reply: Message) -> str | None:
        """The validator's verdict; a fused reply is checked half by half against its request."""
        if not is_fused(request):
            return self.validator.problem(client, request, reply)
        for sent, got in zip(split_request(request), split_reply(request, reply)):
            problem = self.validator.problem(client, sent, got)
            if problem:
                return problem
        return None

    def exchange_fused(self, train: list[Message], evaluation: list[Message], timeout: float,
                       phase: str) -> tuple[list[tuple[int, Message]], list[tuple[int, Message]]]:
        """`exchange` of train and evaluation messages in one phase: a client with both gets one
        fused message (`strategies.shared.fusion`). Returns the good (client, reply) of each kind."""
        evaluation_for = {m.metadata.dst_node_id: m for m in evaluation}
        train_clients = {m.metadata.dst_node_id for m in train}
        messages = [fuse(m, evaluation_for[m.metadata.dst_node_id])
                    if m.metadata.dst_node_id in evaluation_for else m for m in train]
        messages += [m for m in evaluation if m.metadata.dst_node_id not in train_clients]
        trained: list[tuple[int, Message]] = []
        evaluated: list[tuple[int, Message]] = []
        sent = {m.metadata.dst_node_id: m for m in messages}
        for client, reply in self.exchange(messages, timeout, phase):
            request = sent[client]
            if is_fused(request):
                train_reply, evaluation_reply = split_reply(request, reply)
                trained.append((client, train_reply))
                evaluated.append((client, evaluation_reply))
            elif client in train_clients:
                trained.append((client, reply))
            else:
                evaluated.append((client, reply))
        return trained, evaluated

    def exchange(self, messages: list[Message], timeout: float,
                 phase: str) -> list[tuple[int, Message]]:
        """Send; log each failed, invalid or missing reply with its client id; return (client, reply)
        of the good replies, sorted by client id (so results do not depend on arrival order)."""
        if not messages:
            return []
        wanted = {m.metadata.dst_node_id for m in messages}
        replies = self.send_and_receive(messages, timeout=timeout)
        good: list[tuple[int, Message]] = []
        for reply in replies:
            client = self.client_id(reply)
            if reply.has_error():
                log.warning("%s: client %d failed and is skipped: %s", phase, client,
                            reply.error.reason)
            else:
                good.append((client, reply))
        for client in sorted(wanted - {self.client_id(r) for r in replies}):
            log.warning("%s: no reply from client %d within %.0f s; skipped", phase, client, timeout)
        return sorted(good, key=lambda pair: pair[0])

    def client_id(self, reply: Message) -> int:
        """The client a reply came from (also for errors the SuperLink raises on a node's behalf)."""
        return self._client_of_message[reply.metadata.reply_to_message_id]

    def round_bytes(self) -> tuple[int, int]:
        """Bytes (down, up) of every client's array records since the last `take_traffic`."""
        return sum(self.bytes_down.values()), sum(self.bytes_up.values())

    def take_traffic(self) -> tuple[dict[int, int], dict[int, int]]:
        """Bytes down/up per client since the last call; ends the round (replies of earlier rounds
        are no longer mapped to clients, so the map does not grow with the run). `phases` is reset
        by the caller that reads it."""
        down, up = dict(self.bytes_down), dict(self.bytes_up)
        self.bytes_down.clear()
        self.bytes_up.clear()
        self._client_of_message.clear()
        return down, up


class TrainClients:
    """A `ClientGrid` that lists only the clients with training data among the reachable ones (whole
    test clients held out have none); everything else is the grid's. The runner hands it to every
    strategy's `configure_train`, so sampling for training never draws a test client."""

    def __init__(self, grid: ClientGrid, train_clients: Iterable[int]) -> None:
        self._grid, self._train = grid, frozenset(int(c) for c in train_clients)

    def get_node_ids(self) -> list[int]:
        return [node for node in self._grid.get_node_ids() if node in self._train]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not yet set (e.g. while a checkpoint is unpickled)
            raise AttributeError(name)
        return getattr(self._grid, name)
