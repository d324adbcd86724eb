"""Where does one deployed message's time go inside a fresh ClientApp process, stage by stage?

What one deployed message costs inside the ClientApp process, stage by stage.

    python -m benchmarks.studies.client_profile --name client-profile [--repeats 5] [--method fedavg]

Deployed, every message runs in a fresh `flwr-clientapp` process. This starts that many fresh
interpreters, each handling one `train` message of the deploy benchmark's job (`benchmarks.studies.deploy_speed`
JOB: digits, cnn, 100 samples per client, 1 local epoch) as the process would, and times its stages:
interpreter start, Flower's ClientApp entry point imports (`flwr.supernode.cli`), `import torch`,
Bouquet's ClientApp imports beyond torch (`client_app.app`), the run config and the client's data
(`client_runtime`: reading the data set and partitioning it, done once per process), the training,
and the reply's records. Medians over `--repeats` processes. Writes benchmarks/results/<name>.md/.json.
What the process does not show (the SuperNode's pull, the transfer, the ServerApp's polls) is the rest
of a deployed round: `docs/deploy-cost.md` sets these beside the deploy benchmark's round times.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import benchmark_parser, code_version, machine_facts, markdown_table, write_study

REPO = Path(__file__).resolve().parent.parent.parent
RESULTS = REPO / "benchmarks" / "results"

# One train message, handled as a fresh flwr-clientapp process would; prints the stage times (s).
STAGES = r"""
import json, sys, time
marks = [("start", time.perf_counter(), time.process_time())]
def mark(name):
    marks.append((name, time.perf_counter(), time.process_time()))
from flwr.supernode.cli import flwr_clientapp  # Flower's entry point of the ClientApp process
from flwr.app import ArrayRecord, Context, Message, RecordDict
mark("flower imports")
import torch
mark("import torch")
from client_app.app import app
mark("bouquet imports")
from server_app.harness.local_grid import set_task_identity  # (Flower's Message needs one)
set_task_identity()
from client_app.runtime import client_runtime
from models import build_model
from strategies.shared.messages import CLIENT, CONFIG, GLOBAL, ClientAddress, TrainInstructions
from strategies.shared.run_config import default_run_config
job = json.loads(sys.argv[1])
run_config = {**default_run_config(), **job}
context = Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 1},
                  state=RecordDict(), run_config=run_config)
arrays = ArrayRecord(build_model(job["model"], (1, 28, 28), 10).state_dict())
train = Message(RecordDict({GLOBAL: arrays, CLIENT: ClientAddress(client_id=0).config(),
                            CONFIG: TrainInstructions(server_round=1, lr=job["lr"], momentum=0.0,
                                                      local_epochs=1, batch_size=job["batch-size"],
                                                      seed=0).config()}),
                dst_node_id=7, message_type="train")
mark("message built (not a client cost)")
client_runtime(train, context)
mark("run config + client data")
reply = app(train, context)
mark("train handler (training + reply records)")
assert not reply.has_error(), reply.error
print(json.dumps([[b[0], [b[1] - a[1], b[2] - a[2]]] for a, b in zip(marks, marks[1:])]))
"""


def interpreter_start() -> tuple[float, float]:
    """(wall, CPU of the child) of `python -c pass`."""
    before = os.times()
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    after = os.times()
    return (time.perf_counter() - started,
            after.children_user + after.children_system - before.children_user - before.children_system)


def one_process(job: dict) -> tuple[dict[str, float], float]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", STAGES, json.dumps(job)], cwd=REPO, check=True,
                          capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    wall = time.perf_counter() - started
    return dict(json.loads(done.stdout.strip().splitlines()[-1])), wall


def stage_table(rows: list[tuple[str, list[float], str]], wall: float) -> list[str]:
    """One row per stage (name, [wall s, CPU s], whose), then the whole process's wall time."""
    return markdown_table(
        ["stage", "wall s (median)", "CPU s (median)", "whose"], "lrrl",
        [*((name, f"{value[0]:.3f}", f"{value[1]:.3f}", who) for name, value, who in rows),
         ("whole process (wall, including the harness's message building)", f"{wall:.3f}", None, None)])


def main() -> None:
    from benchmarks.studies.deploy_speed import JOB

    parser = benchmark_parser("studies.client_profile", __doc__)
    parser.add_argument("--name", default="client-profile")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--method", default="fedavg")
    args = parser.parse_args()
    job = {**JOB, "method": args.method, "num-clients": 3}
    starts = [interpreter_start() for _ in range(args.repeats)]
    runs = [one_process(job) for _ in range(args.repeats)]
    stages = {name: [statistics.median(r[0][name][i] for r in runs) for i in (0, 1)] for name in runs[0][0]}
    wall = statistics.median(w for _, w in runs)
    rows = [("interpreter start", [statistics.median(s[i] for s in starts) for i in (0, 1)], "Python")]
    owner = {"flower imports": "Flower (its ClientApp process)", "import torch": "the model code (torch)",
             "bouquet imports": "Bouquet", "run config + client data": "Bouquet",
             "train handler (training + reply records)": "Bouquet (the method's work)"}
    rows += [(name, value, owner.get(name, "—")) for name, value in stages.items()]
    machine = machine_facts()
    lines = ["# One deployed message inside the ClientApp process", "",
             f"Command: `python -m benchmarks.studies.client_profile {' '.join(sys.argv[1:])}`  ",
             f"flwr {machine['flwr']}, torch {machine['torch']}; {machine['cpu']}, {machine['cores']} "
             f"cores shared with other jobs (load average {os.getloadavg()[0]:.1f} at the end: the wall "
             f"times wait for a core, the CPU times do not); medians over {args.repeats} fresh "
             f"processes. Job: the deploy benchmark's ({args.method}, digits, cnn, "
             f"{JOB['max-samples-per-client']} samples per client, 1 local epoch).", "",
             *stage_table(rows, wall)]
    write_study(RESULTS, args.name,
                {"stages": stages, "interpreter-start": starts, "runs": [r for r, _ in runs],
                 "walls": [w for _, w in runs], "job": job, "machine": machine, "code": code_version(),
                 "command": "python -m benchmarks.studies.client_profile " + " ".join(sys.argv[1:])},
                "\n".join(lines) + "\n", indent=2, final_newline=True, echo=None)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
