"""Deployment speed: wall time per round of fedavg with 3 real SuperNodes (TLS + node auth, on
loopback) against the same configuration in Flower's simulation runtime, and where the time goes.

    python -m benchmarks.deploy_speed --name deploy-speed [--rounds 5] [--set key=value ...]

Configurations (each one `flwr run` of the same job):
- `simulation`: a `flower-superlink --simulation` with 3 simulated SuperNodes (Ray), 1 CPU each;
- `deployed`: `server_app.loopback` (the README's deployment) with Flower's defaults;
- `deployed, poll 0.1 s`: the same with `FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1` for the executors.
Per round = the median of the `seconds` of rounds 1..R in rounds.jsonl (train + evaluate exchange).
Components measured on this machine: a fresh Python importing torch, importing the whole ClientApp
(`client_app.app`: torch, scikit-learn, ...), and the polling intervals of Flower 1.39 read from its
source. Writes benchmarks/results/<name>.md and .json.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.compare import code_version, machine_facts, parse_set
from server_app.loopback import BIN, LoopbackFederation, free_port
from server_app.outcome import check_run, run_config_arg

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
JOB = {"method": "fedavg", "dataset": "digits", "model": "cnn", "partition": "iid",
       "num-clients": 3, "num-rounds": 5, "max-samples-per-client": 300, "client-threads": 1,
       "finetune-epochs": 0, "checkpoint-every": 0}


def per_round(out: Path) -> tuple[float, list[float]]:
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    seconds = [r["seconds"] for r in rounds if r["round"] > 0]
    return statistics.median(seconds), seconds


def timed_import(module: str, repeats: int = 3) -> float:
    """Median seconds a fresh Python process takes to import `module` (process start included)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True, cwd=REPO)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def flower_poll_intervals() -> dict[str, str]:
    """The waits hard-coded in this Flower version, read from its source."""
    from flwr.superlink.grid import http_grid
    from flwr.supernode import start_client_internal

    def sleeps(module) -> list[str]:
        return sorted(set(re.findall(r"time\.sleep\(([0-9.]+)\)", inspect.getsource(module))))

    from flwr.supercore.superexec import run_superexec
    return {
        "ServerApp Grid.send_and_receive poll (s)": ", ".join(sleeps(http_grid)),
        "SuperNode idle pull / reply wait (s)": ", ".join(sleeps(start_client_internal)),
        "SuperExec task poll default (s)": str(run_superexec._DEFAULT_TASK_POLL_INTERVAL_SECONDS),
    }


def run_deployed(job: dict, root: Path, env_extra: dict[str, str]) -> float:
    started = time.perf_counter()
    with LoopbackFederation(root, 3, env_extra=env_extra) as fed:
        print(f"  federation up in {time.perf_counter() - started:.1f} s", flush=True)
        check_run(REPO, "bouquet", job, env=fed.env(), cwd=root, timeout=1800)
    return time.perf_counter() - started


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def run_simulation(job: dict, root: Path) -> None:
    """`flwr run` against a simulation SuperLink we start (own FLWR_HOME), stopped by its PID."""
    port = free_port()
    (root / "config.toml").write_text(
        f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\n'
        "insecure = true\n")
    env = {**os.environ, "FLWR_HOME": str(root), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1"}
    link = subprocess.Popen(
        [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--host", "127.0.0.1",
         "--port", str(port), "--database", str(root / "state.db")],
        env=env, cwd=root, stdout=(root / "superlink.log").open("w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not port_open(port):
            if time.monotonic() > deadline:
                raise RuntimeError("simulation SuperLink did not start")
            time.sleep(0.3)
        federation = "num-supernodes=3 client-resources-num-cpus=1"
        result = subprocess.run(
            [str(BIN / "flwr"), "run", str(REPO), "sim", "--stream", "--federation-config",
             federation, "--run-config", run_config_arg(job)],
            env=env, cwd=root, capture_output=True, text=True, timeout=1800)
        if "Bouquet run summary" not in result.stdout:
            raise RuntimeError("simulation run failed:\n" + (result.stdout + result.stderr)[-3000:])
    finally:
        os.killpg(link.pid, signal.SIGTERM)
        link.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", default="deploy-speed")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    job = {**JOB, **parse_set(args.set)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bouquet-deploy-speed-") as tmp:
        tmp = Path(tmp)
        configs = [
            ("simulation (Ray, 3 virtual SuperNodes)", lambda out: run_simulation(
                {**job, "output-dir": str(out), "run-name": "sim"}, tmp / "sim-home")),
            ("deployed: 3 SuperNodes, TLS + auth, Flower defaults", lambda out: run_deployed(
                {**job, "output-dir": str(out), "run-name": "dep"}, tmp / "dep", {})),
            ("deployed, FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1", lambda out: run_deployed(
                {**job, "output-dir": str(out), "run-name": "fast"}, tmp / "fast",
                {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"})),
        ]
        for label, go in configs:
            (tmp / "sim-home").mkdir(exist_ok=True)
            out = tmp / "out" / label.split(":")[0].split(" ")[0] / str(len(rows))
            print(f"{label} ...", flush=True)
            started = time.perf_counter()
            go(out)
            total = time.perf_counter() - started
            run_dir = next(p for p in out.iterdir() if p.is_dir())
            median, seconds = per_round(run_dir)
            rows.append({"configuration": label, "median-seconds-per-round": median,
                         "rounds": seconds, "total-seconds": total})
            print(f"  {median:.1f} s/round (rounds {[round(s, 1) for s in seconds]}), "
                  f"{total:.0f} s total", flush=True)
    components = {
        "python + import torch (s)": timed_import("torch"),
        "python + import client_app.app (s)": timed_import("client_app.app"),
        **flower_poll_intervals(),
    }
    machine = machine_facts()
    result = {"job": job, "rows": rows, "components": components, "machine": machine,
              "load-average-at-end": os.getloadavg()[0], "code": code_version(),
              "command": "python -m benchmarks.deploy_speed " + " ".join(sys.argv[1:])}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Deployment speed: fedavg, 3 SuperNodes, deployed vs simulation", "",
             f"Command: `{result['command']}`  ",
             f"flwr {machine['flwr']}, torch {machine['torch']}; {machine['cpu']}, "
             f"{machine['cores']} cores, load average {result['load-average-at-end']:.1f} at the end "
             "(other jobs were running)  ",
             "Job: " + ", ".join(f"{k}={v}" for k, v in job.items()), "",
             "| configuration | s/round (median) | rounds 1..R (s) | total wall (s) |",
             "|---|---:|---|---:|"]
    for row in rows:
        lines.append(f"| {row['configuration']} | {row['median-seconds-per-round']:.1f} | "
                     f"{', '.join(f'{s:.1f}' for s in row['rounds'])} | {row['total-seconds']:.0f} |")
    lines += ["", "| component | value |", "|---|---:|"]
    lines += [f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |"
              for k, v in components.items()]
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
