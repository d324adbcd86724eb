"""How long are a new user's first minutes: the README quick start's install and its first runs?

A new user's first minutes, timed: the README quick start's install in a fresh virtual environment,
then its main command twice, in a copy of the committed tree with a private FLWR_HOME.

    python -m benchmarks.studies.first_run

Copies `git archive HEAD` to a temporary folder, creates `python -m venv`, runs the quick start's
install command there, then its main command (`flwr run . --stream`) twice from the copy with that
environment first on PATH and a private FLWR_HOME and local-SuperLink ports (so no SuperLink of
another user is reused), and stops that SuperLink by its PID. Records wall times, the 1-minute load
average before and after each step (the machine may be shared) and the run's final accuracy, in
`benchmarks/results/<name>.md/.json`. `--reuse-venv DIR` skips the install (times the runs only);
`--workdir DIR` keeps the copy, the environment and the logs.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    machine_facts,
    progress,
    write_study,
)
from docs.results.studies import first_run as markdown


def quick_start() -> dict[str, str]:
    """The venv, install, main and test commands of the README's quick start (its first bash block),
    each without its trailing comment."""
    block = re.search(r"^## Quick start\n.*?```bash\n(.*?)```", (REPO / "README.md").read_text(),
                      re.S | re.M)
    if block is None:
        raise SystemExit("README.md has no '## Quick start' bash block")
    commands: dict[str, str] = {}
    for line in block.group(1).splitlines():
        command = line.split("  #")[0].strip()
        for name, prefix in (("venv", "python -m venv"), ("install", "pip install"), ("main", "flwr run"),
                             ("test", "pytest")):
            if command.startswith(prefix):
                commands.setdefault(name, command)
    return commands


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def timed(command: str, cwd: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run `command` in bash; wall seconds, exit status and load averages around it."""
    before = _load()
    started = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    return {"command": command, "seconds": time.perf_counter() - started, "rc": rc,
            "load-before": before, "load-after": _load(),
            "output-tail": log.read_text(errors="replace").splitlines()[-16:]}


def stop_local_superlink(flwr_home: Path) -> None:
    """Stop the SuperLink `flwr run` started for this FLWR_HOME, by its PID (it leads its session)."""
    marker = str(flwr_home / "local-superlink" / "state.db")
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_text().replace("\0", " "):
                os.killpg(int(proc.name), signal.SIGTERM)
        except (OSError, ProcessLookupError):
            continue


def measure(workdir: Path, reuse_venv: Path | None) -> dict[str, Any]:
    commands = quick_start()
    checkout = workdir / "bouquet"
    checkout.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(checkout)], input=archive.stdout, check=True)
    venv = reuse_venv or workdir / "venv"
    flwr_home = workdir / "flwr-home"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv),
                "FLWR_HOME": str(flwr_home), "FLWR_TELEMETRY_ENABLED": "0",
                "FLWR_DISABLE_UPDATE_CHECK": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),
                "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port())})
    steps: dict[str, Any] = {}
    try:
        for step in progress(["install", "first run", "second run"], "first_run"):
            if step == "install":
                if reuse_venv is None:
                    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
                    steps[step] = timed(commands["install"], checkout, env, workdir / "install.log")
                continue
            log = workdir / f"{step.replace(' ', '-')}.log"
            steps[step] = timed(commands["main"], checkout, env, log)
            text = log.read_text(errors="replace")
            found = re.search(r"personalized mean \(%\)\s+([\d.]+)", text)
            steps[step]["personalized-mean"] = float(found.group(1)) if found else None
            steps[step]["summary-printed"] = "Bouquet run summary" in text
    finally:
        stop_local_superlink(flwr_home)
    return {"commands": commands, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.first_run", __doc__)
    parser.add_argument("--name", default="first-run")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    parser.add_argument("--reuse-venv", type=Path, default=None,
                        help="an environment where the quick start's install already ran")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="an empty folder to work in, kept afterwards (default: a temporary one)")
    args = parser.parse_args(argv)
    from benchmarks.common import log_progress

    log_progress()
    started = datetime.now(timezone.utc)
    if args.workdir is not None:
        result = measure(args.workdir, args.reuse_venv)
    else:
        with tempfile.TemporaryDirectory(prefix="bouquet-first-run-") as tmp:
            result = measure(Path(tmp), args.reuse_venv)
    meta = {"name": args.name, "command": "python -m benchmarks.studies.first_run " + shlex.join(argv),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
            "code": code_version()}
    write_study(args.results_dir, args.name, {**meta, **result}, markdown(meta, result), indent=2)
    return 0 if all(row["rc"] == 0 for row in result["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
