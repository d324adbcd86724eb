"""ClientGrid's own exchange loop (push, then pull every ~0.15 s until every reply or the timeout):
late replies are ignored, a silent node never holds a phase past the timeout, and a phase ends as soon
as the last reply is there (Flower's Grid.send_and_receive polls every 3 s)."""

import logging
import time

import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

from server_app.clients import POLL_INTERVAL, ClientGrid, push_and_pull
from strategies.shared.messages import CONFIG, IDENTIFY, METRICS, IdentifyReply
from server_app.harness.local_grid import set_task_identity

set_task_identity()

FINGERPRINT = "0123456789ab"


class ScheduledGrid(Grid):
    """A Grid whose node n answers a pushed message `delays[n]` s later (None: never); identify
    requests are answered at once (node n hosts client n - 1 of len(delays))."""

    def __init__(self, delays: dict[int, float | None]) -> None:
        self.delays = delays
        self.due: dict[str, tuple[float, Message]] = {}
        self.pulls = 0

    def get_node_ids(self):
        return list(self.delays)

    def push_messages(self, messages):
        ids = []
        for i, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"m{time.monotonic_ns()}-{i}"
            ids.append(message.metadata.message_id)
            node = message.metadata.dst_node_id
            if message.metadata.message_type == IDENTIFY:
                content = RecordDict({CONFIG: IdentifyReply(
                    partition_id=node - 1, num_partitions=len(self.delays),
                    code_fingerprint=FINGERPRINT, device="cpu", train_sizes=[10],
                    test_sizes=[10]).config()})
                self.due[message.metadata.message_id] = (0.0, Message(content, reply_to=message))
            elif self.delays[node] is not None:
                content = RecordDict({METRICS: MetricRecord({"num-examples": 5, "node": node})})
                self.due[message.metadata.message_id] = (
                    time.monotonic() + self.delays[node], Message(content, reply_to=message))
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        now = time.monotonic()
        ready = [i for i in message_ids if i in self.due and self.due[i][0] <= now]
        return [self.due.pop(i)[1] for i in ready]

    # unused parts of the Grid interface
    def create_message(self, *args, **kwargs):
        raise NotImplementedError

    def get_nodes(self):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("ClientGrid must use its own loop, not Grid.send_and_receive")

    @property
    def run(self):
        raise NotImplementedError

    def set_run(self, run):
        raise NotImplementedError


def _messages(grid: ScheduledGrid, nodes) -> list[Message]:
    return [Message(RecordDict({CONFIG: ConfigRecord({"x": 1})}), dst_node_id=n,
                    message_type="query.ping") for n in nodes]


def test_a_reply_after_the_timeout_is_ignored():
    grid = ScheduledGrid({1: 0.05, 2: 1.0})
    started = time.monotonic()
    replies = push_and_pull(grid, _messages(grid, [1, 2]), timeout=0.5)
    elapsed = time.monotonic() - started
    assert [int(r.content[METRICS]["node"]) for r in replies] == [1]
    assert 0.5 <= elapsed < 0.5 + POLL_INTERVAL + 0.2
    time.sleep(0.6)  # node 2's reply is now there; the finished exchange never pulls it
    assert len(grid.due) == 1


def test_the_phase_ends_as_soon_as_every_reply_is_there():
    grid = ScheduledGrid({1: 0.05, 2: 0.2})
    started = time.monotonic()
    replies = push_and_pull(grid, _messages(grid, [1, 2]), timeout=30.0)
    elapsed = time.monotonic() - started
    assert sorted(int(r.content[METRICS]["node"]) for r in replies) == [1, 2]
    assert elapsed < 0.2 + POLL_INTERVAL + 0.2


def test_a_silent_node_does_not_hold_the_phase_past_round_timeout(caplog):
    grid = ScheduledGrid({1: 0.05, 2: None, 3: 0.1})
    clients = ClientGrid(grid, 3, FINGERPRINT)
    clients.refresh(timeout=5.0)
    assert clients.get_node_ids() == [0, 1, 2]
    messages = [Message(RecordDict({CONFIG: ConfigRecord({"x": 1})}), dst_node_id=c,
                        message_type="query.ping") for c in (0, 1, 2)]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        good = clients.exchange(messages, timeout=0.8, phase="ping")
    elapsed = time.monotonic() - started
    assert [client for client, _ in good] == [0, 2]
    assert 0.8 <= elapsed < 0.8 + POLL_INTERVAL + 0.2
    assert "no reply from client 1 within" in caplog.text


class LostSessionGrid(ScheduledGrid):
    """A ScheduledGrid whose first `failures` pushes fail as Flower's do when the SuperLink restarted
    between the message push and the object push."""

    def __init__(self, delays, failures: int) -> None:
        super().__init__(delays)
        self.failures = failures
        self.pushes = 0

    def push_messages(self, messages):
        self.pushes += 1
        if self.pushes <= self.failures:
            raise ObjectPushError("abc", 1, "gone")
        return super().push_messages(messages)


def test_a_lost_push_session_is_pushed_again(monkeypatch, caplog):
    from server_app import clients

    monkeypatch.setattr(clients, "PUSH_RETRY_WAIT", 0.01)
    grid = LostSessionGrid({1: 0.01, 2: 0.01}, failures=clients.PUSH_ATTEMPTS - 1)
    with caplog.at_level(logging.WARNING):
        replies = push_and_pull(grid, _messages(grid, [1, 2]), timeout=5.0)
    assert sorted(int(r.content[METRICS]["node"]) for r in replies) == [1, 2]
    assert grid.pushes == clients.PUSH_ATTEMPTS
    assert "pushing again" in caplog.text
    broken = LostSessionGrid({1: 0.01}, failures=clients.PUSH_ATTEMPTS)
    with pytest.raises(ObjectPushError):
        push_and_pull(broken, _messages(broken, [1]), timeout=5.0)
    assert broken.pushes == clients.PUSH_ATTEMPTS

