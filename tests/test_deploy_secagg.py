"""Secure aggregation deployed end to end (docs/privacy.md, "Secure aggregation"): `flower-superlink`
with TLS and SuperNode authentication and 4 authenticated `flower-supernode`s over gRPC, started by
`server_app.harness.loopback` (the deployment tests' harness), run FedAvg under
`secure-aggregation = 'secagg+'`. Client 2's SuperNode is stopped, by the PID it was started with, right
after it answered round 1's share-keys stage: its masked model never arrives, so the server must
remove its pairwise masks from the survivors' sum with the survivors' shares of its key.

The round completes with the 3 survivors, its model is the plain FedAvg of their updates (an
in-process run without secure aggregation in which client 2 fails, within the quantization error),
`rounds.jsonl`'s `secagg` names the dropped client, and the run goes on to finish (the survivors
evaluate the round's model). One round: every message costs a ClientApp process, and secure
aggregation sends four per client and round, so a second round would double the test's time (CI runs
it on 2 cores); tests/test_secagg.py runs rounds after a drop in process.

The node is stopped with SIGTERM: it signs off, so the SuperLink answers the messages addressed to it
at once. A SIGKILLed SuperNode is marked offline only after two missed 30 s heartbeats; every phase
sent to it meanwhile would wait for `round-timeout` (the drop itself is the same: no masked vector).
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client_app.app import app as client_app
from server_app.app import run
from server_app.checkpoint import CheckpointStore
from server_app.harness.local_grid import LocalGrid
from server_app.harness.loopback import LoopbackFederation
from strategies.shared.messages import CLIENT
from strategies.shared.run_config import RunConfig, default_run_config
from tests.conftest import REPO
from tests.test_secagg import Models  # each round's model, as the round ended

pytestmark = pytest.mark.e2e

DROPPED = 2  # the client (partition) whose SuperNode leaves after share-keys
JOB = {"method": "fedavg", "dataset": "digits", "model": "mclr", "partition": "iid",
       "num-clients": 4, "num-rounds": 1, "max-samples-per-client": 100,
       "lr": 0.1, "finetune-epochs": 0, "client-threads": 1, "round-timeout": 60.0,
       "checkpoint-every": 1}
SECURE = {"secure-aggregation": "secagg+"}
# Executors ask for work every 0.1 s instead of 1 s (a Flower setting; see benchmarks/studies/deploy_speed.py).
FAST = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}
# a SuperNode's log line pair for a reply it sent (Flower's supernode logs "Sending" then "Sent")
SENT_SECAGG = r"Sending: query\.secagg message[^\n]*\n[^\n]*Sent successfully"


def in_process(tmp_path: Path, name: str, failing: int | None) -> Models:
    """The job in this process without secure aggregation; `failing`'s train requests fail."""
    def client(message, context):
        if (message.metadata.message_type.startswith("train")
                and message.content[CLIENT]["client-id"] == failing):
            raise RuntimeError("client gone")
        return client_app(message, context)

    run_config = {**default_run_config(), **JOB, "round-timeout": 10.0,
                  "output-dir": str(tmp_path), "run-name": name}
    models = Models()
    run(LocalGrid(client, JOB["num-clients"], run_config), RunConfig.from_flower(run_config),
        callbacks=[models])
    return models


def deployed_model(directory: Path) -> dict[str, np.ndarray]:
    """The global model the run's last checkpoint holds (round 1's)."""
    state = CheckpointStore(directory / "checkpoints").load_latest()
    assert state["round"] == 1
    return {k: v.numpy() for k, v in state["arrays"].items()}


def count(path: Path, pattern: str) -> int:
    return len(re.findall(pattern, path.read_text(errors="replace")))


def test_a_supernode_gone_after_share_keys_is_unmasked_by_the_survivors(tmp_path):
    started = time.monotonic()
    federation = LoopbackFederation(tmp_path / "deploy", 4, env_extra=FAST)
    try:
        federation.start()
        process = federation.procs[f"supernode-{DROPPED}"].process
        log = federation.procs[f"supernode-{DROPPED}"].log
        seen = count(log, SENT_SECAGG)
        result: dict[str, Any] = {}
        config = {**JOB, **SECURE, "output-dir": str(tmp_path / "out"), "run-name": "secagg"}
        job = threading.Thread(target=lambda: result.update(outcome=federation.run(REPO, config)))
        job.start()
        try:
            deadline = time.monotonic() + 240
            while count(log, SENT_SECAGG) < seen + 2:  # setup's reply, then share-keys'
                assert time.monotonic() < deadline, f"no share-keys reply in {log}"
                assert job.is_alive(), f"the run ended before share-keys: {result}"
                time.sleep(0.05)
            federation.stop_supernode(DROPPED, signal.SIGTERM)  # by the PID it was started with
            assert process.poll() is not None
        finally:
            job.join(timeout=600)
        outcome = result["outcome"]
        assert outcome.completed, f"{outcome.status}: {outcome.details}\n{outcome.log[-3000:]}"
    finally:
        federation.stop()
    deployed_seconds = time.monotonic() - started

    directory = tmp_path / "out" / "secagg"
    rounds = [json.loads(line) for line in (directory / "rounds.jsonl").read_text().splitlines()]
    first = rounds[1]
    assert first["secagg"] == {"sampled": 4, "survivors": 3, "dropped": [DROPPED], "threshold": 3,
                               "num-shares": 4, "completed": True}
    assert first["clients-trained"] == 3 and first["failed-clients"] == [DROPPED]
    # the run goes on without the node: the three that are left evaluate the round's model
    assert first["evaluated-clients"] == 3
    assert json.loads((directory / "summary.json").read_text())["final"]["round"] == 1

    # round 1's model: the plain FedAvg of the survivors' updates, within the quantization error
    # (each survivor's value rounded to a step of 2·clipping-range / quantization-range)
    cfg = RunConfig.from_flower({**default_run_config(), **JOB, **SECURE})
    bound = 3 * 2 * cfg.secagg_clipping_range / cfg.secagg_quantization_range + 1e-6
    model = deployed_model(directory)
    survivors = in_process(tmp_path / "reference", "survivors", DROPPED)
    everyone = in_process(tmp_path / "reference", "everyone", None)
    for name, value in survivors.arrays[1].items():
        np.testing.assert_allclose(model[name], value, rtol=0, atol=bound)
    # and not the mean with the dropped client's update in it
    assert max(np.abs(model[n] - v).max() for n, v in everyone.arrays[1].items()) > 100 * bound
    print(f"deployed part: {deployed_seconds:.1f} s")
