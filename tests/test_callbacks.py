"""Cross-cutting work as callbacks: a user's callback sees every round in order, after the byte
counts are in its record, and can add to the summary; the base class does nothing."""

import pytest
from flwr.app import ArrayRecord

from server_app.callbacks import RunCallback
from server_app.harness.simulate import simulate


class Trace(RunCallback):
    def __init__(self):
        self.events = []

    def round_recorded(self, record):
        self.events.append(("recorded", record["round"], "bytes-down" in record))

    def round_finished(self, server_round, arrays, seconds, pending):
        self.events.append(("finished", server_round, isinstance(arrays, ArrayRecord)))

    def run_finished(self, summary):
        summary["traced-rounds"] = sum(1 for e in self.events if e[0] == "recorded")


@pytest.mark.federation
def test_a_callback_sees_each_round_in_order_and_adds_to_the_summary(tiny_run):
    trace = Trace()
    summary = simulate({**tiny_run, "fuse-evaluate": False}, callbacks=[trace])
    assert trace.events == [("recorded", 0, True), ("finished", 0, True),
                            ("recorded", 1, True), ("finished", 1, True),
                            ("recorded", 2, True), ("finished", 2, True)]
    assert summary["traced-rounds"] == 3


def test_the_base_callback_does_nothing():
    base = RunCallback()
    record = {"round": 1, "seconds": 0.5}
    assert base.round_fields(1) == {}
    base.completing_round(record)
    base.round_recorded(record)
    base.round_finished(1, ArrayRecord(), 1.0, None)
    summary = {"method": "fedavg"}
    base.run_finished(summary)
    assert record == {"round": 1, "seconds": 0.5} and summary == {"method": "fedavg"}
