"""Does FLT scale to 2,400 clients: FCR's server side within a minute, its aggregation within 2x FedAvg's mean?

FLT at scale: the server side of Form Client Relatedness for M = 2400 clients, and the per-round
graph aggregation against a plain FedAvg mean over the same parameter matrix.

    python -m benchmarks.studies.flt_scale                          # M=2400, 10 clusters, k=2, MNIST encoder
    python -m benchmarks.studies.flt_scale --source synthetic --clients 2400 --reps 5

Client side (simulated in this process, not part of the server timings): every client's k centroids
of e=128-dim codes. `--source mnist` (default): MNIST split by `label-clusters` into C clusters of
one label each (C=10: 240 clients per cluster, `--samples` images per client); the autoencoder is
pretrained on server-held MNIST images no client holds (as `flt.pretrain-samples` does), and each
client encodes its train split and runs the client's own k-means (`client_app.methods.flt.centroids_of`).
`--source synthetic`: per cluster k random centres in R^128, every client's centroids are its
cluster's centres plus noise.

Server side (timed, each step alone, with tracemalloc's peak of the step's Python/numpy allocations):
UMAP fit on all M·k centroids (after a warm-up call that loads numba's compiled code; its time is
reported separately), the matching distance between all client pairs, the threshold γ, Ward clusters
(C), and placing one late client (UMAP transform + its distance row). Graph quality against the true
clusters is reported as a check that FCR worked.

Aggregation: V [M, P] float32 with P = the MLP's 784·200+200+200·10+10 = 159,010 parameters. Medians
of `--reps` repetitions, in one process: FedAvg's n-weighted mean (one [1, M]·[M, P] product) against
FLT's step (`NeighbourhoodModels.aggregate`) with the discovered Ã — sums shared along the spanning tree
of its distinct rows (`strategies.methods.flt.neighbourhood_sums`, the default) and, for comparison, one product
per distinct row — and with its Ward clusters, at full participation (every row trained: the worst
case) and at ρ = 0.2; and once each, the plain formula D⁻¹(Ã diag(n))·V as one dense and one
torch.sparse product, against which the tree's models are checked (largest relative difference).
Writes `benchmarks/results/flt-scale.{md,json}`.
"""

from __future__ import annotations

import json
import resource
import shlex
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import (
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    machine_facts,
    markdown_table,
    set_threads,
    write_study,
)
from docs.results.studies import _pct, flt_scale as markdown
from strategies.shared.graph import share_inside_groups
from strategies.methods.flt.neighbourhood import NeighbourhoodModels, neighbourhood_average
from strategies.shared.personalized import weighted_mean
from strategies.methods.flt.relatedness import (
    adjusted_rand,
    cluster_adjacency,
    threshold_adjacency,
    umap_embed,
    umap_place,
    ward_clusters,
)
from strategies.methods.flt.set_distance import set_distances

MLP_PARAMS = 784 * 200 + 200 + 200 * 10 + 10


# --- client side (simulated) ----------------------------------------------------------------------
def mnist_centroids(clients: int, clusters: int, k: int, samples: int, latent: int, seed: int,
                    pretrain: int) -> tuple[dict[int, np.ndarray], np.ndarray, np.ndarray, dict]:
    """Real centroids: MNIST label-clusters (one label per cluster), pretrained encoder, k-means."""
    from client_app.methods.flt import centroids_of
    from datasets.federated import DataSpec, load_client_data, load_partition
    from datasets.partition import PartitionSpec
    from models.autoencoder import (
        build_autoencoder,
        encode_batched,
        reconstruction_epochs,
    )
    from strategies.methods.flt.server import server_held_images

    spec = DataSpec("mnist", None, PartitionSpec(
        scheme="label-clusters", num_clients=clients, seed=seed, num_clusters=clusters,
        labels_per_cluster=1, max_samples_per_client=samples))
    truth = load_partition(spec)[1].cluster_ids
    started = time.perf_counter()
    torch.manual_seed(seed)
    model = build_autoencoder((1, 28, 28), latent)
    images = server_held_images(spec, pretrain, seed)
    loss = reconstruction_epochs(model, images, epochs=3, batch_size=32, lr=1e-3,
                                 generator=torch.Generator().manual_seed(seed))
    pretrain_seconds = time.perf_counter() - started
    started = time.perf_counter()
    centroids, sizes = {}, np.zeros(clients)
    for client in range(clients):
        data = load_client_data(spec, client)
        codes = encode_batched(model.encoder, data.train_x).numpy()
        centroids[client] = centroids_of(codes, min(k, len(codes)), 43)
        sizes[client] = len(data.train_y)
    info = {"pretrain-images": len(images), "pretrain-loss": loss,
            "pretrain-seconds": pretrain_seconds,
            "client-side-seconds": time.perf_counter() - started,
            "train-samples-per-client": float(sizes.mean())}
    return centroids, truth, sizes, info


