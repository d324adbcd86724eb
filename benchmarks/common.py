"""What the benchmark scripts share: the results folder, progress logging, the command-line parser,
`--set key=value` parsing, the provenance every results file starts with (the command, date, code
version and machine: `machine_facts`, `library_versions`, `code_version`, `provenance`,
`versions_line`), the Markdown tables of the results pages (`markdown_table`) and the writer of a
study's results files (`write_study`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from server_app.run_values import parse_value

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"

log = logging.getLogger("bouquet.benchmarks")


def log_progress() -> None:
    """Print the benchmarks' progress lines (logger `bouquet.benchmarks`) to stderr, timestamped;
    idempotent, so a script may call it whatever else it runs."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


T = TypeVar("T")


def progress(items: Sequence[T], description: str) -> Iterator[T]:
    """Iterate `items` with a progress bar and time-remaining estimate on a terminal (rich, installed
    with Flower) and, after each item, a progress line with the estimate (also in log files)."""
    from rich.console import Console
    from rich.progress import track

    started, total = time.perf_counter(), len(items)
    bar = track(items, description=description, total=total, console=Console(stderr=True),
                disable=not sys.stderr.isatty())
    for done, item in enumerate(bar, start=1):
        yield item
        elapsed = time.perf_counter() - started
        log.info("%s: %d/%d done, %.0f s so far, about %.0f s left", description, done, total,
                 elapsed, elapsed / done * (total - done))


# --- the command line ----------------------------------------------------------------------------
def benchmark_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The command-line parser of `python -m benchmarks.<module>`: its docstring is the help text."""
    return argparse.ArgumentParser(prog=f"python -m benchmarks.{module}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def parse_set(items: Iterable[str]) -> dict[str, Any]:
    """`["num-rounds=20", "partition=shards"]` -> `{"num-rounds": 20, "partition": "shards"}`."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {item!r}")
        overrides[key] = parse_value(raw)
    return overrides


# --- provenance -----------------------------------------------------------------------------------
def machine_facts() -> dict[str, Any]:
    import flwr
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from models.kernels import kernel_facts

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch-threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "flwr": flwr.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu-kernels": kernel_facts(),
        "libraries": library_versions(),
    }


# The packages a run's numbers depend on besides torch and flwr (recorded with every results file).
NUMERIC_LIBRARIES = ("numpy", "scipy", "scikit-learn", "umap-learn", "pynndescent", "numba", "pydantic",
                     "torchvision")


def library_versions() -> dict[str, str]:
    """The installed version of each of `NUMERIC_LIBRARIES` ('missing' where not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in NUMERIC_LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    return found


def code_version() -> dict[str, Any]:
    """The commit (plus whether the tree had local changes) and Bouquet's code fingerprint."""
    from strategies.shared.provenance import code_fingerprint

    out: dict[str, Any] = {"code-fingerprint": code_fingerprint()}
    try:
        out["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                       capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
        out["local-changes"] = bool(dirty)
    except (OSError, subprocess.CalledProcessError):
        pass
    return out


def set_threads(threads: int) -> None:
    """Pin torch's intra-op threads (0 leaves torch's default)."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


# --- writing a study's results -------------------------------------------------------------------
def write_study(results_dir: str | Path, name: str, payload: Any, markdown: str, *, indent: int = 1,
                final_newline: bool = False, echo: str | None = "page") -> Path:
    """Write a benchmark's results into `results_dir` (created if missing): `<name>.json`, `payload`
    as JSON with `indent` (a value JSON cannot hold written as its `str()`; a final newline with
    `final_newline`), and `<name>.md`, `markdown` as it is. Then print, by `echo`: "page" the
    Markdown, "paths" the line `written: <results_dir>/<name>.md/.json`, None nothing. Returns the
    JSON file's path."""
    if echo not in ("page", "paths", None):
        raise ValueError(f"write_study: echo must be 'page', 'paths' or None, got {echo!r}")
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{name}.json"
    target.write_text(json.dumps(payload, indent=indent, default=str) + ("\n" if final_newline else ""))
    (out / f"{name}.md").write_text(markdown)
    if echo == "page":
        print(markdown)
    elif echo == "paths":
        print(f"written: {out / name}.md/.json")
    return target


# --- the results pages: the docs' renderer (docs/render.py), which the benchmarks' pages share ------
from docs.render import ALIGNMENTS, markdown_table, provenance, versions_line  # noqa: E402,F401
