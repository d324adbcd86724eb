"""docs/scale-out.md and docs/benchmarks.md: the benchmarks on Ray workers and SFL's server memory
against the number of clients; docs/reproducibility.md: the committed table re-run."""

from __future__ import annotations

import numpy as np

from docs.blocks import block
from docs.blocks.data import compare, num, raw, table

GIB = 1024**3


def _link(name: str, prefix: str) -> str:
    return f"[`{name}`]({prefix}results/{name}.md)"


@block("ray-workers")
def ray_workers(prefix: str) -> str:
    data = raw("ray-workers")
    rows = {r["benchmark"]: r for r in data["rows"]}
    slower = all(r["workers-median"] > r["serial-median"] for r in rows.values())
    same = all(r["identical"] for r in rows.values())
    m = data["machine"]
    return (
        f"Wall time serial vs {data['workers']} local workers ({_link('ray-workers', prefix)}, "
        f"{data['date']}, {m['cpu']}, {m['cores']} cores shared with other work), small settings: "
        + ", ".join(f"{name} {num(r['serial-median'], 0)} s serial vs {num(r['workers-median'], 0)} s "
                    f"on {data['workers']} workers" for name, r in rows.items())
        + ". "
        + ("There the workers were slower: Ray's start-up and each worker's torch import are paid per "
           "command, and busy cores leave nothing to run in parallel on. " if slower else "")
        + ("The numbers were identical." if same else "The numbers differed.")
    )


@block("server-memory")
def server_memory(prefix: str) -> str:
    from strategies.shared.run_config import RunConfig

    data = raw("server-memory")
    points = data["memory"] + data["mapped"]
    params = points[0]["params"]
    rows = [(f"{p['clients']:,}", "memory-mapped" if p["mapped"] else "in memory",
             num(p["matrix-gib"]), num(p["peak-gib"]), num(p["anon-gib"])) for p in points]
    coeffs = data["fit"]  # highest power first
    budget = 24.0
    threshold = RunConfig.model_fields["client_matrix_mmap_bytes"].default
    per_client = params * 4  # one float32 row
    up_to = threshold // per_client
    peak_there = float(np.polyval(coeffs, up_to))
    biggest = max(data["mapped"], key=lambda p: p["clients"])
    in_memory = max(p["clients"] for p in data["memory"])
    powers = ("", "·N", "·N²")
    fit = " + ".join(f"{c:.3g}{powers[i]}" for i, c in enumerate(reversed(coeffs)))
    return (
        f"With the `cnn` model (P = {params:,}) one client costs {num(per_client / 1e6)} MB per "
        f"matrix. Measured in {_link('server-memory', prefix)} (SFL's server strategy as the "
        "ServerApp builds it, 2 server rounds, no ClientApps):\n\n"
        + table(("clients", "matrices", "V + U GiB", "peak resident GiB", "anonymous resident GiB"),
                rows, align="rlrrr")
        + f"\n\nIn memory the peak fits {fit} GiB: **{budget:g} GiB stops SFL with `cnn` at about "
        f"{data['largest']:,} clients** (larger sizes than {in_memory:,} were not run in memory on "
        f"the shared machine: the fit gives {num(float(np.polyval(coeffs, biggest['clients'])), 0)} GiB "
        f"at {biggest['clients']:,}). Memory-mapped, the matrices' pages are file pages the kernel "
        f"writes back and drops under pressure; what must stay resident "
        f"({num(biggest['anon-gib'], 1)} GiB at {biggest['clients']:,} clients) is the N × N graph "
        f"work. Paging costs time: the {biggest['clients']:,}-client point took "
        f"{num(biggest['seconds'] / 60, 0)} minutes on the shared machine.\n\n"
        f"The default threshold, {threshold / GIB:g} GiB per matrix, keeps the matrices in memory up "
        f"to {up_to:,} `cnn` clients, where the fitted in-memory peak is {num(peak_there, 1)} GiB, and "
        "maps them above."
    )


@block("repro-check")
def repro_check(prefix: str) -> str:
    c = compare("flt-label-clusters-m50-defaults")
    mean_std = lambda m: f"{num(c.pers(m))} / {num(c.pers(m, 'std'))}"  # noqa: E731
    return (
        table(("environment", "kernels", "FLT mean / std", "FedAvg mean / std"), [
            ("fresh clone, fresh venv, README install (`-c constraints.txt`): the committed table",
             "portable (AVX2)", mean_std("flt"), mean_std("fedavg")),
        ], align="llrr")
        + f"\n\n{_link('flt-label-clusters-m50-defaults', prefix)}, run {c.data['date']}. The other "
        "two runs of that day, the development venv with portable kernels (the same numbers in every "
        "recorded value: per-client accuracies, per-round curves, bytes) and the development venv "
        "before the pins with native AVX-512 kernels (FedAvg the same, FLT's autoencoder and its "
        "thresholded graph moved), are not recorded in a committed result."
    )

