"""Independent federations of a benchmark (compare's methods, the suite's cells) as Ray tasks.

Every federation is deterministic from its run config, so where it runs changes nothing but the wall
time: `--workers N` starts a private local Ray instance with N CPUs, `--ray ADDRESS` joins a running
cluster (`ray start --head ...`; `auto` = the cluster this machine belongs to). Each task takes one CPU
and pins torch to the benchmark's `--threads`, exactly as the serial run does, so every number is the
serial run's, bit for bit (tests/test_parallel_benchmarks.py).

Ray workers import the benchmark code from this checkout (its root is put on their `PYTHONPATH`): on a
cluster of several machines every node needs the same checkout at the same path (or a shared file
system) and the same environment, and the results and runs directories should be on a shared file
system, since a task writes its cell's files where it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from benchmarks.common import REPO

log = logging.getLogger("bouquet.benchmarks")

# the private instance's address: on loopback (Ray would replace 127.0.0.1 by a routable address)
LOCAL_NODE_IP = "127.0.0.2"
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Placement:
    """Where a benchmark's federations run: in this process one after another (`serial`), on a
    private local Ray instance with `workers` CPUs, or on the Ray cluster at `address`."""

    address: str | None = None
    workers: int = 0
    threads: int = 1  # torch intra-op threads in every task (the benchmark's --threads)

    @property
    def serial(self) -> bool:
        return self.address is None and self.workers <= 0

    def describe(self) -> str:
        if self.address:
            return f"Ray cluster at {self.address}"
        return f"{self.workers} local Ray workers" if self.workers > 0 else "serial (one process)"


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """`--ray ADDRESS` and `--workers N` (mutually exclusive; neither = serial)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--ray", default=None, metavar="ADDRESS",
                       help="run the independent federations as tasks on the Ray cluster at "
                            "ADDRESS (e.g. 10.0.0.5:6379, or 'auto'); default: one after another "
                            "in this process")
    group.add_argument("--workers", type=int, default=0, metavar="N",
                       help="run the independent federations as tasks on a private local Ray "
                            "instance with N CPUs (default 0: serial)")


def placement_from(args: argparse.Namespace) -> Placement:
    """The placement the parsed `--ray` / `--workers` / `--threads` ask for."""
    if args.workers < 0:
        raise ValueError(f"--workers must be >= 0, got {args.workers}")
    return Placement(args.ray, args.workers, args.threads)


def _task(fn: Callable[[T], R], item: T, threads: int) -> R:
    """One federation in a Ray worker, with the serial run's torch threads."""
    from benchmarks.common import log_progress, set_threads

    log_progress()
    set_threads(threads)
    return fn(item)


def run_all(fn: Callable[[T], R], items: Sequence[T], placement: Placement) -> Iterator[tuple[int, R]]:
    """`(index, fn(item))` for every item: in order when serial, as they finish on Ray. `fn` must be a
    module-level function (or a `functools.partial` of one) so Ray can ship it."""
    if placement.serial:
        for index, item in enumerate(items):
            yield index, fn(item)
        return
    import ray

    temp_dir = None
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}}
    if placement.address:
        ray.init(address=placement.address, runtime_env=runtime_env, include_dashboard=False,
                 logging_level=logging.WARNING)
    else:  # a private instance: its own temp dir, never another user's cluster
        temp_dir = tempfile.mkdtemp(prefix="bq-ray-", dir="/tmp")
        ray.init(address="local", num_cpus=placement.workers, num_gpus=0, runtime_env=runtime_env,
                 include_dashboard=False, logging_level=logging.WARNING, _temp_dir=temp_dir,
                 _node_ip_address=LOCAL_NODE_IP)
    log.info("running %d federations on %s", len(items), placement.describe())
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(_task)
        pending = {remote.remote(fn, item, placement.threads): index
                   for index, item in enumerate(items)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)
    finally:
        ray.shutdown()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def ordered(results: dict[int, Any]) -> list[Any]:
    """The results gathered so far, in the items' order (tables list them as a serial run does)."""
    return [results[index] for index in sorted(results)]


def without_timings(value: Any) -> Any:
    """`value` (a summary, a curve, a CellResult's fields) with every wall-time entry removed: what
    must be equal, bit for bit, between a serial and a parallel run."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if "seconds" not in str(k)}
    if isinstance(value, (list, tuple)):
        return [without_timings(v) for v in value]
    return value
