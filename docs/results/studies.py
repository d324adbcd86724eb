"""The pages of the one-off studies' results (`benchmarks/studies/`), from the result files alone:
one function per study, named after it, each `(result) -> Markdown` as `docs.results.RENDERERS`
calls it. Each study's script writes its Markdown with its function here; the docs render the
committed JSON with the same function.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from docs.render import markdown_table, provenance, versions_line
from docs.results.compare import plot_curves
from strategies.methods.sfl import spmm
from strategies.methods.sfl.gcn import DENSE_COLUMN_BLOCK, SPARSE_COST_PER_NONZERO

# flt_scale's targets: FCR's server side within a minute, the aggregation step within 2× FedAvg's mean
TARGET_FCR_SECONDS = 60.0
TARGET_RATIO = 2.0


# --- benchmarks.studies.first_run ----------------------------------------------------------------
def first_run(meta: dict[str, Any], result: dict[str, Any]) -> str:
    lines = [*provenance(meta, f"# {meta['name']}"), "",
             "The README quick start's commands, timed on this machine (no GPU used). Load = the "
             "1-minute load average before → after the step: other jobs shared the 2 cores, so an idle "
             "machine is faster.", "",
             *markdown_table(
                 ["step", "command", "wall time (s)", "load", "exit", "personalized mean (%)"], "llrlrr",
                 [(step, f"`{row['command']}`", f"{row['seconds']:.1f}",
                   f"{row['load-before']:.1f} → {row['load-after']:.1f}", f"{row['rc']}",
                   "" if row.get("personalized-mean") is None else f"{row['personalized-mean']:.2f}")
                  for step, row in result["steps"].items()])]
    return "\n".join(lines) + "\n"


# --- benchmarks.studies.fedcg_domains ------------------------------------------------------------
def _num(value: Any, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def last_rounds_mean(row: dict[str, Any], rounds: int = 5) -> float | None:
    """Mean global accuracy over the last `rounds` evaluated rounds (the final round alone is noisy)."""
    values = [p["global-accuracy"] for p in row["curve"] if p.get("global-accuracy") is not None]
    return sum(values[-rounds:]) / len(values[-rounds:]) if values else None


def measures(row: dict[str, Any]) -> dict[str, float | None]:
    """The numbers of one run that the tables show (FedAvg: soft = hard = its accuracy)."""
    fedcg = row.get("fedcg") or {}
    nmi = fedcg.get("nmi") or {}
    soft_by = fedcg.get("accuracy-soft") or row["by-domain"]
    hard_by = fedcg.get("accuracy-hard") or row["by-domain"]
    return {
        "global-soft": fedcg.get("global-accuracy-soft", row["global-accuracy"]),
        "global-hard": fedcg.get("global-accuracy-hard", row["global-accuracy"]),
        "last-5": last_rounds_mean(row),
        "seen-soft": soft_by.get("seen"), "unseen-soft": soft_by.get("unseen"),
        "unseen-hard": hard_by.get("unseen"),
        "nmi-test": nmi.get("student-final"), "nmi-train": nmi.get("student-train-final"),
        "nmi-labels": nmi.get("pseudo-domain-final"),
        "largest-train": fedcg.get("largest-domain-share"),
        "largest-test": fedcg.get("test-largest-domain-share"),
        "s-per-round": row["seconds-per-round"],
    }


DOMAINS_COLUMNS = [("global-soft", "global (soft)", 2), ("global-hard", "global (hard)", 2),
           ("last-5", "last 5 rounds (soft)", 2), ("seen-soft", "seen (soft)", 2),
           ("unseen-soft", "unseen (soft)", 2), ("unseen-hard", "unseen (hard)", 2),
           ("nmi-test", "NMI student, test images", 3), ("nmi-train", "NMI student, train images", 3),
           ("nmi-labels", "NMI pseudo-labels", 3), ("largest-train", "largest domain (train labels)", 2),
           ("largest-test", "largest domain (test student)", 2), ("s-per-round", "s/round", 1)]


def _mean_sd(values: list[float | None], digits: int) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def variant_table(variants: list[str], rows: list[dict[str, float | None]],
                  columns: list[tuple[str, str, int]]) -> list[str]:
    """Markdown lines: one row per variant, each column (key, title, digits) as mean ± sd over that
    variant's `rows` (dicts with a `variant` key)."""
    table = []
    for variant in variants:
        values = [r for r in rows if r["variant"] == variant]
        table.append([variant, *(_mean_sd([v[key] for v in values], digits) for key, _, digits in columns)])
    return markdown_table(["variant", *(title for _, title, _ in columns)], "l" + "r" * len(columns), table)


