"""A method's own exchanges are declared phases: its step yields them, and whoever drives it (the
runner, or a test with made-up replies) sends them and hands the replies back in client order."""

from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from strategies.shared.phases import Phase, answer, no_phases, run_phases
from server_app.harness.local_grid import set_task_identity

set_task_identity()


def _ask(clients, value):
    return Phase("query.echo", [Message(RecordDict({"config": ConfigRecord({"x": value})}),
                                        dst_node_id=c, message_type="query.echo") for c in clients])


def summing_step(rounds):
    """Asks every client each round and adds up what they send back (plain code, no grid)."""
    total = 0.0
    for r in range(rounds):
        replies = yield _ask([3, 1, 2], float(r))
        assert [c for c, _ in replies] == sorted(c for c, _ in replies)
        total += sum(float(reply.content["metrics"]["y"]) for _, reply in replies)
    empty = yield Phase("query.none", [])
    assert empty == []
    return total


def _reply(client, message):
    x = float(message.content["config"]["x"])
    return Message(RecordDict({"metrics": MetricRecord({"y": 10.0 * client + x})}),
                   reply_to=message)


def test_a_step_is_driven_with_made_up_replies():
    # rounds 0 and 1, clients 1..3: Σ (10c + r) = 60 + 0 + 60 + 3
    assert answer(summing_step(2), _reply) == 123.0


def test_silent_clients_are_left_out_and_empty_phases_are_not_sent():
    sent = []

    def exchange(phase):
        sent.append(phase.name)
        return [(c, _reply(c, m)) for c, m in sorted((m.metadata.dst_node_id, m)
                                                     for m in phase.messages) if c != 2]
    assert run_phases(summing_step(1), exchange) == 10.0 + 30.0
    assert sent == ["query.echo"]


def test_no_phases_and_no_steps():
    assert run_phases(no_phases(), lambda phase: []) is None
    assert run_phases(None, lambda phase: []) is None
