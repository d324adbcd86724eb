"""How does Bouquet's fedavg under `flwr run` compare with Flower's minimal app in the same simulation, and with the same job in process?

`flwr run` speed: Bouquet's fedavg against Flower's minimal app in the same simulation, and the
same Bouquet job in process.

    python -m benchmarks.studies.flwr_run_speed                 # 20 simulated SuperNodes, 5 rounds, 3 pairs
    python -m benchmarks.studies.flwr_run_speed --pairs 5 --threads-variant 2

One simulation SuperLink (`flower-superlink --simulation`, its own FLWR_HOME and port, started and
stopped by this script) serves every run. The job is the minimal app's: digits data, the CNN, IID
`--samples` samples per client (80 % train / 20 % test), 1 local epoch of SGD (batch 32, lr 0.05),
FedAvg over every client in every round, `--clients` simulated SuperNodes, one client each, and
`--rounds` rounds; Bouquet with `finetune-epochs=0` (no "global + local epoch" evaluation). Each pair
runs, in turn (the order swapped every pair):

- `bouquet`: `flwr run . --stream --federation-config num-supernodes=N --run-config '...'`, the
  README's command, with Bouquet's defaults otherwise (checkpoints, TensorBoard, report.html);
- `flower`: the same for `benchmarks/minimal_flower_app` (Flower's own `FedAvg` and `start()`, no
  Bouquet code);
- `in-process`: the Bouquet job through `server_app.harness.simulate` in a fresh Python process (no
  SuperLink, no Ray; torch threads 1, as the benchmarks and tests compute);
- with `--threads-variant T`, also `bouquet` with `client-threads=T`.

Wall seconds: the whole command, from its start to its exit (imports, FAB build, Ray start, every
round, results). Seconds per round: Bouquet's rounds.jsonl `seconds` of rounds 1..R (a round carries
the previous round's evaluation, the last one also the final evaluation); the minimal app's from the
start of one round's `configure_train` to the next (the last to the end of `start()`). "Outside the
rounds" is the wall time minus the rounds (start-up, Bouquet's identify exchange and round-0
evaluation, writing results, shutdown). Medians over pairs; the ratio is the median over pairs of
Bouquet's wall over the minimal app's wall of the same pair. The 1-minute load average is recorded
before every run. Writes benchmarks/results/<name>.md and .json.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    machine_facts,
    markdown_table,
    provenance,
    write_study,
)
from server_app.harness.outcome import run_config_arg

MINIMAL_APP = REPO / "benchmarks" / "minimal_flower_app"
BIN = Path(sys.executable).parent
TARGET = 1.2  # Bouquet's flwr run wall over the minimal app's
JOB = {"method": "fedavg", "dataset": "digits", "model": "cnn", "partition": "iid", "test-fraction": 0.2,
       "lr": 0.05, "batch-size": 32, "local-epochs": 1, "momentum": 0.0, "seed": 0,
       "fraction-train": 1.0, "finetune-epochs": 0}
IN_PROCESS = """
import json, sys, torch
torch.set_num_threads(1)
from server_app.harness.simulate import simulate
summary = simulate(json.loads(sys.argv[1]), num_nodes=int(sys.argv[2]))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def simulation_superlink(home: Path) -> Iterator[dict[str, str]]:
    """`flower-superlink --simulation` with FLWR_HOME `home` (connection `bench`); yields the
    environment of the `flwr` calls. Stopped, with the processes it started, by its process group."""
    port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\naddress = "127.0.0.1:{port}"\n'
        "insecure = true\n")
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = (home / "superlink.log").open("w")
    process = subprocess.Popen(
        [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--host", "127.0.0.1",
         "--port", str(port), "--database", str(home / "state.db")],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=home)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError("the SuperLink did not start: " + (home / "superlink.log").read_text()[-2000:])
        if process.poll() is not None:
            raise RuntimeError("the SuperLink exited: " + (home / "superlink.log").read_text()[-2000:])
        yield env
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def load() -> float:
    return os.getloadavg()[0]


def timed(argv: Sequence[str], env: dict[str, str] | None, cwd: Path, log: Path) -> float:
    """Run `argv` to its end (its output to `log`); its wall seconds. A non-zero exit is an error."""
    started = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(list(argv), env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                timeout=1800)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {result.returncode}: {log.read_text()[-2000:]}")
    return wall


