"""Do Ray workers shorten the suite's and compare's wall time while giving the same numbers, bit for bit?

Wall time of `benchmarks.suite` and `benchmarks.compare` serial vs on Ray workers, same numbers.

    python -m benchmarks.studies.ray_workers --workers 2 --repeats 1

Runs each command as a subprocess (Ray's start-up included in the time) serially and with
`--workers N`, checks that every result is the same, bit for bit, once wall times are removed
(`benchmarks.parallel.without_timings`), and writes `benchmarks/results/ray-workers.{md,json}`: the
median wall time of each placement and the ratio serial / workers.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    log,
    log_progress,
    machine_facts,
    markdown_table,
    write_study,
)
from benchmarks.parallel import without_timings

SMALL = ["--set", "num-rounds=5", "--set", "num-clients=10", "--set", "max-samples-per-client=200"]
SUITE = ["benchmarks.suite", "--settings", "shards,dirichlet", "--rhos", "1,0.2",
         "--methods", "fedavg,local,ditto,sfl", "--no-fedcg", *SMALL]
COMPARE = ["benchmarks.compare", "--methods", "fedavg,local,ditto,sfl", "--set", "partition=shards",
           *SMALL, "--name", "ray-workers-compare"]


def _results(kind: str, out: Path) -> Any:
    """The numbers a run wrote, wall times removed."""
    if kind == "suite":
        return without_timings(json.loads((out / "suite.json").read_text())["results"])
    return without_timings(json.loads((out / "ray-workers-compare.json").read_text())["summaries"])


def timed(command: list[str], kind: str, out: Path) -> tuple[float, Any]:
    """Run `python -m <command>` writing into `out`; (wall seconds, its numbers)."""
    args = [sys.executable, "-m", *command, "--results-dir", str(out), "--runs-dir", str(out / "runs")]
    log.info("running %s", shlex.join(args[2:]))
    started = time.perf_counter()
    subprocess.run(args, cwd=REPO, check=True, stdout=subprocess.DEVNULL)  # progress on stderr
    return time.perf_counter() - started, _results(kind, out)


def workers_table(rows: list[dict[str, Any]]) -> list[str]:
    """One row per benchmark: its command, the serial and the workers' median seconds and their ratio."""
    return markdown_table(
        ["benchmark", "command (serial; parallel adds `--workers`)", "serial s", "workers s",
         "serial / workers", "identical"], "llrrrl",
        [(row["benchmark"], f"`{row['command']}`", f"{row['serial-median']:.1f}",
          f"{row['workers-median']:.1f}", f"{row['ratio']:.2f}", "yes") for row in rows])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.ray_workers", __doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    log_progress()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for kind, command in (("suite", SUITE), ("compare", COMPARE)):
        seconds: dict[str, list[float]] = {"serial": [], "workers": []}
        reference = None
        for repeat in range(args.repeats):
            for placement, extra in (("serial", []), ("workers", ["--workers", str(args.workers)])):
                with tempfile.TemporaryDirectory(prefix="bq-ray-workers-") as out:
                    wall, numbers = timed([*command, *extra], kind, Path(out))
                seconds[placement].append(wall)
                if reference is None:
                    reference = numbers
                elif numbers != reference:
                    raise SystemExit(f"{kind} {placement} (repeat {repeat}) differs from the serial run")
        serial, workers = statistics.median(seconds["serial"]), statistics.median(seconds["workers"])
        rows.append({"benchmark": kind, "command": "python -m " + shlex.join(command),
                     "serial-seconds": seconds["serial"], "workers-seconds": seconds["workers"],
                     "serial-median": serial, "workers-median": workers, "ratio": serial / workers,
                     "identical": True})
    machine, code = machine_facts(), code_version()
    command = "python -m benchmarks.studies.ray_workers " + shlex.join(argv)
    lines = ["# Benchmarks serial vs on Ray workers", "", "Produced by", "", "```", command, "```", "",
             f"- date: {started}; code: commit {code.get('commit', '?')}"
             + (" (with local changes)" if code.get("local-changes") else ""),
             f"- machine: {machine['cpu']}, {machine['cores']} cores, shared with other work while "
             f"it ran; torch {machine['torch']}, Python {machine['python']}",
             f"- workers: `--workers {args.workers}` (a private local Ray instance, one CPU per task); "
             f"serial: one process; {args.repeats} run(s) each, wall time of the whole command "
             "(Ray's start-up included)",
             "- identical: every number of every run equals the serial run's once wall times are "
             "removed (`benchmarks.parallel.without_timings`)", "",
             *workers_table(rows)]
    write_study(args.results_dir, "ray-workers",
                {"command": command, "date": started, "machine": machine, "code": code,
                 "workers": args.workers, "rows": rows}, "\n".join(lines) + "\n", echo=None)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
