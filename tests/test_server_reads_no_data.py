"""The server reads no client data, in either data mode: the label-sharing graph and every
ground-truth figure come from what the clients report in `query.identify`
(`strategies.shared.priors.ClientReports`), label sets only when the run asks for them, and the
figures are absent, not guessed, when the clients report no group or domain field.

Every data loader is wrapped so that a call from outside the client's code (no `client_app` frame on
the stack: the ServerApp, the runner, a strategy, a reporter) fails the run; the in-process grid runs
the real ClientApp, whose calls are allowed."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict

import datasets.federated
import datasets.local
import datasets.sources
import datasets.traffic
from client_app.identify import identify
from datasets.export import export
from server_app.harness.local_grid import set_task_identity
from server_app.harness.simulate import simulate
from strategies.shared.messages import CONFIG, IDENTIFY, IdentifyReply, IdentifyRequest
from strategies.shared.priors import ClientReport, ClientReports, reports_of
from strategies.shared.run_config import RunConfig, default_run_config
from tests.method_runs import BASE, CASES

pytestmark = pytest.mark.federation

CLIENT_CODE = str(Path(__file__).resolve().parent.parent / "client_app")
LOADERS = [(datasets.sources, "load_source"), (datasets.federated, "load_partition"),
           (datasets.federated, "load_client_data"), (datasets.federated, "client_sizes"),
           (datasets.local, "load_local"), (datasets.local, "discover"),
           (datasets.local, "client_tensors"), (datasets.traffic, "load_traffic")]


class ServerRead(AssertionError):
    """A data loader was called outside the client's code."""


@pytest.fixture
def guard(monkeypatch):
    """`guard()` wraps every data loader, wherever a module bound it by name; from then on a call
    with no `client_app` frame on the stack is recorded and raised. Returns the recorded calls
    (empty: the server read none)."""
    return lambda: install_guard(monkeypatch)


@pytest.fixture
def server_reads(guard) -> list[str]:
    return guard()


def install_guard(monkeypatch) -> list[str]:
    calls: list[str] = []
    for module, name in LOADERS:
        original = getattr(module, name)

        def guarded(*args: Any, _original=original, _name=name, **kwargs: Any) -> Any:
            stack = traceback.extract_stack()
            if not any(frame.filename.startswith(CLIENT_CODE) for frame in stack):
                where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in stack[-6:-1])
                calls.append(f"{_name} called from the server side: {where}")
                raise ServerRead(calls[-1])
            return _original(*args, **kwargs)

        for loaded in list(sys.modules.values()):
            if getattr(loaded, name, None) is original:
                monkeypatch.setattr(loaded, name, guarded)
    return calls


