"""docs/privacy.md, "Measured": accuracy against ε under each DP mode, the learned graphs' share
inside the true groups, and the cost of DP in seconds per round, from the committed runs of
`benchmarks/experiments/privacy.toml` (`python -m benchmarks.compare --config ...`, one results JSON
per cell and seed under benchmarks/results/privacy/).

The grid is read from the TOML itself (its cells, seeds and methods), so a cell or method the
committed runs lack is shown as such, with the reason: a mode the method does not support in this
build (its registry entry's `Method.privacy`), a mode that has nothing to noise (Local under
`dp = "client"`), or a run that was not made."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from docs.blocks import block
from docs.blocks.data import DASH, REPO, RESULTS, mean, mean_sd, num, raw, table, times

GRID = REPO / "benchmarks" / "experiments" / "privacy.toml"
FOLDER = "privacy"  # under benchmarks/results/
EPSILONS = (1, 4, 8)
MODES = ("sample", "client")
# row label -> (method, the summary's result key)
ROWS = {"FedAvg": ("fedavg", "personalized"), "FedAvg+FT": ("fedavg", "finetuned"),
        "Local": ("local", "personalized"), "FLT": ("flt", "personalized"),
        "SFL*": ("sfl-star", "personalized"), "FedSKA": ("fedska", "personalized")}
GRAPHS = ("FLT", "SFL*", "FedSKA")
SETTINGS = {"label-clusters": "MNIST label clusters (4 groups of 3 clients, 2 labels each)",
            "domains": "rotated MNIST domains (4 rotations, 3 clients each, 10 classes)"}
# marks of the cells no committed run fills, explained under each table
NOT_SUPPORTED, NO_AGGREGATE, NOT_RUN = "not available", "n/a", "not run"
NO_GRAPH = "no graph learned"  # the runs exist, but learned no graph (`_no_graph_reason`)


def grid() -> dict[str, Any]:
    return tomllib.loads(GRID.read_text())


def _cell_name(setting: str, mode: str, eps: int | None) -> str:
    if mode == "off":
        return f"{setting}-off"
    return f"{setting}-{mode}-eps{eps}"


def _cells(setting: str, mode: str, eps: int | None) -> list[str]:
    """The grid's cells of (setting, mode, ε): the graph methods' runs under each mode are cells of
    their own (`<setting>-<mode>-graph[-<method>]-eps<ε>`; under dp = "sample" one per method, FLT's
    and FedSKA's, each with the σ calibrated over its own releases)."""
    if mode == "off":
        return [_cell_name(setting, mode, eps)]
    graph = f"{setting}-{mode}-graph"
    return [_cell_name(setting, mode, eps)] + [
        cell["name"] for cell in grid()["cells"]
        if cell["name"].startswith(graph) and cell["name"].endswith(f"-eps{eps}")]


def _runs(setting: str, mode: str, eps: int | None, method: str) -> list[dict[str, Any]]:
    """Every committed summary of `method` in the cell(s) of (setting, mode, ε), one per seed run
    (each with its seed and command: `_seeded`)."""
    return _seeded(setting, mode, eps, method)


def _supports(method: str, mode: str) -> bool:
    from strategies.shared.registry import METHODS

    return mode in METHODS[method].privacy


def _missing(method: str, mode: str) -> str:
    if mode == "client" and method == "local":
        return NO_AGGREGATE
    if not _supports(method, mode):
        return NOT_SUPPORTED
    return NOT_RUN


def _accuracy(summary: dict[str, Any], key: str) -> float | None:
    return (summary["final"].get(key) or {}).get("mean")


def _stopped(runs: list[dict[str, Any]]) -> str:
    """" (target spent: round r, ...)" for the runs a client-level target stopped before the last
    round (their models stay as the last released ones), "" for none."""
    rounds = sorted(r for r in ((s.get("privacy") or {}).get("stopped-round") for s in runs) if r)
    return f" (spent in round {', '.join(map(str, rounds))})" if rounds else ""


def _withheld(runs: list[dict[str, Any]]) -> str:
    """" (withheld: k, ...)": per run (seed), how many clients the target withheld from a release
    (the summary's `withheld-clients`); "" where none was."""
    counts = [len((s.get("privacy") or {}).get("withheld-clients") or []) for s in runs]
    return f" (withheld: {', '.join(map(str, counts))})" if any(counts) else ""


def _clients() -> int:
    return int(grid()["common"]["num-clients"])


def _complete(summary: dict[str, Any]) -> bool:
    """FLT found no client structure and averaged every client over the complete graph."""
    return summary["method"] == "flt" and bool((summary.get("flt") or {}).get("complete-graph"))


def _share(summary: dict[str, Any], uniform: float | None) -> float | None:
    """The learned graph's share inside the true groups at the end of the run, as each method's
    summary reports it (FLT: the share of its thresholded graph's edges inside true clusters, or,
    where it found no structure and averaged over the complete graph, that graph's share `uniform`;
    SFL*, FedSKA: the learned graph's off-diagonal weight inside the true structure)."""
    method = summary["method"]
    if method == "flt":
        if _complete(summary):
            return uniform
        return (summary.get("flt") or {}).get("edges-inside-true-clusters")
    section, prefix = {"sfl-star": ("sfl", "learned-share-"), "fedska": ("fedska", "share-")}[method]
    found = summary.get(section) or {}
    return next((v for k, v in found.items() if k.startswith(prefix) and k.endswith("-final")), None)


def _uniform_share(setting: str) -> float | None:
    """The share of a graph blind to the groups (every pair weighted alike), from SFL*'s summary."""
    for summary in _runs(setting, "off", None, "sfl-star"):
        found = summary.get("sfl") or {}
        value = next((v for k, v in found.items() if k.startswith("uniform-share-")), None)
        if value is not None:
            return value
    return None


def _fmt(values: Sequence[float], digits: int = 1, seeds: int = 3) -> str:
    """Mean ± std of `values` (one per seed), with "(k seeds)" where k is not `seeds`, the count
    most cells of the table have (`_seed_count`)."""
    if not values:
        return DASH
    m, sd = mean_sd(list(values))
    text = num(m, digits) + (f" ± {num(sd, digits)}" if len(values) > 1 else "")
    count = len(values)
    return text + (f" ({count} seed{'s' if count != 1 else ''})" if count != seeds else "")


def _seed_count(setting: str) -> int:
    """The number of seeds most of a setting's committed runs average over."""
    from collections import Counter

    counts = Counter(len(_runs(setting, mode, eps, method)) for mode, eps in _columns()
                     for method, _ in ROWS.values())
    counts.pop(0, None)
    return counts.most_common(1)[0][0] if counts else 0


def seeds_caption(setting: str) -> str:
    """Which seeds the numbers average, from the committed runs."""
    seeds = sorted({seed for mode, eps in _columns() for method, _ in ROWS.values()
                    for seed in (s["seed"] for s in _seeded(setting, mode, eps, method))})
    count = _seed_count(setting)
    grid_seeds = grid()["seeds"]
    text = (f"one seed ({seeds[0]}) of the grid's {len(grid_seeds)}" if count == 1 else
            f"mean ± std over {count} seeds ({', '.join(map(str, seeds))})")
    return text + ("; a cell with another count says so" if any(
        0 < len(_runs(setting, mode, eps, method)) != count for mode, eps in _columns()
        for method, _ in ROWS.values()) else "")


def _columns() -> list[tuple[str, int | None]]:
    return [(mode, eps) for mode in MODES for eps in EPSILONS] + [("off", None)]


def _header(first: str) -> list[str]:
    return [first] + [f"{mode} ε={eps}" if eps else "ε=∞ (off)" for mode, eps in _columns()]


def _notes(marks: set[str], methods: dict[str, set[str]]) -> str:
    lines = []
    for mark in (NOT_SUPPORTED, NO_AGGREGATE, NOT_RUN):
        if mark not in marks:
            continue
        who = "; ".join(f'dp = "{mode}" for {", ".join(sorted(names))}'
                        for mode, names in sorted(methods.get(mark, {}).items()))
        text = {NOT_SUPPORTED: f"**{NOT_SUPPORTED}**: not run, the mode is not available for the "
                               f"method in this build ({who}; see the table of methods above)",
                NO_AGGREGATE: f"**{NO_AGGREGATE}**: Local forms no aggregate, so client-level DP "
                              "has nothing to noise and no guarantee to give",
                NOT_RUN: f"**{NOT_RUN}**: no committed run of the cell ({who})"}[mark]
        lines.append(f"- {text}.")
    return "\n".join(lines)


def accuracy_table(setting: str) -> str:
    seeds = _seed_count(setting)
    rows, marks = [], set()
    missing: dict[str, dict[str, set[str]]] = {}
    for label, (method, key) in ROWS.items():
        row = [label]
        for mode, eps in _columns():
            runs = _runs(setting, mode, eps, method)
            values = [v for v in (_accuracy(s, key) for s in runs) if v is not None]
            if values:
                row.append(_fmt(values, seeds=seeds) + _stopped(runs) + _withheld(runs))
            else:
                mark = _missing(method, mode) if mode != "off" else NOT_RUN
                marks.add(mark)
                missing.setdefault(mark, {}).setdefault(mode, set()).add(label)
                row.append(mark)
        rows.append(row)
    notes = _notes(marks, {m: v for m, v in missing.items()})
    if any("(withheld:" in cell for row in rows for cell in row):
        notes += ("\n" if notes else "") + (
            f"- **withheld: k, ...**: per seed, how many of the {_clients()} clients the target "
            "withheld from a release that would have taken their ε past it (the summary's "
            "`withheld-clients`): FLT asks such a client for no centroids (it then trains alone), "
            "FedSKA sends it no more training (its rows stay what the server had). FLT and FedSKA "
            "run under `sample` with the σ (and upload σ) calibrated to the column's ε over every "
            "release they declare and with that ε as their target, which covers their noised "
            "uploads (and FLT's autoencoder steps) too; the budget table below says what they spent.")
    if any("spent in round" in cell for row in rows for cell in row):
        notes += ("\n" if notes else "") + (
            "- **spent in round r**: the run's client-level target was spent in round r, and no "
            "model changed from then on. The graph methods' accountant charges a client for every "
            "aggregate its update enters and for its noised uploads (FLT's centroids, FedSKA's "
            "descriptors), which depends on the graph learned, so their σ is calibrated as "
            "FedAvg's (one aggregate a round) and the target stops them once spent.")
    return table(_header("method"), rows) + ("\n\n" + notes if notes else "")


def share_table(setting: str) -> str:
    seeds = _seed_count(setting)
    uniform = _uniform_share(setting)
    rows, unlearned = [], {}
    for label in GRAPHS:
        method = ROWS[label][0]
        row = [label]
        for mode, eps in _columns():
            runs = _runs(setting, mode, eps, method)
            values = [v for v in (_share(s, uniform) for s in runs) if v is not None]
            complete = sum(_complete(s) for s in runs)
            text = (_fmt(values, 2, seeds) if values else NO_GRAPH if runs else
                    (_missing(method, mode) if mode != "off" else NOT_RUN))
            if not values and runs:
                unlearned.update({label: _no_graph_reason(runs)})
            row.append(text + (f" ({complete} complete)" if complete else "") + _stopped(runs)
                       + _withheld(runs))
        rows.append(row)
    chance = (f" A graph blind to the groups (every pair alike) has {num(uniform, 2)} inside them."
              if uniform is not None else "")
    return table(_header("graph"), rows) + "\n\nShare of the learned graph inside the true groups " \
        "at the end of the run (1: every edge or weight joins clients of the same group)." + chance \
        + (" **(k complete)**: in k of the seeds FLT found no client structure (its structure check) and " \
           "averaged every client over the complete graph, whose share is the blind one.") + (
        f" **{NO_GRAPH}**: the runs report no learned graph ("
        + "; ".join(f"{label}: {why}" for label, why in unlearned.items()) + ")." if unlearned else "")


def _no_graph_reason(runs: list[dict[str, Any]]) -> str:
    """Why a method's runs learned no graph, from their summaries: FLT's clustering (FCR) says why
    it was not run; a run that released nothing (ε 0) trained no round."""
    reasons = []
    for summary in runs:
        fcr = (summary.get("flt") or {}).get("fcr")
        if isinstance(fcr, str) and fcr.startswith("not run"):
            reasons.append(f"its clustering {fcr}")
        elif not (summary.get("privacy") or {}).get("epsilon-max"):
            reasons.append("no round was trained, every client withheld from the first")
        else:
            reasons.append("no share reported")
    return ", ".join(dict.fromkeys(reasons))


def budget_table(setting: str) -> str:
    """σ each cell ran with (calibrated to its ε) and the largest ε any client (sample) or the
    federation (client) reached, with the clients a target stopped or withheld; the methods whose
    target withheld clients (FLT, FedSKA under `sample`: a release beyond their DP-SGD steps would
    have passed it) in rows of their own, followed by generated sentences on whether any ε passed
    its target and on what those methods' uploads cost."""
    rows, within, withheld_rows, who, upload_costs = [], 0, 0, set(), {}
    labels = {method: label for label, (method, key) in ROWS.items() if key == "personalized"}
    for mode in MODES:
        for eps in EPSILONS:
            held = {m for m in labels for s in _runs(setting, mode, eps, m)
                    if (s.get("privacy") or {}).get("withheld-clients")}
            groups = [[m for m in labels if m not in held]] + [[m] for m in labels if m in held]
            for group in groups:
                sigmas, reached, stopped, withheld, methods = set(), [], 0, 0, []
                for method in group:
                    for summary in _runs(setting, mode, eps, method):
                        privacy = summary.get("privacy") or {}
                        if not privacy:
                            continue
                        sigmas.add(privacy["noise-multiplier"])
                        reached.append(privacy.get("epsilon-max", privacy.get("epsilon")))
                        stopped += len(privacy.get("stopped-clients") or [])
                        stopped += 1 if privacy.get("stopped-round") else 0
                        withheld += len(privacy.get("withheld-clients") or [])
                        if withheld and privacy.get("upload-noise-multiplier"):
                            upload_costs[eps] = _upload_epsilon(privacy)
                        if labels[method] not in methods:
                            methods.append(labels[method])
                reached = [r for r in reached if r is not None]
                if not reached:
                    continue
                largest = max(reached)
                within += largest <= eps
                if withheld:
                    withheld_rows += 1
                    who.update(methods)
                rows.append([f'`{mode}`', f"{eps}", ", ".join(methods),
                             " / ".join(num(s, 3) for s in sorted(sigmas)), num(largest, 3),
                             f"{stopped}", f"{withheld}"])
    text = table(["dp", "target ε", "methods", "σ (calibrated)", "largest ε reached", "stops",
                  "withheld"], rows)
    text += (f"\n\n**withheld**: clients the target kept from a release (summed over the row's "
             f"seeds). The largest ε reached is at or below the target in {within} of these "
             f"{len(rows)} rows.")
    if withheld_rows:
        text += " " + _upload_reading(setting, sorted(who, key=list(ROWS).index), upload_costs)
    return text


def _upload_epsilon(privacy: dict[str, Any]) -> float:
    """ε at the run's δ of one noised upload alone: a Gaussian mechanism at noise multiplier σ_u/2
    (a record clipped to C_u moves within a ball of radius C_u), no subsampling."""
    from strategies.shared.privacy import epsilon

    return epsilon([(privacy["upload-noise-multiplier"] / 2, 1.0, 1)], privacy["delta"])


def _upload_reading(setting: str, labels: list[str], costs: dict[int, float]) -> str:
    """What the rows with withheld clients mean: the ε of one noised upload against the target, the
    uploads received, and, per method, whether it released anything at all."""
    parts = []
    if costs:
        over = [eps for eps, cost in costs.items() if cost > eps]
        parts.append(
            "One noised upload alone (a Gaussian mechanism at σ_u/2, no subsampling, σ_u = σ) costs "
            + ", ".join(f"ε = {num(cost, 2)} at the σ of target {eps}" for eps, cost in sorted(costs.items()))
            + (": more than the whole target in every column" if len(over) == len(costs) else
               f": more than the whole target at ε = {', '.join(map(str, over))}" if over else "")
            + ".")
    for label in labels:
        method = ROWS[label][0]
        runs = [s for eps in EPSILONS for s in _runs(setting, "sample", eps, method)]
        privacy = [s.get("privacy") or {} for s in runs]
        if not runs:
            continue
        uploads = sum(int(p.get("uploads") or 0) for p in privacy)
        nothing = all(not p.get("epsilon-max") for p in privacy)
        text = f"{label} received {uploads} noised uploads in its {len(runs)} `sample` runs"
        if nothing:
            text += (" and released nothing at all (ε 0): the target withheld every client's "
                     "round from the first, so its model stays the initial one")
        elif uploads == 0:
            text += (": its clients trained by DP-SGD alone, without the structure its uploads "
                     "would give it")
        parts.append(text + ".")
    return " ".join(parts)


def _released(setting: str) -> str:
    """Generated sentences on FLT and FedSKA under `sample` (σ calibrated over every release they
    declare): per ε the σ they ran with, the largest ε any client reached against the target, the
    clients withheld, their accuracy against Local's and FedAvg's at the same ε, and their graphs'
    share inside the true groups against the run without DP and a blind graph."""
    uniform = _uniform_share(setting)
    parts = []
    for label in ("FLT", "FedSKA"):
        method, key = ROWS[label]
        columns, accuracy, shares, reached, withheld, sigmas = [], [], [], [], 0, []
        for eps in EPSILONS:
            runs = _runs(setting, "sample", eps, method)
            privacy = [s.get("privacy") or {} for s in runs]
            if not runs or not all(privacy):
                continue
            columns.append(eps)
            sigmas.append(" / ".join(num(v, 3) for v in sorted({p["noise-multiplier"] for p in privacy})))
            reached.append(max(p.get("epsilon-max") or 0.0 for p in privacy))
            withheld += sum(len(p.get("withheld-clients") or []) for p in privacy)
            others = {other: mean(_accuracy(s, "personalized") for s in _runs(setting, "sample", eps, other))
                      for other in ("local", "fedavg")}
            accuracy.append((mean(_accuracy(s, key) for s in runs), others["local"], others["fedavg"]))
            shares.append(mean(v for v in (_share(s, uniform) for s in runs) if v is not None))
        if not columns:
            continue
        at = "/".join(map(str, columns))
        text = (f"{label} (σ = σ_u = {', '.join(sigmas)} at target ε = {at}) ended with the largest "
                f"client ε at {'/'.join(num(r, 3) for r in reached)}"
                + (", every one at or below its target" if all(r <= e for r, e in zip(reached, columns))
                   else ", past its target in some column")
                + (f", {withheld} clients withheld in all" if withheld else ", no client withheld")
                + f"; mean accuracy {'/'.join(num(a, 1) for a, _, _ in accuracy)} against Local's "
                f"{'/'.join(num(l, 1) for _, l, _ in accuracy)} and FedAvg's "
                f"{'/'.join(num(f, 1) for _, _, f in accuracy)} at the same ε")
        ahead = [e for e, (a, l, _) in zip(columns, accuracy) if None not in (a, l) and a > l]
        text += (f" (above Local at ε = {', '.join(map(str, ahead))})" if ahead else
                 " (below Local in every column)")
        off = mean(v for v in (_share(s, uniform) for s in _runs(setting, "off", None, method))
                   if v is not None)
        if any(v is not None for v in shares):
            text += (f"; its graph's share inside the true groups "
                     f"{'/'.join(num(v, 2) if v is not None else DASH for v in shares)}"
                     + (f" against {num(off, 2)} without DP" if off is not None else "")
                     + (f" and {num(uniform, 2)} for a blind graph" if uniform is not None else ""))
        parts.append(text + ".")
    if not parts:
        return ""
    return ("FLT and FedSKA under DP-SGD, with σ calibrated over everything their clients release "
            "(columns ε = 1/4/8): " + " ".join(parts))


def cost_table() -> str:
    """s/round with DP against the same method without it, paired: the same seed's dp = "off" run in
    the same process (`benchmarks.compare --config` runs the grid's cells one after another)."""
    rows = []
    for setting in SETTINGS:
        for label, (method, key) in ROWS.items():
            if key != "personalized":
                continue
            base = {s["seed"]: (s["seconds-per-round"], s["command"])
                    for s in _seeded(setting, "off", None, method)}
            if not base:
                continue
            row = [SETTINGS_SHORT[setting], label, num(mean(t for t, _ in base.values()), 2)]
            for mode in MODES:
                for eps in EPSILONS:
                    runs = _seeded(setting, mode, eps, method)
                    runs = [s for s in runs if not _cut_short(s)]
                    pairs = [(s["seconds-per-round"], base[s["seed"]][0]) for s in runs
                             if s["seed"] in base and s.get("seconds-per-round")
                             and s["command"] == base[s["seed"]][1]]
                    timed = [s["seconds-per-round"] for s in runs if s.get("seconds-per-round")]
                    if not pairs and timed:
                        row.append(f"{num(mean(timed), 2)} ({UNPAIRED})")
                        continue
                    if not pairs:
                        row.append(STOPPED if _seeded(setting, mode, eps, method)
                                   else _missing(method, mode))
                        continue
                    ratio = mean(dp / off for dp, off in pairs)
                    row.append(f"{num(mean(dp for dp, _ in pairs), 2)} ({times(ratio, 1)})")
            rows.append(row)
    return table(["setting", "method", "off"] + [f"{mode} ε={eps}" for mode in MODES
                                                  for eps in EPSILONS], rows)


def _cut_short(summary: dict[str, Any]) -> bool:
    """The run's target stopped training early: the federation's (client-level), or any client's
    DP-SGD steps or releases (stopped or withheld clients), so its later rounds train less."""
    privacy = summary.get("privacy") or {}
    return bool(privacy.get("stopped-round") or privacy.get("stopped-clients")
                or privacy.get("withheld-clients"))


SETTINGS_SHORT = {"label-clusters": "label clusters", "domains": "domains"}
STOPPED = "stopped early"  # every run's target stopped its training: its rounds cost no training
UNPAIRED = "not paired"  # made by another command than the run without DP: no paired timing


def _seeded(setting: str, mode: str, eps: int | None, method: str) -> list[dict[str, Any]]:
    """Every committed summary of `method` in the cell(s) of (setting, mode, ε), one per seed run,
    with its seed (from its comparison's settings) and the command that made it."""
    config = grid()
    out = []
    by_name = {c["name"]: c for c in config["cells"]}
    for name in _cells(setting, mode, eps):
        cell = by_name.get(name)
        if cell is None or method not in cell.get("methods", config["methods"]):
            continue
        for seed in config["seeds"]:
            path = RESULTS / FOLDER / f"{GRID.stem}-{name}-seed{seed}.json"
            if path.is_file():
                data = raw(f"{FOLDER}/{path.stem}")
                out += [{**s, "seed": data["settings"]["seed"], "command": data["command"]}
                        for s in data["summaries"] if s["method"] == method]
    return out


def commands() -> str:
    """The commands that produced the committed runs, as their JSONs record them."""
    found: list[str] = []
    for path in sorted((RESULTS / FOLDER).glob(f"{GRID.stem}-*.json")):
        command = raw(f"{FOLDER}/{path.stem}")["command"]
        if command not in found:
            found.append(command)
    return "```bash\n" + "\n".join(found) + "\n```"


def _reading(setting: str) -> str:
    """Generated sentences: FedAvg's and SFL*'s accuracy at the smallest and largest ε against
    ε = ∞ under DP-SGD, and the graphs' share at ε = 1 against ε = ∞."""
    parts = []
    for label in ("FedAvg", "FedAvg+FT", "Local", "SFL*", "FLT", "FedSKA"):
        method, key = ROWS[label]
        off = mean(_accuracy(s, key) for s in _runs(setting, "off", None, method))
        low = mean(_accuracy(s, key) for s in _runs(setting, "sample", 1, method))
        high = mean(_accuracy(s, key) for s in _runs(setting, "sample", 8, method))
        if None not in (off, low, high):
            parts.append(f"{label} {num(low, 1)} at ε = 1 and {num(high, 1)} at ε = 8 against "
                         f"{num(off, 1)} without DP")
    text = ("Under DP-SGD (`sample`), mean accuracy: " + "; ".join(parts) + ".") if parts else ""
    client = []
    for label in ("FedAvg", "FedAvg+FT"):
        method, key = ROWS[label]
        low = mean(_accuracy(s, key) for s in _runs(setting, "client", 1, method))
        high = mean(_accuracy(s, key) for s in _runs(setting, "client", 8, method))
        if None not in (low, high):
            client.append(f"{label} {num(low, 1)} at ε = 1 and {num(high, 1)} at ε = 8")
    if client:
        text += " Under client-level DP (`client`): " + "; ".join(client) + "."
    return text


def _setting_block(setting: str) -> str:
    return "\n\n".join(part for part in [
        f"Personalized accuracy (%, {seeds_caption(setting)}; FedAvg and FedAvg+FT: FedAvg's "
        f"global model, before and after the local fine-tuning epoch) on {SETTINGS[setting]}:",
        accuracy_table(setting), _reading(setting), share_table(setting), _released(setting),
        "Noise multiplier each target ran with, and the ε the accountants ended at (the largest "
        "over every client, method and seed; **stops**: clients, or federations, whose target ended "
        "their training early):", budget_table(setting)] if part)


@block("privacy-measured-label-clusters")
def measured_label_clusters(prefix: str) -> str:
    return _setting_block("label-clusters")


@block("privacy-measured-domains")
def measured_domains(prefix: str) -> str:
    return _setting_block("domains")


@block("privacy-measured-cost")
def measured_cost(prefix: str) -> str:
    costs = cost_table()
    return ("Median wall time of a round in seconds (train and evaluate, every client of the "
            "federation in one process on one core), without DP and with it, and in brackets the "
            "ratio to the run without DP, taken per pair (same method, setting and seed, both runs "
            "made by the same command one after the other) and averaged over the seeds. A run whose target "
            "stopped or withheld training early (the federation's under `client`, any client's "
            "under `sample`) is left out (its later rounds train less, or nothing); "
            f"**{STOPPED}**: every run was" + (
                f"; **{UNPAIRED}**: the runs were made by another command than the runs without DP "
                "(at another time, on a shared machine), so their time is shown without a ratio" if UNPAIRED in costs
                else "") + ".\n\n" + costs
            + "\n\nThe commands that made the runs:\n\n" + commands())


@block("privacy-accountant-cost")
def accountant_cost(prefix: str) -> str:
    """The accountant's cache, measured (`python -m benchmarks.studies.privacy_accountant`,
    benchmarks/results/privacy-accountant.json): the medians of the paired runs' seconds per round,
    before (a fresh Opacus accountant per call) and cached, and the median of the pairs' ratios."""
    import statistics

    result = raw("privacy-accountant")
    rows = result["rows"]
    before = statistics.median(r["opacus-seconds-per-round"] for r in rows)
    after = statistics.median(r["cached-seconds-per-round"] for r in rows)
    ratio = statistics.median(r["ratio"] for r in rows)
    settings = result["settings"]
    return (f"Measured on {settings['method']}'s {settings['partition']} `dp = \"sample\"` cell with "
            f"target ε = {settings['dp-target-epsilon']:g} ({settings['num-clients']} clients, "
            f"{settings['num-rounds']} rounds, σ = {settings['dp-noise-multiplier']:g}), "
            f"{len(rows)} pairs of runs, each a fresh process, in turn: a round takes a median "
            f"{num(before)} s with ε from a fresh Opacus accountant at every call and {num(after)} s "
            f"with the cache, {times(ratio)} less (the median of the pairs' ratios); both report the "
            "same ε every round and the same final metrics (the study stops otherwise). Command: "
            f"`{result['command']}`.")