def synthetic_centroids(clients: int, clusters: int, k: int, latent: int, seed: int
                        ) -> tuple[dict[int, np.ndarray], np.ndarray, np.ndarray, dict]:
    """Synthetic centroids: k centres per cluster in R^e, each client's = its cluster's + noise."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(clusters), -(-clients // clusters))[:clients]
    centres = rng.normal(size=(clusters, k, latent)) * 4.0
    centroids = {c: (centres[truth[c]] + rng.normal(size=(k, latent))).astype(np.float32)
                 for c in range(clients)}
    sizes = rng.integers(10, 60, size=clients).astype(float)
    return centroids, truth, sizes, {}


# --- measuring ------------------------------------------------------------------------------------
def measured(step: Callable[[], Any], memory: bool = True) -> tuple[Any, float, float]:
    """(result, seconds, tracemalloc peak in MB) of a step: timed on a plain call, then (with
    `memory`) called again under tracemalloc, which slows allocation-heavy Python code down."""
    started = time.perf_counter()
    result = step()
    seconds = time.perf_counter() - started
    peak = float("nan")
    if memory:
        tracemalloc.start()
        step()
        peak = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
    return result, seconds, peak


def median_seconds(step: Callable[[], Any], reps: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# --- the benchmark --------------------------------------------------------------------------------
def fcr_server(centroids: dict[int, np.ndarray], truth: np.ndarray, gamma: float, clusters: int,
               late: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The server steps of FCR, each timed alone; returns (results, Ã, Ward labels)."""
    clients = sorted(centroids)
    held_out = clients[late] if late is not None else None
    fitted = [c for c in clients if c != held_out]
    sizes = np.array([len(centroids[c]) for c in fitted])
    stacked = np.concatenate([centroids[c] for c in fitted])
    steps: dict[str, dict[str, float]] = {}

    tiny = np.random.default_rng(0).normal(size=(40, stacked.shape[1])).astype(np.float32)
    _, seconds, _ = measured(lambda: umap_place(umap_embed(tiny)[1], tiny[:2]), memory=False)
    warm_up = {"seconds": seconds}
    (embedding, reducer), seconds, peak = measured(lambda: umap_embed(stacked))
    steps["umap"] = {"seconds": seconds, "peak-mb": peak}
    distance, seconds, peak = measured(
        lambda: set_distances(embedding, sizes, embedding, sizes, "matching"))
    steps["distance (matching)"] = {"seconds": seconds, "peak-mb": peak}
    _, seconds, peak = measured(lambda: set_distances(embedding, sizes, embedding, sizes, "min-pair"))
    min_pair = {"seconds": seconds, "peak-mb": peak}
    adjacency, seconds, peak = measured(lambda: threshold_adjacency(distance, gamma))
    steps["threshold"] = {"seconds": seconds, "peak-mb": peak}
    labels, seconds, peak = measured(lambda: ward_clusters(adjacency, clusters))
    steps["clustering (Ward)"] = {"seconds": seconds, "peak-mb": peak}
    server_total = sum(step["seconds"] for step in steps.values())

    placement = None
    if held_out is not None:
        def place() -> np.ndarray:
            own = umap_place(reducer, centroids[held_out])
            return set_distances(own, [len(own)], embedding, sizes, "matching")[0]

        row, seconds, peak = measured(place)
        neighbours = np.array(fitted)[row < gamma]
        placement = {"seconds": seconds, "peak-mb": peak, "neighbours": int(len(neighbours)),
                     "neighbours-in-true-cluster": float(np.mean(truth[neighbours] == truth[held_out]))
                     if len(neighbours) else None}
    truth_fitted = np.asarray(truth)[fitted]
    quality = {
        "ari (Ward, C)": adjusted_rand(labels, truth_fitted),
        "edges-inside-true-clusters": share_inside_groups(adjacency, truth_fitted),
        "edges": int((adjacency.sum() - len(adjacency)) // 2),
        "mean-degree": float(adjacency.sum(axis=1).mean() - 1),
    }
    results = {"clients-fitted": len(fitted), "points": int(len(stacked)), "warm-up": warm_up,
               "steps": steps, "server-total-seconds": server_total, "min-pair": min_pair,
               "late-client": placement, "quality": quality}
    full = np.eye(len(clients), dtype=np.float32)
    index = np.array(fitted)
    full[np.ix_(index, index)] = adjacency
    full_labels = np.full(len(clients), -1)
    full_labels[index] = labels
    return results, full, full_labels


def aggregation(adjacency: np.ndarray, labels: np.ndarray, num_examples: np.ndarray, params: int,
                reps: int, reference: bool, seed: int) -> dict[str, Any]:
    """Median seconds of FedAvg's mean vs FLT's step over the same V [M, P]; the ratio is the median
    of per-repetition ratios (FedAvg timed right before each FLT step)."""
    m = len(adjacency)
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(m, params, generator=generator)
    n = torch.as_tensor(num_examples, dtype=torch.float32)
    initial = rows[0].clone()
    sampled_all = list(range(m))
    sampled_some = sorted(np.random.default_rng(seed).choice(m, size=max(1, m // 5),
                                                            replace=False).tolist())
    labels = np.where(labels < 0, np.arange(m) + labels.max() + 1, labels)  # unplaced: alone
    out: dict[str, Any] = {"clients": m, "params": params,
                           "matrix-gb": m * params * 4 / 1e9, "reps": reps}

    def fedavg_step() -> None:
        weighted_mean(rows, n)

    fedavg_times: list[float] = []
    shared = None
    for name, graph, share in (("flt (Ward clusters)", cluster_adjacency(labels), True),
                               ("flt (threshold Ã)", adjacency, True),
                               ("flt (threshold Ã, one product per distinct row)", adjacency, False)):
        models = NeighbourhoodModels(initial, m, share_sums=share)
        started = time.perf_counter()
        models.set_graph(graph)
        planned = time.perf_counter() - started
        tree = models.tree
        entry: dict[str, Any] = {
            "distinct-rows": int(models.distinct.shape[0]), "nnz": int(np.count_nonzero(graph)),
            "set-graph-seconds": planned, "row-axpys": tree.terms,
            "row-axpys-one-product-per-row": tree.direct_terms, "levels": len(tree.levels),
            "directly-computed-rows": int((tree.parent < 0).sum())}
        for _ in range(2):  # first steps from the initial state, buffers allocated (not timed)
            models.aggregate(rows, sampled_all, n)
        for label, sampled in (("all clients trained", sampled_all), ("rho=0.2", sampled_some)):
            # interleaved with the FedAvg mean, so that load from other processes hits both alike
            paired = [(median_seconds(fedavg_step, 1)[0],
                       median_seconds(lambda: models.aggregate(rows, sampled, n), 1)[0])
                      for _ in range(reps)]
            fedavg_times += [f for f, _ in paired]
            times = [t for _, t in paired]
            entry[label] = {"median-seconds": statistics.median(times), "seconds": times,
                            "fedavg-seconds": [f for f, _ in paired],
                            "ratio-to-fedavg": statistics.median(t / f for f, t in paired)}
        out[name] = entry
        if name == "flt (threshold Ã)":
            models.aggregate(rows, sampled_all, n)  # every row trained: W = D⁻¹(Ã diag(n))·V
            shared = models
        else:
            del models
    fedavg = statistics.median(fedavg_times)
    out["fedavg-mean"] = {"median-seconds": fedavg, "seconds": fedavg_times}
    if reference:
        for label, sparse in (("formula, torch.sparse Ã", True), ("formula, dense Ã", False)):
            formula = None

            def step() -> None:
                nonlocal formula
                formula = neighbourhood_average(adjacency, n, rows, sparse=sparse)

            median, times = median_seconds(step, 1)
            out[label] = {"median-seconds": median, "seconds": times, "ratio-to-fedavg": median / fedavg,
                          "max-relative-difference-of-shared-sums": _largest_difference(shared, formula)}
            del formula
    out["max-rss-mb"] = max_rss_mb()
    return out


def _largest_difference(models: NeighbourhoodModels, formula: torch.Tensor) -> float:
    """max |w_m − formula_m| / max |formula_m| over the clients, row block by row block."""
    worst = 0.0
    for start in range(0, len(formula), 256):
        clients = torch.arange(start, min(start + 256, len(formula)))
        mine = models.models[models.model_of[clients]] * models.scale[models.model_of[clients], None]
        expected = formula[clients]
        worst = max(worst, float(((mine - expected).abs().amax(dim=1)
                                  / expected.abs().amax(dim=1)).max()))
    return worst


ANNOTATION = "## FLT: Form Client Relatedness in this comparison"


def annotate(results: Path, name: str) -> None:
    """Append FLT's FCR numbers (from the flt run's summary in `<name>.json`) to `<name>.md`, which
    `benchmarks.compare` wrote: graph quality against the true clusters, uplink and timings."""
    data = json.loads((results / f"{name}.json").read_text())
    flt = next(s for s in data["summaries"] if s["method"] == "flt")["flt"]
    text = (results / f"{name}.md").read_text()
    text = text.split(f"\n{ANNOTATION}\n")[0].rstrip("\n") + "\n"
    seconds = flt["fcr-seconds"]
    lines = ["", ANNOTATION, "",
             f"Added by `python -m benchmarks.studies.flt_scale --annotate {name}` from the flt run's "
             "`summary.json` (key `flt`).", ""]
    quantities = [("clients placed", flt["clients-placed"]),
                  ("edges of Ã (off-diagonal, undirected)", flt["edges"]),
                  ("mean degree", f"{flt['mean-degree']:.1f}"),
                  ("discovered clusters", flt["discovered-clusters"])]
    if "ari" in flt:
        quantities += [(f"ARI (Ward, C = {flt['true-clusters']} true clusters)", f"{flt['ari']:.3f}"),
                       ("share of Ã's edges inside true clusters", _pct(flt["edges-inside-true-clusters"]))]
    quantities += [("one-off uplink per client (floats: k·e)", f"{flt['uplink-floats-per-client']:.0f}"),
                   ("autoencoder reconstruction loss after the federated round(s)",
                    ", ".join(f"{x:.4f}" for x in flt["autoencoder-loss"]))]
    quantities += [(f"FCR seconds: {key}", f"{value:.2f}") for key, value in seconds.items()]
    lines += markdown_table(["quantity", "value"], "lr", quantities)
    lines += ["", "FCR runs inside round 1 (its seconds and bytes are in round 1 of the flt run); "
              "`umap` includes loading numba's compiled code, once per process.", ""]
    (results / f"{name}.md").write_text(text + "\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.flt_scale", __doc__)
    parser.add_argument("--clients", type=int, default=2400)
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--latent", type=int, default=128)
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--source", choices=("mnist", "synthetic"), default="mnist")
    parser.add_argument("--samples", type=int, default=25,
                        help="mnist: max samples per client (80%% train)")
    parser.add_argument("--pretrain", type=int, default=5000,
                        help="mnist: server-held images to pretrain the autoencoder on")
    parser.add_argument("--params", type=int, default=MLP_PARAMS)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the (slow) plain dense/sparse formula products")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="flt-scale")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    parser.add_argument("--annotate", nargs="+", metavar="NAME", default=None,
                        help="only append FLT's FCR numbers to benchmarks.compare results NAME.md "
                             "(from NAME.json) and exit")
    args = parser.parse_args(argv)
    if args.annotate:
        for name in args.annotate:
            annotate(Path(args.results_dir), name)
            print(f"annotated {Path(args.results_dir) / name}.md")
        return 0
    set_threads(args.threads)
    started = datetime.now(timezone.utc)

    if args.source == "mnist":
        centroids, truth, sizes, client_side = mnist_centroids(
            args.clients, args.clusters, args.k, args.samples, args.latent, args.seed, args.pretrain)
    else:
        centroids, truth, sizes, client_side = synthetic_centroids(
            args.clients, args.clusters, args.k, args.latent, args.seed)
    print(f"client side ready: {client_side}", flush=True)
    fcr, adjacency, labels = fcr_server(centroids, np.asarray(truth), args.gamma, args.clusters,
                                        late=args.clients // 2 + 1)
    print(json.dumps(fcr, indent=1), flush=True)
    agg = aggregation(adjacency, labels, sizes, args.params, args.reps, not args.no_reference,
                      args.seed)
    print(json.dumps(agg, indent=1), flush=True)

    meta = {"command": " ".join(["python -m benchmarks.studies.flt_scale", shlex.join(argv)]).strip(),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
            "code": code_version(), "args": vars(args), "client-side": client_side}
    write_study(args.results_dir, args.name, {**meta, "fcr": fcr, "aggregation": agg},
                markdown(meta, fcr, agg), indent=2, echo="paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