def keys_for(case: str, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    keys = {**BASE, **CASES[case], "num-rounds": 2, "output-dir": str(tmp_path), **extra}
    keys.setdefault("method", case)
    return keys


# the run's case, what it needs the clients to report, and the figures that show it arrived
JOBS = {
    "sfl": ("sfl-star", lambda s: s["sfl"]["graph-source"] == "label-sharing"  # sfl.beta < 1
            and s["sfl"]["learned-share-true-clusters-final"] is not None),
    "flt": ("flt", lambda s: "ari" in s["flt"] and "edges-inside-true-clusters" in s["flt"]),
    "fedcg": ("fedcg", lambda s: "nmi" in s["fedcg"] and s["fedcg"]["accuracy"]["by-domain"]),
}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_partitioned_and_local_runs_read_no_data_on_the_server(job, tmp_path, guard):
    """The same job partitioned and on its exported folders: no loader is called by the server, the
    ground-truth figures are there (from the clients' reports) and equal in both modes."""
    case, has_truth = JOBS[job]
    keys = keys_for(case, tmp_path, **({"sfl.beta": 0.5} if job == "sfl" else {}))
    # the clients' folders, written before the guard (the export reads the data set here)
    folders = export(RunConfig.from_flower({**default_run_config(), **keys}), tmp_path / "data")
    server_reads = guard()
    partitioned = simulate({**keys, "run-name": "partitioned"}, num_nodes=2)
    local = simulate({**keys, "run-name": "local"},
                     node_configs=[{"data-dir": str(folder)} for folder in folders])
    assert server_reads == []
    assert has_truth(partitioned) and has_truth(local)
    assert untimed(local[job]) == untimed(partitioned[job])


def untimed(value: Any) -> Any:
    """A summary section without wall-clock times."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if "seconds" not in k}
    return value


def test_the_guard_catches_a_server_side_read(server_reads):
    """The guard is real: the old server path (rebuilding the partition) would be caught."""
    cfg = RunConfig.from_flower({**default_run_config(), "dataset": "digits", "partition": "iid"})
    with pytest.raises(ServerRead):
        datasets.federated.load_partition(cfg.data_spec)
    assert server_reads and "load_partition called from the server side" in server_reads[0]


def write_npz(path: Path, labels: list[int], **extra: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(len(labels)).random((len(labels), 1, 28, 28), dtype=np.float32)
    np.savez(path, x=x, y=np.array(labels), **extra)


def test_without_group_fields_the_ground_truth_figures_are_absent(tmp_path, tiny_run, server_reads):
    """Clients whose data has no group / domain field: SFL* runs on the label-sharing graph of their
    reported label sets, and reports no share inside true groups (nothing is guessed)."""
    for i, labels in enumerate([[0, 1] * 10, [1, 2] * 10, [5, 6] * 10, [7, 8] * 12]):
        write_npz(tmp_path / "site" / f"c{i}" / "data.npz", labels)
    summary = simulate({**tiny_run, "method": "sfl-star", "sfl.gl-k": 2, "sfl.beta": 0.5},
                       node_configs=[{"data-dir": str(tmp_path / "site")}])
    assert server_reads == []
    prior = np.load(Path(tiny_run["output-dir"]) / tiny_run["run-name"] / "prior-graph.npy")
    assert (prior > 0).astype(int).tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0],
                                               [0, 0, 0, 1]]
    assert not [key for key in summary["sfl"] if "share" in key]


def identify_reply(context: Context, label_sets: bool) -> IdentifyReply:
    set_task_identity()
    request = IdentifyRequest(code_fingerprint="x", num_clients=4, label_sets=label_sets)
    message = Message(RecordDict({CONFIG: request.config()}), dst_node_id=context.node_id,
                      message_type=IDENTIFY)
    return IdentifyReply.read(identify(message, context).content[CONFIG])


def test_label_sets_are_reported_only_when_the_run_asks(tmp_path):
    write_npz(tmp_path / "a" / "data.npz", [3, 1, 3, 1, 1], group=np.array([2, 2, 2, 5, 2]),
              domain=np.array([0, 0, 2, 2, 2]))
    write_npz(tmp_path / "b" / "data.npz", [4, 4, 4, 4])
    run_config = {**default_run_config(), "dataset": "digits", "model": "mclr"}
    context = Context(run_id=1, node_id=7, node_config={"data-dir": str(tmp_path)},
                      state=RecordDict(), run_config=run_config)
    quiet = identify_reply(context, label_sets=False)
    assert quiet.label_sets == [] and quiet.groups == [2, -1]
    asked = identify_reply(context, label_sets=True)
    reports = dict(zip(asked.client_names, reports_of(asked)))
    assert reports["b"] == ClientReport(labels=(4,), group=None, domain_counts=None)
    assert reports["a"].group == 2 and set(reports["a"].labels) <= {1, 3}
    assert sum(reports["a"].domain_counts) == 4  # the train part of a locally split .npz

    partition = Context(run_id=1, node_id=8, node_config={"partition-id": 1, "num-partitions": 2},
                        state=RecordDict(), run_config={**run_config, "num-clients": 4,
                                                        "partition": "label-clusters",
                                                        "num-clusters": 2})
    slot = identify_reply(partition, label_sets=False)
    assert slot.label_sets == [] and len(slot.groups) == 2 and min(slot.groups) >= 0


def test_reports_give_the_label_graph_and_groups_and_left_out_clients_join_no_group():
    reports = ClientReports(4, {0: ClientReport((1, 2), 0), 1: ClientReport((2,), 0),
                                3: ClientReport((7,), 1)}, left_out=[2])
    assert reports.label_graph().tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0],
                                              [0, 0, 0, 1]]
    assert reports.groups().tolist() == [0, 0, -3, 1]
    truth, kind = reports.structure()
    assert kind == "true-clusters" and truth[0, 1] == 1 and truth[2].sum() == 1
    missing = ClientReports(4, {0: ClientReport((1,), 0), 1: ClientReport((2,), None)})
    assert missing.label_graph() is None and missing.groups() is None and missing.truth() is None