def bouquet_job(clients: int, rounds: int, samples: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {**JOB, "num-clients": clients, "num-rounds": rounds, "max-samples-per-client": samples,
            **extra}


def bouquet_results(directory: Path, wall: float) -> dict[str, Any]:
    """Per-round seconds, runner seconds and final accuracy from a finished Bouquet run."""
    if not (directory / "summary.json").exists():
        log = directory.parent / f"{directory.name}.log"
        raise RuntimeError(f"no summary.json in {directory}: the run failed; its output ends: "
                           + (log.read_text()[-3000:] if log.exists() else "(no output)"))
    rounds = [json.loads(line) for line in (directory / "rounds.jsonl").read_text().splitlines()
              if line.strip()]
    summary = json.loads((directory / "summary.json").read_text())
    seconds = [r["seconds"] for r in rounds if r["round"] > 0]
    return {"wall": wall, "seconds": seconds, "outside-rounds": wall - sum(seconds),
            "runner-seconds": summary["total-seconds"],
            "accuracy": summary["final"].get("global-accuracy")}


def run_bouquet(env: dict[str, str], job: dict[str, Any], clients: int, out: Path,
                name: str) -> dict[str, Any]:
    config = {**job, "output-dir": str(out), "run-name": name}
    wall = timed([str(BIN / "flwr"), "run", str(REPO), "bench", "--stream", "--federation-config",
                  f"num-supernodes={clients}", "--run-config", run_config_arg(config)],
                 env, env_home(env), out / f"{name}.log")
    return bouquet_results(out / name, wall)


def run_flower(env: dict[str, str], clients: int, rounds: int, samples: int, out: Path,
               name: str) -> dict[str, Any]:
    timings = out / f"{name}.json"
    config = {"num-server-rounds": rounds, "lr": JOB["lr"], "batch-size": JOB["batch-size"],
              "samples-per-client": samples, "seed": JOB["seed"], "timings-file": str(timings)}
    wall = timed([str(BIN / "flwr"), "run", str(MINIMAL_APP), "bench", "--stream",
                  "--federation-config", f"num-supernodes={clients}", "--run-config",
                  run_config_arg(config)], env, env_home(env), out / f"{name}.log")
    if not timings.exists():
        raise RuntimeError(f"the minimal app wrote no {timings}: {(out / f'{name}.log').read_text()[-2000:]}")
    data = json.loads(timings.read_text())
    marks = [*data["round-starts"], data["end"]]
    seconds = [b - a for a, b in zip(marks, marks[1:])]
    accuracy = data["accuracy"].get(str(rounds))
    return {"wall": wall, "seconds": seconds, "outside-rounds": wall - sum(seconds),
            "accuracy": None if accuracy is None else 100.0 * accuracy}


def run_in_process(job: dict[str, Any], clients: int, out: Path, name: str) -> dict[str, Any]:
    config = {**job, "output-dir": str(out), "run-name": name}
    wall = timed([sys.executable, "-c", IN_PROCESS, json.dumps(config), str(clients)], None, REPO,
                 out / f"{name}.log")
    return bouquet_results(out / name, wall)


def env_home(env: dict[str, str]) -> Path:
    """Where `flwr` runs: the SuperLink's FLWR_HOME (not a checkout, so no app's folder is on the
    simulation's sys.path but the one the FAB installs)."""
    return Path(env["FLWR_HOME"])


def measure(args: Any, out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    job = bouquet_job(args.clients, args.rounds, args.samples, {})
    variant = (bouquet_job(args.clients, args.rounds, args.samples,
                           {"client-threads": args.threads_variant})
               if args.threads_variant else None)
    home = out / "flwr-home"
    home.mkdir()
    with simulation_superlink(home) as env:
        # untimed warm-up of both apps (1 round): the first run builds caches the others reuse
        run_bouquet(env, bouquet_job(args.clients, 1, args.samples, {}), args.clients, out, "warm-up")
        run_flower(env, args.clients, 1, args.samples, out, "warm-up-flower")
        for pair in range(args.pairs):
            sides = ["bouquet", "flower", "in-process"] + (["bouquet-threads"] if variant else [])
            if pair % 2:
                sides = sides[1::-1] + sides[2:]
            for side in sides:
                before = load()
                name = f"{side}-{pair}"
                print(f"pair {pair}: {side} (load {before:.1f}) ...", flush=True)
                if side == "bouquet":
                    result = run_bouquet(env, job, args.clients, out, name)
                elif side == "bouquet-threads":
                    result = run_bouquet(env, variant, args.clients, out, name)
                elif side == "flower":
                    result = run_flower(env, args.clients, args.rounds, args.samples, out, name)
                else:
                    result = run_in_process(job, args.clients, out, name)
                rows.append({"pair": pair, "side": side, "load-before": before, **result})
                print(f"  wall {result['wall']:.1f} s, s/round {statistics.median(result['seconds']):.2f}",
                      flush=True)
    return rows


SIDES = {
    "bouquet": "Bouquet `flwr run` (defaults)",
    "bouquet-threads": "Bouquet `flwr run`, client-threads={threads}",
    "flower": "minimal Flower app, `flwr run`",
    "in-process": "Bouquet in process (`simulate`)",
}


def median_of(rows: list[dict], side: str, key: str) -> float | None:
    values = [r[key] for r in rows if r["side"] == side]
    return statistics.median(values) if values else None


def pair_ratios(rows: list[dict], side: str, key: str = "wall") -> list[float]:
    """Per pair: `side`'s `key` over the minimal app's."""
    out = []
    for pair in sorted({r["pair"] for r in rows}):
        a = [r[key] for r in rows if r["pair"] == pair and r["side"] == side]
        b = [r[key] for r in rows if r["pair"] == pair and r["side"] == "flower"]
        if a and b:
            out.append(a[0] / b[0])
    return out


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    a = meta["args"]
    lines = provenance(meta, "# `flwr run` speed: Bouquet's fedavg against Flower's minimal app",
                       "; a shared, noisy machine: medians and ratios of pairs are what to read")
    lines += [
        f"- job: digits, CNN, IID {a['samples']} samples per client (80 % train), {a['clients']} "
        f"clients on {a['clients']} simulated SuperNodes, {a['rounds']} rounds of FedAvg over every "
        "client, 1 local epoch of SGD (batch 32, lr 0.05), Bouquet with finetune-epochs=0; "
        f"{a['pairs']} pairs, the order swapped every pair; load average before the runs "
        f"{min(r['load-before'] for r in rows):.1f}–{max(r['load-before'] for r in rows):.1f} "
        "on 2 cores",
        "",
    ]
    sides = [s for s in SIDES if any(r["side"] == s for r in rows)]
    table = []
    for side in sides:
        label = SIDES[side].format(threads=a.get("threads_variant"))
        per_round = [statistics.median(r["seconds"]) for r in rows if r["side"] == side]
        ratios = pair_ratios(rows, side)
        table.append([
            label, f"{median_of(rows, side, 'wall'):.1f}",
            f"{statistics.median(per_round):.2f}", f"{median_of(rows, side, 'outside-rounds'):.1f}",
            "1" if side == "flower" else f"{statistics.median(ratios):.2f}" if ratios else "",
            " / ".join(f"{r['accuracy']:.2f}" for r in rows if r["side"] == side),
        ])
    lines += markdown_table(["run", "wall s (median)", "s/round (median)", "outside the rounds s",
                             "wall / minimal app's (median of pairs)", "final accuracy % (each run)"],
                            "lrrrrl", table)
    ratio = statistics.median(pair_ratios(rows, "bouquet"))
    lines += [
        "",
        f"Target: Bouquet's `flwr run` within {TARGET}× the minimal app's wall time; median of the "
        f"pairs' ratios {ratio:.2f}: {'met' if ratio <= TARGET else '**not met**'}. Ratios per pair: "
        + ", ".join(f"{x:.2f}" for x in pair_ratios(rows, "bouquet")) + ".",
        "",
        "Every run (wall s; s/round of rounds 1..R):",
        "",
    ]
    lines += markdown_table(
        ["pair", "run", "load before", "wall s", "seconds per round"], "rllrl",
        [[r["pair"], SIDES[r["side"]].format(threads=a.get("threads_variant")),
          f"{r['load-before']:.1f}", f"{r['wall']:.1f}",
          ", ".join(f"{s:.2f}" for s in r["seconds"])] for r in rows])
    lines += ["", *meta.get("notes", [])]
    return "\n".join(lines).rstrip() + "\n"


NOTES = [
    "The minimal app's first round also starts its Ray actor and imports torch in it; Bouquet's "
    "actor starts during its identify exchange, before round 1, so that cost is in its "
    "\"outside the rounds\". Both apps' final accuracies differ: the minimal app draws its own IID "
    "split and batch order (its own seeds), so only the work per round is the same, not the numbers.",
]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.flwr_run_speed", __doc__)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=100, help="samples per client")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads-variant", type=int, default=0,
                        help="also run Bouquet with this client-threads in every pair (0: no)")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    parser.add_argument("--name", default="flwr-run-speed")
    args = parser.parse_args(argv)
    started = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="bouquet-flwr-run-speed-") as tmp:
        rows = measure(args, Path(tmp))
    meta = {
        "command": ("python -m benchmarks.studies.flwr_run_speed " + shlex.join(argv)).strip(),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_facts(),
        "code": code_version(),
        "args": vars(args) | {"results_dir": None},
        "notes": NOTES,
    }
    write_study(args.results_dir, args.name, {**meta, "rows": rows}, markdown(meta, rows), indent=2,
                final_newline=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
