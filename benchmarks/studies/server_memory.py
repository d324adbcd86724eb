"""How much server memory does SFL need as the clients grow, in memory and memory-mapped?

Server memory of SFL against the number of clients, with the `cnn` model, in memory and memory-mapped.

    python -m benchmarks.studies.server_memory --clients 100,1000,3000 --mapped 1000,10000

What is measured: SFL's server strategy in one fresh process per point, built as the ServerApp builds it
(`strategies.shared.registry.build_strategy`: the prior label-sharing graph over N clients of MNIST
label-clusters, every graph and propagation plan), bound to the `cnn` model (V [N, P] and U [N, P],
P = 215,370 float32 parameters), then `--rounds` server rounds in which `--trained` clients' models are
absorbed and SFL's server step runs (propagation, read-out, one personalised model read back). No
ClientApp runs: a federation of 10,000 ClientApps on this machine would take hours, and the clients'
memory is theirs, not the server's. Reported per point: the process's peak resident memory (VmHWM),
its anonymous resident memory at the end (what must fit in RAM; a memory-mapped matrix's pages are file
pages the kernel can write back and drop) and the bytes of the two matrices. In-memory points are run
only where they fit this shared machine; the larger ones are extrapolated from the fitted curve.
Writes `benchmarks/results/server-memory.{md,json}`.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

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

GIB = 1024**3


def status_bytes(field: str) -> int:
    """A `kB` field of /proc/self/status (VmHWM, VmRSS, RssAnon, RssFile) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def measure(clients: int, mmap_bytes: int, rounds: int, trained: int, directory: Path) -> dict[str, Any]:
    """One point, in this process: build, bind and run SFL's server side (see the module docstring)."""
    import torch
    from flwr.app import ArrayRecord, RecordDict

    from server_app.app import initial_arrays
    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig, default_run_config
    from strategies.shared.messages import MODEL
    from strategies.shared.registry import build_strategy

    torch.set_num_threads(1)
    baseline = status_bytes("VmRSS")
    started = time.perf_counter()
    cfg = RunConfig.from_flower({
        **default_run_config(), "method": "sfl", "dataset": "mnist", "model": "cnn",
        "partition": "label-clusters", "num-clients": clients, "max-samples-per-client": 5,
        "num-rounds": rounds, "fraction-train": min(1.0, trained / clients),
        "client-matrix-mmap-bytes": mmap_bytes, "output-dir": str(directory)})
    strategy = build_strategy(cfg, ClientMatrixStorage(cfg.client_matrix_mmap_bytes, directory))
    arrays = initial_arrays(cfg)
    strategy.bind(arrays)
    generator = torch.Generator().manual_seed(0)
    for server_round in range(1, rounds + 1):
        chosen = torch.randperm(clients, generator=generator)[:trained].tolist()
        for client in chosen:  # a trained model: the global one moved a little
            moved = {k: v + 0.01 * torch.randn(v.shape, generator=generator) if v.is_floating_point()
                     else v for k, v in arrays.to_torch_state_dict().items()}
            strategy.num_examples[client] = 5
            strategy.last_trained[client] = server_round
            strategy.absorb(client, RecordDict({MODEL: ArrayRecord(moved)}))
        strategy.after_train(server_round)
        strategy.personal_arrays(chosen[0])
    params = strategy.layout.size
    return {"clients": clients, "params": params, "mmap-bytes": mmap_bytes,
            "mapped": strategy.matrix_storage.mapped(clients, params),
            "matrix-gib": 2 * clients * params * 4 / GIB, "baseline-gib": baseline / GIB,
            "peak-gib": status_bytes("VmHWM") / GIB, "anon-gib": status_bytes("RssAnon") / GIB,
            "file-gib": status_bytes("RssFile") / GIB, "seconds": time.perf_counter() - started}


def point(clients: int, mapped: bool, rounds: int, trained: int) -> dict[str, Any]:
    """`measure` in a fresh process (its peak memory is this point's alone)."""
    with tempfile.TemporaryDirectory(prefix="bq-server-memory-", dir=REPO / "outputs"
                                     if (REPO / "outputs").exists() else None) as directory:
        args = [sys.executable, "-m", "benchmarks.studies.server_memory", "--one", str(clients),
                "--one-mmap-bytes", "0" if mapped else str(1 << 62), "--rounds", str(rounds),
                "--trained", str(trained), "--one-dir", directory]
        log.info("server memory: %d clients, %s", clients, "memory-mapped" if mapped else "in memory")
        out = subprocess.run(args, cwd=REPO, check=True, capture_output=True, text=True)
        left = list(Path(directory).iterdir())
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["files-left"] = len(left)  # the mapped file is unlinked: nothing remains
        return result


