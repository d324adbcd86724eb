"""How do deployed rounds compare: Bouquet's fedavg against a minimal Flower app on the same deployment, and each method against deployed fedavg?

Deployment speed: Bouquet's fedavg against a minimal Flower FedAvg app on the same deployment,
and every method against deployed fedavg.

    python -m benchmarks.studies.deploy_speed --name deploy-speed-side-by-side [--pairs 3] [--rounds 5]
        [--methods fedprox ditto ... local] [--default-poll]

One `server_app.harness.loopback` deployment (SuperLink + 3 SuperNodes, TLS + SuperNode auth, on loopback,
the README's command lines) serves every run of the session. Runs alternate: Bouquet `fedavg`, then
the minimal Flower app (`benchmarks/minimal_flower_app`: Flower's own `FedAvg` and `start()`, the same
torch CNN, digits data, samples per client and local epoch, no Bouquet code), `--pairs` times with
the order swapped every pair. Then each of `--methods` once. With `--default-poll` a second
deployment with Flower's default executor poll (1.0 s) runs one more pair, to measure that setting.

Per method (the methods table): seconds per round *averaged* over rounds 1..R of its run (rounds
with an extra exchange, such as FedCG's teacher replacements, count as they come), the phases of
every round (rounds.jsonl `phases`; the last round's includes the final evaluation), and the ratio to
the mean of the `bouquet fedavg` runs of the same session. FedCG runs 20 rounds (two teacher periods at
its default period of 10) and FLT 12 (its one-shot round within a run), `METHOD_ROUNDS`;
`--method-rounds METHOD=R` changes a method's.

Seconds per round: Bouquet's `seconds` of rounds 1..R from rounds.jsonl (a round = its one phase,
which also carries the previous round's evaluation; the last round includes the final evaluation);
Flower's from the wall-clock start of each round's `configure_train` to the next (the last to the end
of `start()`), so a round is its train and evaluate phases. Medians over rounds, then over runs; the
ratio is median Bouquet / median Flower. The 1-minute load average is recorded before every run.
Writes benchmarks/results/<name>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, code_version, machine_facts, markdown_table, write_study
from server_app.harness import deploy
from server_app.harness.loopback import LoopbackFederation
from server_app.harness.outcome import RunFailedError, check_run

REPO = Path(__file__).resolve().parent.parent.parent
RESULTS = REPO / "benchmarks" / "results"
MINIMAL_APP = REPO / "benchmarks" / "minimal_flower_app"
SAMPLES = 100  # per client: 80 train, 20 test
JOB = {"method": "fedavg", "dataset": "digits", "model": "cnn", "partition": "iid",
       "num-clients": 3, "max-samples-per-client": SAMPLES, "test-fraction": 0.2, "lr": 0.05,
       "batch-size": 32, "local-epochs": 1, "client-threads": 1, "finetune-epochs": 0,
       "checkpoint-every": 0, "round-timeout": 300.0}
METHOD_SETTINGS = {  # small but complete settings for 3 clients (FedCG: a teacher period of 2)
    "ifca": {"ifca.clusters": 2},
    "fedsem": {"fedsem.clusters": 2},
    "flt": {"flt.latent-dim": 16, "flt.ae-epochs": 1},
    "sfl": {"partition": "shards"},
    "sfl-star": {"partition": "shards", "sfl.gl-k": 2},
    "fedcg": {"partition": "domains", "domain-test-clients": 0.34, "batch-size": 10,
              "fedcg.adj-warmup": 1, "fedcg.bottleneck": 8, "fedcg.domain-stride": 2},
    "fedska": {"partition": "shards"},
}
# rounds of a method whose exchanges come in periods or once (default: --rounds): FedCG two teacher
# periods at its default period (10), FLT its one-shot round within 12
METHOD_ROUNDS = {"fedcg": 20, "flt": 12}
METHODS = ["fedprox", "ditto", "ifca", "fedsem", "flt", "sfl", "sfl-star", "fedska", "fedcg", "fedu",
           "fedper", "lg-fedavg", "local"]  # besides fedavg, which the pairs run


FAILURES: list[dict] = []  # runs Flower ended as failed (each retried once)
ARGS: argparse.Namespace | None = None


def load() -> float:
    return os.getloadavg()[0]


def bouquet_run(fed: LoopbackFederation, job: dict, out: Path) -> dict[str, Any]:
    started = time.perf_counter()
    check_run(REPO, "bouquet", {**job, "output-dir": str(out), "run-name": "run"},
              env=fed.env(), cwd=fed.root, timeout=1800)
    wall = time.perf_counter() - started
    rounds = [json.loads(line) for line in (out / "run" / "rounds.jsonl").read_text().splitlines()]
    trained = [r for r in rounds if r["round"] > 0]
    summary = json.loads((out / "run" / "summary.json").read_text())
    final = summary["final"]
    return {"seconds": [r["seconds"] for r in trained], "phases": [r.get("phases") for r in rounds],
            "wall": wall, "accuracy": final.get("global-accuracy",
                                                final.get("personalized", {}).get("mean"))}


def flower_run(fed: LoopbackFederation, rounds: int, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    timings = out / "timings.json"
    started = time.perf_counter()
    check_run(MINIMAL_APP, "bouquet", {"num-server-rounds": rounds, "lr": JOB["lr"],
                                       "batch-size": JOB["batch-size"],
                                       "samples-per-client": SAMPLES, "timings-file": str(timings)},
              env=fed.env(), cwd=fed.root, timeout=1800)
    wall = time.perf_counter() - started
    data = json.loads(timings.read_text())
    marks = [*data["round-starts"], data["end"]]
    return {"seconds": [b - a for a, b in zip(marks, marks[1:])], "phases": [2] * rounds,
            "wall": wall, "accuracy": 100.0 * data["accuracy"][str(rounds)]
            if str(rounds) in data["accuracy"] else None}


def measure(side: str, go, rows: list[dict], **meta) -> dict:
    """Run `go` (one `flwr run`); a run that Flower ends as failed is noted and retried once."""
    before = load()
    print(f"{side} {meta} (load {before:.1f}) ...", flush=True)
    try:
        result = go()
    except RunFailedError as err:
        first_line = str(err).splitlines()[0]
        print(f"  failed, retrying once: {first_line}", flush=True)
        FAILURES.append({"side": side, **meta, "load-before": before, "error": first_line})
        result = go()
    row = {"side": side, **meta, "load-before": before, "load-after": load(), **result,
           "median": statistics.median(result["seconds"])}
    rows.append(row)
    print(f"  {row['median']:.2f} s/round, rounds {[round(s, 2) for s in row['seconds']]}, "
          f"wall {row['wall']:.0f} s, load {before:.1f} -> {row['load-after']:.1f}", flush=True)
    save(rows)
    return row


def session(tmp: Path, poll: str | None, pairs: int, rounds: int, methods: list[str],
            rows: list[dict], method_rounds: dict[str, int] | None = None) -> None:
    method_rounds = METHOD_ROUNDS if method_rounds is None else method_rounds
    env = {} if poll is None else {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": poll}
    poll_label = poll or deploy.EXECUTOR_ENV["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"]
    job = {**JOB, "num-rounds": rounds}
    with LoopbackFederation(tmp / f"fed-{poll_label}", 3, env_extra=env) as fed:
        for pair in range(pairs):
            sides = [("bouquet fedavg", lambda n=len(rows): bouquet_run(fed, job, tmp / f"b{n}")),
                     ("minimal flower fedavg", lambda n=len(rows): flower_run(fed, rounds,
                                                                            tmp / f"f{n}"))]
            for side, go in (sides if pair % 2 == 0 else sides[::-1]):
                measure(side, go, rows, poll=poll_label, pair=pair)
        for method in methods:
            method_job = {**job, "method": method, **METHOD_SETTINGS.get(method, {}),
                          "num-rounds": method_rounds.get(method, rounds)}
            measure(f"bouquet {method}", lambda: bouquet_run(fed, method_job, tmp / method), rows,
                    poll=poll_label, pair=None)


def median_of(rows: list[dict], side: str, poll: str) -> float | None:
    values = [r["median"] for r in rows if r["side"] == side and r["poll"] == poll]
    return statistics.median(values) if values else None


def report(rows: list[dict], args: argparse.Namespace) -> str:
    chosen = deploy.EXECUTOR_ENV["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"]
    machine = machine_facts()
    ratios = []
    for poll in sorted({r["poll"] for r in rows}):
        b, f = median_of(rows, "bouquet fedavg", poll), median_of(rows, "minimal flower fedavg", poll)
        if b is not None and f is not None:
            ratios.append((f"{poll}{' (shipped)' if poll == chosen else ' (Flower default)'}", f"{b:.2f}",
                           f"{f:.2f}", f"**{b / f:.2f}**"))
    lines = [
        "# Deployment speed: Bouquet vs a minimal Flower FedAvg app, same deployment, alternating",
        "", f"Command: `python -m benchmarks.studies.deploy_speed {' '.join(sys.argv[1:])}`  ",
        f"flwr {machine['flwr']}, torch {machine['torch']}; {machine['cpu']}, {machine['cores']} "
        "cores. 3 SuperNodes on loopback with TLS + SuperNode auth (`server_app.harness.loopback`); "
        f"digits, cnn, iid, {SAMPLES} samples per client, 1 local epoch, {args.rounds} rounds per "
        "run. The load average (1 min) is the machine's, shared with other jobs.", "",
        *markdown_table(
            ["executor poll (s)", "Bouquet fedavg s/round", "minimal Flower s/round", "ratio"], "rrrr",
            ratios)]
    lines += methods_table(rows)
    lines += ["", "Every run, in order:", "",
              *markdown_table(
                  ["run", "executor poll (s)", "s/round (median)", "rounds 1..R (s)",
                   "phases per round (round 0..R)", "final accuracy (%)", "flwr run wall (s)",
                   "load before → after"], "lrrllrrl",
                  [(r["side"], r["poll"], f"{r['median']:.2f}", ", ".join(f"{s:.1f}" for s in r["seconds"]),
                    ", ".join(str(p) for p in r["phases"]),
                    f"{r['accuracy']:.1f}" if r.get("accuracy") is not None else "-", f"{r['wall']:.0f}",
                    f"{r['load-before']:.1f} → {r['load-after']:.1f}") for r in rows])]
    for failure in FAILURES:
        lines.append(f"\nFailed and retried: {failure['side']} (load {failure['load-before']:.1f}): "
                     f"{failure['error']}")
    return "\n".join(lines) + "\n"


def methods_table(rows: list[dict]) -> list[str]:
    """Each Bouquet method's mean seconds per round over its run, its phases per round and its
    ratio to the mean of the fedavg runs (same session, the shipped executor poll)."""
    chosen = deploy.EXECUTOR_ENV["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"]
    runs = [r for r in rows if r["side"].startswith("bouquet ") and r["poll"] == chosen]
    fedavg = [statistics.mean(r["seconds"]) for r in runs if r["side"] == "bouquet fedavg"]
    if not runs or not fedavg:
        return []
    base = statistics.mean(fedavg)
    lines = ["", "Every method, deployed (mean s/round over rounds 1..R of the run; fedavg: the mean of "
             f"its {len(fedavg)} run(s)); phases of rounds 1..R (the last includes the final "
             "evaluation):", ""]
    table, seen = [], []
    for r in runs:
        method = r["side"].removeprefix("bouquet ")
        if method in seen:
            continue
        seen.append(method)
        same = [statistics.mean(x["seconds"]) for x in runs if x["side"] == r["side"]]
        mean = statistics.mean(same)
        phases = [p for p in r["phases"][1:] if p is not None]
        table.append((method, f"{mean:.2f}", f"{mean / base:.2f}", ", ".join(str(p) for p in phases),
                      max(phases[:-1], default=0)))
    return lines + markdown_table(
        ["method", "s/round (mean over the run)", "ratio to fedavg", "phases per round (1..R)",
         "most phases in a round before the last"], "lrrlr", table)


def save(rows: list[dict]) -> None:
    """Write the results so far (after every run, so an interrupted session keeps its table)."""
    write_study(RESULTS, ARGS.name,
                {"rows": rows, "failures": FAILURES, "job": JOB, "machine": machine_facts(),
                 "code": code_version(),
                 "command": "python -m benchmarks.studies.deploy_speed " + " ".join(sys.argv[1:])},
                report(rows, ARGS), indent=2, final_newline=True, echo=None)


def main() -> None:
    global ARGS
    parser = benchmark_parser("studies.deploy_speed", __doc__)
    parser.add_argument("--name", default="deploy-speed-side-by-side")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--methods", nargs="*", default=METHODS)
    parser.add_argument("--method-rounds", nargs="*", default=[], metavar="METHOD=R",
                        help="rounds of a method's run (default: " + ", ".join(
                            f"{m}={r}" for m, r in METHOD_ROUNDS.items()) + "; others --rounds)")
    parser.add_argument("--default-poll", action="store_true",
                        help="also one pair with Flower's default executor poll (1.0 s)")
    args = ARGS = parser.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bouquet-deploy-speed-") as tmp:
        method_rounds = dict(METHOD_ROUNDS)
        for item in args.method_rounds:
            method, _, value = item.partition("=")
            if not value.isdigit() or int(value) < 1:
                parser.error(f"--method-rounds {item!r}: expected METHOD=R with R ≥ 1")
            method_rounds[method] = int(value)
        session(Path(tmp), None, args.pairs, args.rounds, args.methods, rows, method_rounds)
        if args.default_poll:
            session(Path(tmp), "1.0", 1, args.rounds, [], rows)
    save(rows)
    print(report(rows, args))


if __name__ == "__main__":
    main()
