"""Exchanges a method needs besides training and evaluation (relatedness queries,
split-learning queries, domain-balancing queries) as declared phases: the method's step is a
generator that yields a `Phase` (one message type, the messages for each client) and receives the
good replies; only the runner sends (`FederationRunner.run_phases`). So a method's server step is
plain code that tests can drive with made-up replies (`answer`), and the runner owns the transport.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TypeVar

from flwr.app import ArrayRecord, ConfigRecord, Message

T = TypeVar("T")

# (client id, reply) pairs of the good replies, sorted by client id.
Replies = list[tuple[int, Message]]


@dataclass(frozen=True)
class Phase:
    """One exchange: `messages` (one per client; `name` is how logs call it)."""

    name: str
    messages: list[Message]


Steps = Generator[Phase, Replies, T]


def no_phases() -> Steps[None]:
    """A step that needs no exchange."""
    yield from ()


def run_phases(steps: Steps[T] | None, exchange: Callable[[Phase], Replies]) -> T | None:
    """Drive `steps`: every phase it yields goes through `exchange`, whose replies it receives;
    returns what the steps return. A phase without messages is answered with no replies, unsent."""
    if steps is None:
        return None
    try:
        phase = next(steps)
        while True:
            phase = steps.send(exchange(phase) if phase.messages else [])
    except StopIteration as done:
        return done.value


def answer(steps: Steps[T], respond: Callable[[int, Message], Message | None]) -> T | None:
    """Drive `steps` without any transport: `respond(client, message)` makes each reply (None = the
    client does not answer). For tests of a method's server step."""
    def exchange(phase: Phase) -> Replies:
        replies = [(m.metadata.dst_node_id, respond(m.metadata.dst_node_id, m))
                   for m in phase.messages]
        return sorted(((c, r) for c, r in replies if r is not None), key=lambda pair: pair[0])

    return run_phases(steps, exchange)


class ClientKeyed:
    """A strategy that keys what it learns by stable client id: its `aggregate_train` and
    `aggregate_evaluate` take the runner's (client id, reply) pairs (`Replies`, sorted by client id)
    instead of bare replies, so it never needs the transport to tell whose a reply is. (Flower's own
    strategies, which need no client id, get the bare replies.)"""


class CountsTraffic:
    """A strategy that reports its traffic by phase: before each of its calls that may close a phase
    (`aggregate_train`, the replies of each of its phases, its round report) the runner sets
    `round_traffic` to the bytes (down, up) of array records exchanged with clients so far this
    round."""

    round_traffic: tuple[int, int] = (0, 0)


class PhasedStrategy:
    """A strategy with exchanges of its own. Each hook is a step (see `Steps`) the runner drives;
    the defaults need none. `online` lists the reachable client ids (sorted); the step never sends."""

    def before_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                     online: list[int]) -> Steps[None]:
        """Before round `server_round`'s train messages are configured (same arguments as
        `configure_train`)."""
        return no_phases()

    def before_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        online: list[int]) -> Steps[None]:
        """Before round `server_round`'s evaluation messages are configured (same arguments as
        `configure_evaluate`)."""
        return no_phases()

    def after_aggregate(self, server_round: int, online: list[int]) -> Steps[None]:
        """After round `server_round`'s train replies were aggregated."""
        return no_phases()