def fedcg_domains(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    s = meta["settings"]
    lines = [*provenance(meta, f"# {meta['name']}"), ""]
    family = s.get("domain-family", "rotations")
    seen = s["domain-styles"] if family == "styles" else s["domain-rotations"]
    unseen = (s.get("domain-unseen-styles") if family == "styles" else s["domain-unseen-rotations"]) or "none"
    lines.append(
        f"- setting: {s['dataset']} `domains`, family {family}: {seen} for the train clients "
        f"({s.get('domains-per-client', 1)} per train client, images split between them), "
        f"{s['num-clients']} clients of which {meta['test-clients']} held out whole as test clients "
        f"(one domain each; unseen: {unseen}), model `{s['model']}`, {s['num-rounds']} rounds, "
        f"fraction-train {s['fraction-train']}, {s['local-epochs']} local epoch(s), batch "
        f"{s['batch-size']}, lr {s['lr']}, {s['max-samples-per-client']} images per client, seeds "
        f"{', '.join(str(x) for x in meta['seeds'])}")
    fedcg_keys = sorted(k for k in s if k.startswith("fedcg."))
    if fedcg_keys:
        lines.append("- FedCG settings (before each variant's overrides): "
                     + ", ".join(f"{k}={s[k]}" for k in fedcg_keys))
    ran = {row["variant"]: (row["method"], row["overrides"]) for row in reversed(rows)}
    lines.append("- variants: " + "; ".join(
        f"`{v}` = {ran[v][0]} {ran[v][1] or ''}".rstrip() for v in meta["variants"]))
    lines += [
        "",
        "Accuracy (%) over the union of the held-out test clients' images after the last round (and "
        "its mean over the last 5 rounds); *seen* = test clients whose domain the training images "
        "have, *unseen* = the held-out domain(s); soft = the student's probabilities as domain weights "
        "(default), hard = its argmax (FedAvg: the same number). NMI per image against the true "
        "domain: the final student on the seen test clients' images and on the last round's training "
        "images, and the pseudo-labels the last round trained with. Largest domain: its share of the "
        "last round's training pseudo-labels / of the test images under the student's argmax.",
        "",
        f"Mean ± sd over {len(meta['seeds'])} seed(s):",
        "",
    ]
    lines += variant_table(list(meta["variants"]),
                           [{"variant": r["variant"], **measures(r)} for r in rows], DOMAINS_COLUMNS)
    names = meta["domains"]
    table = []
    for row in rows:
        fedcg = row.get("fedcg") or {}
        nmi = fedcg.get("nmi") or {}
        m = measures(row)
        by = (fedcg.get("accuracy-soft") or row["by-domain"]).get("by-domain", {})
        lam = fedcg.get("lambda") or {}
        cells = [row["variant"], str(row["seed"]), _num(m["global-soft"]), _num(m["seen-soft"]),
                 _num(m["unseen-soft"])] + [_num(by.get(n)) for n in names]
        cells += [_num(nmi.get("student-final"), 3), _num(nmi.get("teacher-round-0"), 3),
                  ", ".join(f"{v:.3f}" for v in lam.values()) or "—"]
        table.append(cells)
    lines += ["", "Every run (accuracy per test domain uses soft weights):", "",
              *markdown_table(["variant", "seed", "global (soft)", "seen", "unseen", *names,
                               "NMI student (test)", "NMI teacher (round 0)", "λ (final)"],
                              "lr" + "r" * (6 + len(names)), table)]
    lines += ["", "Domain histograms (pseudo-domains of the last round's training images; student argmax "
              "of the test images) and the final adjacency:", ""]
    for row in rows:
        fedcg = row.get("fedcg")
        if fedcg:
            adjacency = [[round(v, 3) for v in line] for line in fedcg.get("adjacency") or []]
            lines.append(f"- `{row['variant']}` seed {row['seed']}: train {fedcg.get('domain-histogram')}, "
                         f"test {fedcg.get('test-student-histogram')}, A = {adjacency}")
    lines += ["", f"![global accuracy per round]({meta['name']}.png)", ""]
    return "\n".join(lines)


def fedcg_domains_plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    series = [(f"{row['variant']} (seed {row['seed']})", [(p["round"], p["global-accuracy"])
                                                          for p in row["curve"]
                                                          if p.get("global-accuracy") is not None])
              for row in rows]
    plot_curves(series, path, "global accuracy on held-out test clients (%)", title)


# --- benchmarks.studies.fedcg_ceiling ------------------------------------------------------------
def fedcg_ceiling(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [*provenance(meta, f"# {meta['name']}"), ""]
    s = meta["settings"]
    lines += [
        f"- data: {s['dataset']} `domains` partition, {s['num-clients']} clients ({s['max-samples-per-client']} "
        f"images each), {s['domain-test-clients']} of them held out as test clients; the classifier "
        f"trains on every train client's images with their true domains ({meta['epochs']} epochs of Adam, "
        f"lr {meta['lr']}, batch 32, domain-classifier stride {s['fedcg.domain-stride']}), and is "
        "tested on the test clients' images of the seen domains.",
        "",
        *markdown_table(["family", "domains", "pooling", "accuracy (%)", "NMI", "train / test images"],
                        "lllrrr",
                        [(row["family"], row["domains"], row["pool"], f"{row['accuracy']:.1f}",
                          f"{row['nmi']:.3f}", f"{row['train-images']} / {row['test-images']}")
                         for row in rows]),
    ]
    return "\n".join(lines) + "\n"


# --- benchmarks.studies.fedcg_discovery ----------------------------------------------------------
DISCOVERY_COLUMNS = [("nmi-test", "NMI student, test images (final)", 3),
           ("nmi-test-last-5", "NMI student, test (mean of last 5 rounds)", 3),
           ("nmi-labels", "NMI last pseudo-labels (train)", 3), ("largest-labels", "largest domain (labels)", 2),
           ("largest-test", "largest domain (test student)", 2), ("seconds", "seconds", 0)]


def fedcg_discovery(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    s = meta["settings"]
    lines = [*provenance(meta, f"# {meta['name']}"), ""]
    lines += [
        f"- data: {s['dataset']} `domains`, family {s['domain-family']}, {s['domains-per-client']} domain(s) "
        f"per train client, {s['num-clients']} clients ({s['max-samples-per-client']} images each, "
        f"{s['domain-test-clients']} held out as test clients); {s['num-rounds']} rounds, fraction-train "
        f"{s['fraction-train']}, {s['local-epochs']} local epoch(s), batch {s['batch-size']}; seeds "
        f"{', '.join(str(x) for x in meta['seeds'])}",
        "- FedCG settings before each variant's overrides: "
        + ", ".join(f"{k}={v}" for k, v in sorted(s.items()) if k.startswith("fedcg.")),
        "- variants: " + "; ".join(f"`{name}` = {overrides or 'the settings above'}"
                                   for name, overrides in meta["variants"].items()),
        "",
        f"Mean ± sd over {len(meta['seeds'])} seed(s):",
        "",
    ]
    lines += variant_table(list(meta["variants"]), rows, DISCOVERY_COLUMNS)
    lines += ["", "Every run:", "",
              *markdown_table(["variant", "seed", "NMI test (final)", "NMI labels", "test histogram"],
                              "lrrrl", [(r["variant"], r["seed"], f"{r['nmi-test']:.3f}",
                                         f"{r['nmi-labels']:.3f}", r["test-histogram"]) for r in rows])]
    return "\n".join(lines) + "\n"


# --- benchmarks.studies.aggregation_floor --------------------------------------------------------
def aggregation_floor(meta: dict, rows: list[dict]) -> str:
    lines = [
        f"# {meta['name']}: the memory-traffic floor of per-client aggregation", "",
        "Produced by", "", "```", meta["command"], "```", "",
        f"- date: {meta['date']}; code: commit {meta['code'].get('commit', '?')}"
        f"{' (with local changes)' if meta['code'].get('local-changes') else ''}",
        f"- machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores (torch threads "
        f"{meta['machine']['torch-threads']}), torch {meta['machine']['torch']}",
        *versions_line(meta["machine"]),
        f"- float32 V [N, P], medians of {meta['reps']} repetitions after a warm-up, one process.", "",
        *markdown_table(
            ["N", "P", "`V.mean(0)` s", "`U.copy_(V)` ×mean", "`V.clone()` ×mean", "`V + V` ×mean",
             "one kNN-10 hop into U ×mean"], "rrrrrrr",
            [(r["n"], r["p"], f"{r['mean']:.3f}", *(f"{r[key] / r['mean']:.2f}"
                                                    for key in ("copy", "clone", "add", "knn-hop")))
             for r in rows]),
    ]
    lines += ["", "`U.copy_(V)` reads V and writes a matrix of the same size into memory that is "
              "already mapped: the least work of any aggregation that produces one model per client "
              "each round. `V.clone()` and `V + V` also allocate their output (first-touch page "
              "faults), as an operation that returns a new matrix does. A kNN hop writes into the "
              "mapped U like the copy and additionally combines 11 rows (10 neighbours + self) per "
              "output row (11 multiply-adds per element).", ""]
    return "\n".join(lines)


# --- benchmarks.studies.flt_thresholds -----------------------------------------------------------
def flt_thresholds(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    rules = list(rows[0]["rules"])
    lines = [*provenance(meta, f"# {meta['name']}: FLT's client graph under each threshold rule"), "",
             "One FLT round per setting (defaults otherwise); the same distance matrix A cut by each "
             "rule. Median A: the median client-pair distance (UMAP units). Cells: edges per client / share of them inside the true structure (— = no edge). "
             "Truth: same true cluster, or the label-histogram cosine where the partition has no "
             "clusters. Last column: the largest distance inside a true cluster and the smallest "
             "across, as fractions of the median pair distance.", ""]
    table = []
    for row in rows:
        cells = []
        for rule in rules:
            r = row["rules"][rule]
            share = "—" if r["share-inside"] is None else f"{r['share-inside']:.2f}"
            cells.append(f"{r['edges-per-client']:.1f} / {share}")
        spread = (f"{row['inside-max']:.2f} / {row['across-min']:.2f}" if "inside-max" in row
                  else "")
        table.append([row["setting"], row["truth"], f"{row['median']:.2f}", *cells, spread])
    lines += markdown_table(["setting", "truth", "median A", *rules, "inside max / across min"],
                            "llr" + "r" * len(rules) + "r", table)
    return "\n".join(lines) + "\n"


# --- benchmarks.studies.flt_structure ------------------------------------------------------------
def flt_structure(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    threshold = meta["min-contrast"]
    lines = [*provenance(meta, f"# {meta['name']}: FLT's structure check"), "",
             "One FLT round per setting and seed, `flt.no-structure=keep` (the thresholded graph, "
             "relative γ = 0.05 × median). Contrast: the median latent set distance of the graph's "
             "edges over that of its non-edges (— = no edge). Share inside: the edges' share inside "
             "the true structure (same cluster; label-histogram cosine without clusters). Decision "
             f"at `flt.min-contrast` = {threshold:g}: *graph* (contrast below it) or *complete* "
             "(FedAvg's neighbourhood).", ""]
    table = []
    for row in rows:
        contrasts = [r["contrast"] for r in row["seeds"]]
        shares = [r["share-inside"] for r in row["seeds"]]
        decisions = ["graph" if c is not None and c < threshold else "complete" for c in contrasts]
        table.append([
            row["setting"], row["structure"],
            " / ".join(f"{r['edges-per-client']:.1f}" for r in row["seeds"]),
            " / ".join("—" if s is None else f"{s:.2f}" for s in shares),
            " / ".join("—" if c is None else f"{c:.2f}" for c in contrasts),
            " / ".join(decisions),
        ])
    lines += markdown_table(["setting", "structure", "edges per client (per seed)",
                             "share inside", "contrast", "decision"], "llrrrl", table)
    return "\n".join(lines) + "\n"


# --- benchmarks.studies.flt_scale ----------------------------------------------------------------
def flt_scale(meta: dict[str, Any], fcr: dict[str, Any], agg: dict[str, Any]) -> str:
    a = meta["args"]
    lines = [*provenance(meta, "# FLT at scale: FCR server side and graph aggregation"), ""]
    side = meta["client-side"]
    source = ("MNIST `label-clusters`, one label per cluster, encoder pretrained on "
              f"{side.get('pretrain-images')} server-held images, client k-means (sklearn, "
              f"random_state 43) over ~{side.get('train-samples-per-client', 0):.0f} "
              "train images per client" if a["source"] == "mnist" else
              "synthetic: k random centres per cluster in R^e, each client's centroids = its "
              "cluster's centres + N(0, 1) noise")
    lines += [
        f"- setting: M = {a['clients']} clients in {a['clusters']} true clusters, k = {a['k']}, "
        f"e = {a['latent']}, γ = {a['gamma']}; centroids: {source}.",
        f"- UMAP on {fcr['points']} points (`strategies.methods.flt.relatedness.umap_embed`: n_neighbors 15, "
        "random_state 42, exact neighbours); one client is held out of the fit and placed afterwards.",
        "",
        "## FCR, server side",
        "",
    ]
    steps = [(name, f"{step['seconds']:.2f}", f"{step['peak-mb']:.1f}")
             for name, step in fcr["steps"].items()]
    steps += [("**total (UMAP + distance + threshold + Ward)**",
               f"**{fcr['server-total-seconds']:.2f}**", None),
              ("(min-pair distance instead of matching)", f"{fcr['min-pair']['seconds']:.2f}",
               f"{fcr['min-pair']['peak-mb']:.1f}")]
    if fcr["late-client"]:
        late = fcr["late-client"]
        steps.append(("place one late client (UMAP transform + distance row)", f"{late['seconds']:.3f}",
                      f"{late['peak-mb']:.1f}"))
    lines += markdown_table(["step", "seconds", "tracemalloc peak (MB)"], "lrr", steps)
    verdict = "meets" if fcr["server-total-seconds"] < TARGET_FCR_SECONDS else "misses"
    q = fcr["quality"]
    lines += [
        "",
        f"Target: under {TARGET_FCR_SECONDS:.0f} s on 2 cores — {verdict} it. Before the timed steps, a "
        f"warm-up UMAP fit + transform on 40 points took {fcr['warm-up']['seconds']:.1f} s: loading "
        "numba's cached compiled code, paid once per process (the first FLT run of a process pays "
        "it inside its FCR).",
        "",
        f"Graph quality (check): ARI of Ward (C = {a['clusters']}) vs the true clusters "
        f"{q['ari (Ward, C)']:.3f}; share of Ã's off-diagonal edges inside true clusters "
        f"{_pct(q['edges-inside-true-clusters'])}; {q['edges']} edges, mean degree "
        f"{q['mean-degree']:.1f}." + (
            f" The late client got {fcr['late-client']['neighbours']} neighbours, "
            f"{_pct(fcr['late-client']['neighbours-in-true-cluster'])} of them in its true cluster."
            if fcr["late-client"] else ""),
        "",
        "## Aggregation per round",
        "",
        f"V = [{agg['clients']} × {agg['params']:,}] float32 ({agg['matrix-gb']:.2f} GB; P = the MLP "
        f"784→200→10). Medians of {agg['reps']} repetitions, torch threads "
        f"{meta['machine']['torch-threads']}.",
        "",
    ]
    computations = [("FedAvg: n-weighted mean of all rows, [1, M]·[M, P]", "–", agg["clients"],
                     f"{agg['fedavg-mean']['median-seconds']:.3f}", "1.00")]
    steps = (("flt (Ward clusters)", "Ward clusters"),
             ("flt (threshold Ã)", "threshold Ã, sums shared along the tree"),
             ("flt (threshold Ã, one product per distinct row)",
              "threshold Ã, one product per distinct row"))
    for name, title in steps:
        entry = agg[name]
        for label in ("all clients trained", "rho=0.2"):
            e = entry[label]
            computations.append((f"FLT step, {title}, {label}", entry["distinct-rows"],
                                 f"{entry['row-axpys']:,}", f"{e['median-seconds']:.3f}",
                                 f"{e['ratio-to-fedavg']:.2f}"))
    for label in ("formula, torch.sparse Ã", "formula, dense Ã"):
        if label in agg:
            e = agg[label]
            computations.append((f"D⁻¹(Ã diag(n))·V as one {label.split(', ')[1]} product (1 run)",
                                 agg["clients"], f"{agg['flt (threshold Ã)']['nnz']:,}",
                                 f"{e['median-seconds']:.2f}", f"{e['ratio-to-fedavg']:.1f}"))
    lines += markdown_table(["computation", "distinct rows of Ã", "row-axpys per step", "median seconds",
                             "× FedAvg mean"], "lrrrr", computations)
    clustered = agg["flt (Ward clusters)"]["all clients trained"]["ratio-to-fedavg"]
    threshold = agg["flt (threshold Ã)"]
    direct = agg["flt (threshold Ã, one product per distinct row)"]
    full, partial = (threshold[label]["ratio-to-fedavg"] for label in ("all clients trained", "rho=0.2"))
    difference = max((agg[label]["max-relative-difference-of-shared-sums"]
                      for label in ("formula, torch.sparse Ã", "formula, dense Ã") if label in agg),
                     default=None)
    lines += [
        "",
        f"Target: FLT's step under {TARGET_RATIO:.0f}× the FedAvg mean. With disjoint clusters "
        f"(`flt.clusters` > 0) it {'meets' if clustered < TARGET_RATIO else 'misses'} it: "
        f"{clustered:.2f}× with every client trained. With the threshold graph Ã (γ = "
        f"{a['gamma']}, no clusters) it {'meets' if full < TARGET_RATIO else 'misses'} it: "
        f"{full:.2f}× with every client trained, {partial:.2f}× at ρ = 0.2 (one product per distinct "
        f"row: {direct['all clients trained']['ratio-to-fedavg']:.0f}×). " + (
            "The threshold graph of this run is block-structured as well "
            f"({threshold['distinct-rows']} distinct rows)."
            if threshold["distinct-rows"] <= agg["flt (Ward clusters)"]["distinct-rows"] else
            f"Ã is nearly but not exactly block-diagonal ({threshold['nnz']:,} non-zeros, "
            f"{threshold['distinct-rows']} distinct rows), so clients have individual "
            "neighbourhoods and their models differ."),
        "",
        "FLT's step is `NeighbourhoodModels.aggregate`: clients with equal rows of Ã hold one shared "
        "model, computed once per distinct row. Ã is fixed after FCR, so `set_graph` plans the sums "
        "once (`strategies.methods.flt.neighbourhood_sums.SumTree`): a minimum spanning tree over the distinct "
        "rows plus a virtual root, where a row either is one product over its neighbours or copies a "
        "similar row's sum and adds/subtracts the terms in which the two differ, "
        "S_c = S_p + Σ_{N_c∖N_p} n_j v_j − Σ_{N_p∖N_c} n_j v_j. For this Ã: "
        f"{threshold['row-axpys']:,} row-axpys instead of {direct['row-axpys']:,} (nnz of the "
        f"distinct rows), {threshold['directly-computed-rows']} rows computed directly, "
        f"{threshold['levels']} levels; `set_graph` (distinct rows + plan) took "
        f"{threshold['set-graph-seconds']:.2f} s once. With Ward clusters every row is one product "
        "(rows share nothing), one pass over the trained rows like FedAvg. Every step also writes each "
        "distinct row's model once (and copies a parent row per tree row), so at "
        f"{threshold['distinct-rows']} distinct rows the step costs about "
        f"(row-axpys + 2·{threshold['distinct-rows']}) row passes against FedAvg's "
        f"{agg['clients']}: the step is bound by memory traffic, not arithmetic."
        + (f" Largest relative difference between the tree's models and the plain formula (float32): "
           f"{difference:.1e}." if difference is not None else ""),
        "",
        f"Process peak RSS: {agg['max-rss-mb']:.0f} MB.",
        "",
    ]
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


# --- benchmarks.studies.sfl_scale ----------------------------------------------------------------
def calibration(rows: list[dict[str, Any]]) -> float | None:
    """Measured cost of a sparse multiply-add in dense ones (the cost model's constant): median over
    (N, P, graph) of [sparse s / (nnz·steps·P)] / [dense s / (N²·steps·P)] for matching orders."""
    ratios = []
    for r in rows:
        if r.get("skipped") or not r["plan"].endswith("/sparse"):
            continue
        dense = next((d for d in rows if d["clients"] == r["clients"] and d["params"] == r["params"]
                      and d["hops"] == r["hops"] and d["graph"] == r["graph"]
                      and not d.get("skipped")
                      and d["plan"] == r["plan"].replace("sparse", "dense")), None)
        if dense is None:
            continue
        nnz = r["nnz-operator-per-row"] if r["plan"].startswith("graph") else r["nnz-per-row"]
        ratios.append((r["seconds"] / (nnz * r["clients"])) / (dense["seconds"] / r["clients"] ** 2))
    return statistics.median(ratios) if ratios else None


def work_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Why the ratio is what it is: multiply-adds per element of V of each sparse plan `auto` chose
    (L·nnz(Â)/row rows-first, nnz(W)/row graph-first) against the mean's one add, and the rate."""
    notes = []
    for r in rows:
        if not r["auto"] or not r["plan"].endswith("/sparse") or r.get("skipped"):
            continue
        per_element = (r["hops"] * r["nnz-per-row"] if r["plan"].startswith("rows")
                       else r["nnz-operator-per-row"])
        rate = per_element * r["clients"] * r["params"] / r["seconds"] / 1e9
        notes.append(
            f"- N={r['clients']}, P={r['params']:.0e}, L={r['hops']}, {r['graph']}: "
            f"`auto` = {r['plan']}, "
            f"{per_element:.0f} multiply-adds per element of V (the mean: 1 add) at {rate:.1f} G/s "
            f"→ {r['ratio']:.1f}× the mean.")
    return notes


def sfl_scale(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        *provenance(meta, f"# {meta['name']}: SFL server aggregation vs the plain mean"),
        f"- setting: float32 V [N, P]; U = α·Â^L·V + (1−α)·V with L ∈ {{{meta['hops']}}}, "
        f"α = {meta['alpha']}; graphs `dense` (uniform random weights, all pairs) and "
        f"`knn-{meta['k']}` ({meta['k']} nearest of random points in the plane + self-loop); "
        f"medians of up to {meta['reps']} runs (1 run when slower than {meta['slow']} s); torch "
        f"threads {meta['threads']}; cost-model constant SPARSE_COST_PER_NONZERO = "
        f"{SPARSE_COST_PER_NONZERO:g}; column blocks of ~{spmm.BLOCK_BYTES // 1024} KiB "
        f"(sparse kernel `strategies.methods.sfl.spmm`: {spmm.block_columns(1000)} columns at N = 1000) / "
        f"{DENSE_COLUMN_BLOCK} columns (dense); U written into one preallocated matrix",
        "",
        "**×mean** = propagation seconds / seconds of `V.mean(0)` on the same V (FedAvg's server "
        "step); **step ×mean** adds SFL's read-out w = mean(U). **nnz/row**: Â, and the operator "
        "W = α·Â^L + (1−α)·I that graph-first multiplies with. ✔ = the plan `auto` chooses; "
        "\"skipped\" = modelled cost over the skip limit (shown as a multiple of the cheapest plan).",
        "",
    ]
    table = []
    for r in rows:
        if r.get("skipped"):
            cells = ["—", f"skipped ({r['modelled-cost']:.1f}×)", "—", "—"]
        else:
            cells = [f"{r['build-seconds']:.3f}", f"{r['seconds']:.3f}", f"**{r['ratio']:.1f}**",
                     f"{r['step-ratio']:.1f}"]
        table.append([r["clients"], f"{r['params']:.0e}", r["hops"], r["graph"], f"{r['nnz-per-row']:.0f}",
                      f"{r['nnz-operator-per-row']:.0f}", r["plan"], "✔" if r["auto"] else "", *cells])
    lines += markdown_table(["N", "P", "L", "graph", "nnz/row Â", "nnz/row W", "plan", "auto", "build s",
                             "seconds", "×mean", "step ×mean"], "rrrlrrlcrrrr", table)
    means = sorted({(r["clients"], r["params"], r["hops"], r["mean-seconds"],
                     r["weighted-mean-seconds"]) for r in rows})
    lines += ["", "Plain mean `V.mean(0)` / example-weighted mean `(w/Σw) @ V` (seconds, measured "
              "again before each L): " + "; ".join(f"N={n}, P={p:.0e}, L={h}: {m:.3f} / {wm:.3f}"
                                                  for n, p, h, m, wm in means)]
    lines += ["", *work_notes(rows)]
    measured = calibration(rows)
    if measured is not None:
        lines.append(f"\nMeasured cost of a sparse multiply-add, in dense ones (median over cases): "
                     f"{measured:.1f} (the cost model uses {SPARSE_COST_PER_NONZERO:g}).")
    lines += ["", *meta.get("notes", []), ""]
    return "\n".join(lines)


# --- benchmarks.studies.untuned -----------------------------------------------------------------
UNTUNED_BASELINES = ("fedavg", "fedavg+FT", "local")  # FLT is compared with their maximum


def _untuned_delta(row: dict[str, Any], method: str = "flt") -> float | None:
    base = [row["means"].get(b) for b in UNTUNED_BASELINES]
    if row["means"].get(method) is None or any(b is None for b in base):
        return None
    return row["means"][method] - max(base)


def _untuned_others(rows: list[dict[str, Any]]) -> list[str]:
    """The methods a study ran beside FLT and the baselines, in the order of its first row."""
    return [m for m in rows[0]["means"] if m != "flt" and m not in UNTUNED_BASELINES] if rows else []


def _untuned_setting(s: dict[str, Any]) -> str:
    k = s["set"]
    part = k["partition"]
    if part == "label-clusters":
        part += f" {k['num-clusters']}×{k['labels-per-cluster']}"
    elif part == "dirichlet":
        part += f" α={k['dirichlet-alpha']:g}"
    elif part == "domains":
        part += f" {k['domain-rotations']}°"
    elif part == "shards":
        part += f" q={k['shards-per-client']}"
    rounds = f", {k['num-rounds']} rounds" if "num-rounds" in k else ""
    return (f"{part}, M={k['num-clients']}, n≤{k['max-samples-per-client']}, "
            f"ρ={k['fraction-train']:g}{rounds}")


def _earlier_rule(flt: dict[str, Any]) -> str:
    """The contrast between centroid sets and the decision of the rule the structure test replaced."""
    if "complete-graph" not in flt:
        return "—"
    contrast = flt.get("structure-contrast")
    if contrast is None:
        return "— complete"
    return f"{contrast:.2f} {'graph' if contrast < 0.3 else 'complete'}"


def untuned(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    subject = "FLT" if any("flt" in r["means"] for r in rows) else ", ".join(_untuned_others(rows))
    lines = [*provenance(meta, f"# {meta['name']}: {subject} on settings no rule was tuned on"), "",
             f"Settings: `{meta['list']}` ({len(rows)} settings, common budget "
             + ", ".join(f"{k}={v}" for k, v in meta["common"].items()) + ")."
             + (f" Baselines read from `{meta['baselines']}`." if meta.get("baselines") else ""),
             "Δ = FLT − max(FedAvg, FedAvg+FT, Local), points. Decision: FLT's graph (*graph*) or "
             "the complete graph (*complete*: no structure found); p: the structure test's p-value "
             "where the run reports one (— where the graph has no edge). 0.3 rule: the graph's "
             "contrast between centroid sets and what the earlier rule (graph below 0.3) decided "
             "on the same graph.", ""]
    table = []
    for r in rows:
        m, flt = r["means"], r.get("flt") or {}
        d = _untuned_delta(r)
        fmt = (lambda v: "—" if v is None else f"{v:.2f}")
        p = flt.get("structure-p", flt.get("logged-structure-p"))
        decision = ("—" if "complete-graph" not in flt
                    else "complete" if flt["complete-graph"] else "graph")
        table.append([r["name"], _untuned_setting(r), r["structure"], str(r["seed"]),
                      fmt(m.get("fedavg")), fmt(m.get("fedavg+FT")), fmt(m.get("local")),
                      fmt(m.get("flt")), "—" if d is None else f"{round(d, 2) + 0.0:+.2f}", decision,
                      "—" if p is None else f"{p:.3f}", _earlier_rule(flt)])
    header, align = ["setting", "partition", "structure", "seed", "FedAvg", "FedAvg+FT", "Local",
                     "FLT", "Δ", "decision", "p", "0.3 rule"], "lllrrrrrrlrl"
    if any("flt-local" in r for r in rows):  # the safeguard's purely local candidate, last round
        lines[-1:-1] = ["Local candidate (client_app/local_candidate.py), at the last evaluation: "
                        "the clients that answered with it, the pooled held-out evidence for it in "
                        "standard errors, and its mean test accuracy (— where no client kept one)."]
        header, align = header + ["answered local", "evidence", "local cand."], align + "rrr"
        for row, r in zip(table, rows):
            c = r.get("flt-local") or {}
            row += ["—" if c.get("answered") is None else str(c["answered"]),
                    "—" if c.get("evidence") is None else f"{c['evidence']:+.2f}",
                    "—" if c.get("accuracy") is None else f"{c['accuracy']:.2f}"]
    others = _untuned_others(rows)
    if others:  # other methods run on the same settings: their mean and Δ against the same baselines
        lines[-1:-1] = [f"Beside FLT: {', '.join(others)}, each with its Δ against the same "
                        "max(FedAvg, FedAvg+FT, Local)."]
        header = header + [c for m in others for c in (m, f"Δ {m}")]
        align += "rr" * len(others)
        for row, r in zip(table, rows):
            for m in others:
                d = _untuned_delta(r, m)
                row += ["—" if r["means"].get(m) is None else f"{r['means'][m]:.2f}",
                        "—" if d is None else f"{round(d, 2) + 0.0:+.2f}"]
    lines += markdown_table(header, align, table)
    lines += ["", *meta.get("notes", [])]
    return "\n".join(lines).rstrip() + "\n"


# --- benchmarks.studies.slice_cost -------------------------------------------------------------
SLICE_COST_WAYS = ("whole split", "slice-free", "whole-split")  # how Local's training was replayed


def slice_cost(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    table = [[r["name"], str(r["seed"]), "—" if r.get("local") is None else f"{r['local']:.2f}",
              *(f"{r['means'][way]:.2f}" for way in SLICE_COST_WAYS),
              f"{r['means']['slice-free'] - r['means']['whole split']:+.2f}",
              f"{r['means']['whole-split'] - r['means']['whole split']:+.2f}"] for r in rows]
    return "\n".join([
        *provenance(meta, f"# {meta['name']}: what the held-out slice costs a client training alone"),
        "",
        f"Settings from `{meta['list']}`, held-out share {meta['holdout']:g}; Local (committed) read "
        f"from `{meta['baselines']}`. Personalized mean accuracy (%) of Local's training replayed on "
        "the whole train split, on the split less the slice in that part's own batches "
        "(`slice-free`) and in the whole split's batches less the slice (`whole-split`).",
        "",
        *markdown_table(["setting", "seed", "Local (committed)", *SLICE_COST_WAYS, "slice-free − whole",
                         "whole-split − whole"], "lrrrrrrr", table),
        "",
    ])