def limit(points: list[dict[str, Any]], budget_gib: float) -> tuple[np.ndarray, int]:
    """Fit peak GiB = a + b·N + c·N² to the in-memory points; the largest N within `budget_gib`."""
    n = np.array([p["clients"] for p in points], dtype=float)
    peak = np.array([p["peak-gib"] for p in points])
    degree = min(2, len(points) - 1)
    coeffs = np.polyfit(n, peak, degree)
    grid = np.arange(1, 200_001)
    fits = np.polyval(coeffs, grid) <= budget_gib
    return coeffs, int(grid[fits][-1]) if fits.any() else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.server_memory", __doc__)
    parser.add_argument("--clients", default="100,1000,3000", help="in-memory points")
    parser.add_argument("--mapped", default="1000,10000", help="memory-mapped points (threshold 0)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trained", type=int, default=10, help="clients trained per round")
    parser.add_argument("--budget-gib", type=float, default=24.0)
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    parser.add_argument("--one", type=int, default=None, help=argparse_hidden())
    parser.add_argument("--one-mmap-bytes", type=int, default=0, help=argparse_hidden())
    parser.add_argument("--one-dir", default="", help=argparse_hidden())
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one, args.one_mmap_bytes, args.rounds, args.trained,
                                 Path(args.one_dir))))
        return 0
    log_progress()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    memory = [point(int(n), False, args.rounds, args.trained) for n in args.clients.split(",") if n]
    mapped = [point(int(n), True, args.rounds, args.trained) for n in args.mapped.split(",") if n]
    coeffs, largest = limit(memory, args.budget_gib)
    machine, code = machine_facts(), code_version()
    command = "python -m benchmarks.studies.server_memory " + shlex.join(argv)
    lines = [
        "# Server memory of SFL against the number of clients (`cnn`)", "", "Produced by", "", "```",
        command, "```", "",
        f"- date: {started}; code: commit {code.get('commit', '?')}"
        + (" (with local changes)" if code.get("local-changes") else ""),
        f"- machine: {machine['cpu']}, {machine['cores']} cores, 24 GiB RAM (shared); torch "
        f"{machine['torch']}, Python {machine['python']}",
        f"- measured: SFL's server strategy alone, one fresh process per row, as the ServerApp "
        f"builds it (prior label-sharing graph of MNIST label-clusters, `cnn`, P = "
        f"{memory[0]['params'] if memory else mapped[0]['params']:,} parameters), {args.rounds} "
        f"server rounds of {args.trained} absorbed client models + SFL's server step; no "
        "ClientApps (see `benchmarks/studies/server_memory.py`)",
        "- **peak**: the process's peak resident memory (VmHWM, file pages of a mapped matrix "
        "included); **anon**: anonymous resident memory at the end (what has to fit in RAM); "
        "**V + U**: the two [N, P] float32 matrices", "",
        *memory_table(memory + mapped)]
    fit = " + ".join(f"{c:.3g}·N^{len(coeffs) - 1 - i}" for i, c in enumerate(coeffs))
    lines += ["", f"In memory the peak follows {fit} GiB (fitted to the in-memory rows): "
              f"{args.budget_gib:g} GiB is reached at about **{largest:,} clients**; with "
              "the matrices memory-mapped, what must stay resident is the anon column.", ""]
    write_study(args.results_dir, "server-memory",
                {"command": command, "date": started, "machine": machine, "code": code,
                 "memory": memory, "mapped": mapped, "fit": coeffs.tolist(), "largest": largest},
                "\n".join(lines))
    return 0


def memory_table(points: list[dict[str, Any]]) -> list[str]:
    """One row per measured point: clients, where the matrices live, their size, peak and anon memory."""
    return markdown_table(
        ["clients", "storage", "V + U GiB", "peak GiB", "anon GiB", "s"], "rlrrrr",
        [(f"{p['clients']:,}", "memory-mapped" if p["mapped"] else "memory", f"{p['matrix-gib']:.2f}",
          f"{p['peak-gib']:.2f}", f"{p['anon-gib']:.2f}", f"{p['seconds']:.0f}") for p in points])


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
