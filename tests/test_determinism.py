"""One computation everywhere: the same job gives the same numbers whatever order clients' messages
run in, however many nodes host them, in process and through `flwr run` (under CPU load).

Random draws a client takes from a process's global generators (dropout masks) are seeded per message
from (run seed, client, round, message type) by the ClientApp mod `client_app.seeding.seeded_draws`;
replies are combined in client order (`server_app.clients.ClientGrid.exchange`)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, RecordDict

from client_app.app import app as client_app
from client_app.seeding import message_seed, seeded_draws
from server_app.app import run
from server_app.harness.local_grid import LocalGrid, set_task_identity
from strategies.shared.messages import ClientAddress, with_client
from strategies.shared.run_config import RunConfig, default_run_config
from tests.method_runs import BASE, CASES

# a model with dropout (the MLP), so that global draws matter
JOB = {**BASE, "method": "fedavg", "model": "mlp", "num-clients": 5, "num-rounds": 2,
       "fraction-train": 1.0}


def _untimed(record):
    """A round record or summary without its timings (`seconds`, `*-seconds`, `seconds-per-round`),
    nested ones included."""
    if isinstance(record, list):
        return [_untimed(item) for item in record]
    if not isinstance(record, dict):
        return record
    return {k: _untimed(v) for k, v in record.items() if "seconds" not in k}


def _message(client: int, server_round: int, message_type: str = "train") -> Message:
    set_task_identity()
    content = with_client(RecordDict(), client)
    return Message(content, dst_node_id=1, message_type=message_type, group_id=str(server_round))


def test_message_seed_depends_on_seed_client_round_and_type():
    seed_of = message_seed
    base = seed_of(_message(2, 3), 0)
    assert base == seed_of(_message(2, 3), 0)
    others = {seed_of(_message(1, 3), 0), seed_of(_message(2, 4), 0), seed_of(_message(2, 3), 1),
              seed_of(_message(2, 3, "evaluate"), 0)}
    assert base not in others and len(others) == 4
    assert ClientAddress.read(_message(2, 3).content["client"]).client_id == 2


def test_seeded_draws_repeat_per_message_and_leave_the_callers_generators_alone():
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={"seed": 5})
    values = []

    def draw(message: Message, context: Context) -> Message:
        values.append((torch.rand(3), np.random.rand(), random.random()))
        return message

    def reseed() -> None:
        torch.manual_seed(123)
        np.random.seed(123)
        random.seed(123)

    reseed()
    torch.rand(1)
    expected = (torch.rand(3), np.random.rand(), random.random())
    reseed()
    seeded_draws(_message(0, 1), context, draw)
    torch.rand(1)  # the caller draws in between
    seeded_draws(_message(0, 1), context, draw)
    seeded_draws(_message(1, 1), context, draw)
    (a, a_np, a_py), (b, b_np, b_py), (c, _, _) = values
    assert torch.equal(a, b) and a_np == b_np and a_py == b_py  # same message, same draws
    assert not torch.equal(a, c)  # another client, other draws
    # the caller's generators go on as if no message had run
    assert torch.equal(torch.rand(3), expected[0])
    assert np.random.rand() == expected[1] and random.random() == expected[2]


class ReversedGrid(LocalGrid):
    """A LocalGrid that runs each batch of messages in reverse order (as another scheduler might)."""

    def push_messages(self, messages):
        messages = list(messages)
        ids = [None] * len(messages)
        for position in reversed(range(len(messages))):
            ids[position] = super().push_messages([messages[position]])[0]
        return ids


def _rounds(grid_type: type[LocalGrid], num_nodes: int, tmp_path, name: str, job: dict) -> list[dict]:
    run_config = {**default_run_config(), **job, "output-dir": str(tmp_path), "run-name": name}
    cfg = RunConfig.from_flower(run_config)
    run(grid_type(client_app, num_nodes, run_config), cfg, connect_timeout=5.0)
    lines = (tmp_path / name / "rounds.jsonl").read_text().splitlines()
    return [_untimed(json.loads(line)) for line in lines]


@pytest.mark.federation
def test_message_order_and_hosting_do_not_change_the_numbers(tmp_path):
    reference = _rounds(LocalGrid, 1, tmp_path, "one-node", JOB)
    assert _rounds(ReversedGrid, JOB["num-clients"], tmp_path, "reversed", JOB) == reference
    assert _rounds(LocalGrid, 2, tmp_path, "two-nodes", JOB) == reference


# --- through `flwr run` -----------------------------------------------------------------------------

# Each seed method and FedAvg, at the golden runs' size, with the MLP where the method allows it.
E2E_CASES = {
    "fedavg": {**JOB},
    "sfl": {**BASE, **CASES["sfl"], "model": "mlp"},
    "sfl-star": {**BASE, **CASES["sfl-star"], "model": "mlp"},
    "flt": {**BASE, **CASES["flt"], "model": "mlp"},
    "fedska": {**BASE, **CASES["fedska-fused"], "method": "fedska", "model": "mlp"},
    "fedcg": {**BASE, **CASES["fedcg-sampled"], "method": "fedcg"},
}


def _value(value) -> str:
    return f"'{value}'" if isinstance(value, str) else str(value).lower() if isinstance(value, bool) \
        else repr(value)


@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    from tests.simulation_superlink import simulation_superlink
    with simulation_superlink(tmp_path_factory.mktemp("flwr-home")) as env:
        yield env


@pytest.fixture(scope="module")
def cpu_load():
    """A process keeping one core busy while the federations run."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    burner.kill()
    burner.wait()


@pytest.mark.e2e
@pytest.mark.parametrize("case", sorted(E2E_CASES))
def test_flwr_run_gives_the_in_process_numbers(case, superlink, cpu_load, tmp_path):
    from server_app.harness.simulate import simulate
    from tests.simulation_superlink import flwr

    job = {**E2E_CASES[case], "method": E2E_CASES[case].get("method", case)}
    expected = _untimed(simulate({**job, "output-dir": str(tmp_path), "run-name": "in-process"},
                                    num_nodes=1))
    node_counts = (2, job["num-clients"]) if case == "fedavg" else (2,)
    for nodes in node_counts:
        name = f"flwr-{nodes}"
        overrides = " ".join(f"{key}={_value(value)}" for key, value in
                             {**job, "output-dir": str(tmp_path), "run-name": name}.items())
        result = flwr(superlink, "run", ".", "e2e", "--stream", "--federation-config",
                      f"num-supernodes={nodes}", "--run-config", overrides, timeout=600)
        summary = tmp_path / name / "summary.json"
        assert summary.exists(), result.stdout[-3000:] + result.stderr[-2000:]
        got = _untimed(json.loads(summary.read_text()))
        assert got == expected, f"{case}, {nodes} simulated SuperNodes"
