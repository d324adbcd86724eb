"""The pages of a `benchmarks.suite` result (kind `suite`, `docs.results`: a `suite.json`, one row per
setting, ρ, seed and method label): the per-setting tables and the Δ matrix, from the result file
alone. `python -m benchmarks.suite` writes its Markdown with these; the docs render the committed
`suite.json` with them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from docs.render import GRAPH_METHODS, baselines_of as _baselines_of, markdown_table
from docs.results.compare import DASH


def cell_name(setting: str, rho: float, seed: int, suffix: str = "") -> str:
    return f"{setting}-rho{rho:g}-seed{seed}{suffix}"


@dataclass
class CellResult:
    """One run of one method in one cell (setting, ρ, seed)."""

    setting: str
    rho: float
    seed: int
    label: str  # method, or e.g. "ifca (C=2)"
    method: str
    mean: float | None
    worst: float | None
    curve: list[tuple[int, float]]
    cumulative_bytes: list[tuple[float, float]]
    share: list[float | None]
    share_kind: str
    wall_seconds: float


# --- tables -------------------------------------------------------------------------------------
def _stats(values: list[float | None]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return float(np.mean(values)), (float(np.std(values)) if len(values) > 1 else None)


def _fmt(mean: float | None, std: float | None = None, signed: bool = False) -> str:
    if mean is None:
        return DASH
    text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return text + (f" ± {std:.2f}" if std is not None else "")


def _labels(results: list[CellResult]) -> list[str]:
    seen: list[str] = []
    for r in results:
        if r.label not in seen:
            seen.append(r.label)
    return seen


def _select(results: list[CellResult], setting: str, rho: float, label: str) -> list[CellResult]:
    return [r for r in results if r.setting == setting and r.rho == rho and r.label == label]


def delta_vs_baselines(results: list[CellResult], setting: str, rho: float,
                       label: str) -> float | None:
    """Seed-mean of (method mean − max(FedAvg, FedAvg+FT, Local means)) of the same seed's cell, the
    baselines run with the same model (the conv-model runs against the conv-model baselines)."""
    deltas = []
    baselines = _baselines_of(label)
    for r in _select(results, setting, rho, label):
        base = [b.mean for b in results if b.setting == setting and b.rho == rho
                and b.seed == r.seed and b.label in baselines and b.mean is not None]
        if r.mean is not None and base:
            deltas.append(r.mean - max(base))
    return float(np.mean(deltas)) if deltas else None


def final_share(results: list[CellResult]) -> tuple[float | None, str]:
    """Seed-mean of the last round's share inside the true structure, and its kind."""
    last = [r.share[-1] for r in results if r.share and r.share[-1] is not None]
    kind = next((r.share_kind for r in results if r.share_kind), "")
    return (float(np.mean(last)) if last else None), kind


def setting_table(results: list[CellResult], setting: Any, rhos: Sequence[float],
                  seeds: Sequence[int], header: list[str], rounds: int) -> str:
    """`suite-<setting>.md`: mean / worst 5% / Δ vs max(FedAvg, FedAvg+FT, Local) per method and ρ;
    `setting`: the grid's setting (its `name`, `title` and `true_clusters`), `rounds`: the runs'
    num-rounds."""
    lines = [*header, "", f"## {setting.title}", "",
             f"Personalized accuracy (%) after round {rounds}, mean over seeds "
             f"{', '.join(map(str, seeds))}" + (" (± std over seeds)" if len(seeds) > 1 else "")
             + ". **worst 5%**: mean of the ⌈5%·K⌉ worst clients. **Δ**: mean − max(FedAvg, "
             "FedAvg+FT, Local) of the same seed, in points. **+FT**: the model after "
             "finetune-epochs local epochs (FedAvg: its global model). **share**: the learned graph's off-diagonal weight "
             "inside the true structure in the last round (sfl-star, fedska).", ""]
    columns = ["method"]
    for rho in rhos:
        columns += [f"ρ={rho:g} mean", f"ρ={rho:g} worst 5%", f"ρ={rho:g} Δ", f"ρ={rho:g} share"]
    mine = [r for r in results if r.setting == setting.name]
    rows = []
    for label in _labels(mine):
        row = [label]
        for rho in rhos:
            cells = _select(mine, setting.name, rho, label)
            share, kind = final_share(cells)
            row += [_fmt(*_stats([c.mean for c in cells])), _fmt(*_stats([c.worst for c in cells])),
                    _fmt(delta_vs_baselines(mine, setting.name, rho, label), signed=True),
                    f"{share:.2f} ({kind})" if share is not None else DASH]
        rows.append(row)
    lines += [*markdown_table(columns, "l" + "r" * (len(columns) - 1), rows), ""]
    for rho in rhos:
        lines.append(f"![personalized mean accuracy per round, ρ={rho:g}]"
                     f"({cell_name(setting.name, rho, seeds[0])}.png)")
    if setting.true_clusters:
        lines += [""] + [f"![accuracy vs cumulative bytes, ρ={rho:g}]"
                         f"(suite-bytes-{setting.name}-rho{rho:g}.png)" for rho in rhos]
    lines.append("")
    return "\n".join(lines)


def delta_matrix(results: list[CellResult], settings: Sequence[Any], rhos: Sequence[float],
                 header: list[str]) -> str:
    """`suite-delta.md`: method × cell, mean − max(FedAvg, FedAvg+FT, Local) in points (seed
    means); `settings`: setting names, or the grid's settings (their `name`)."""
    cells = [(getattr(s, "name", s), rho) for s in settings for rho in rhos]
    columns = ["method"] + [f"{s} ρ={rho:g}" for s, rho in cells]
    lines = [*header, "", "## Δ vs max(FedAvg, FedAvg+FT, Local)", "",
             "Mean personalized accuracy minus the best of FedAvg, FedAvg+FT (its global model after "
             "finetune-epochs local epochs) and Local on the same cell and seed, in points, averaged "
             "over the seeds (a baseline missing from a run is left out of its max). Graph methods: " + ", ".join(GRAPH_METHODS)
             + ".", ""]
    rows = [[label] + [_fmt(delta_vs_baselines(results, s, rho, label), signed=True)
                       for s, rho in cells]
            for label in _labels(results) if label not in _baselines_of(label)]
    lines += [*markdown_table(columns, "l" + "r" * (len(columns) - 1), rows), ""]
    return "\n".join(lines)


def load_results(path: Path) -> list[CellResult]:
    """The cell results a `suite.json` holds."""
    results = []
    for item in json.loads(path.read_text())["results"]:
        item["curve"] = [tuple(p) for p in item["curve"]]
        item["cumulative_bytes"] = [tuple(p) for p in item["cumulative_bytes"]]
        results.append(CellResult(**item))
    return results


def delta_table(path: Path) -> str:
    """The Δ matrix (method × cell, as in `suite-delta.md`) of the suite.json at `path`."""
    stored = json.loads(path.read_text())
    text = delta_matrix(load_results(path), stored["settings"], stored["rhos"], [])
    return "\n".join(line for line in text.splitlines() if line.startswith("|"))
