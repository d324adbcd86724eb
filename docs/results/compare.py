"""The page of a `benchmarks.compare` result (kind `comparison`, `docs.results`): its per-method
table, its text and its per-round plot, from the result file alone. `python -m benchmarks.compare`
writes its Markdown and plot with these; the docs render the committed JSON with them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from docs.render import markdown_table, provenance
from server_app.run_values import format_value

DASH = "—"

COLUMNS = ("method", "mean", "std", "best 5%", "worst 5%", "global acc.", "global+FT mean",
           "MB/round", "s/round")


REGRESSION_COLUMNS = ("method", "MAE", "MAPE (%)", "RMSE", "MAE 60 min", "worst 5% MAE",
                      "global MAE", "global+FT MAE", "MB/round", "s/round")


def is_regression(summaries: list[dict[str, Any]]) -> bool:
    """True when the runs are on a regression data set (traffic): their tables show errors."""
    return any(s.get("task") == "regression" or "regression" in s["final"] for s in summaries)


def columns_for(summaries: list[dict[str, Any]]) -> tuple[str, ...]:
    return REGRESSION_COLUMNS if is_regression(summaries) else COLUMNS


def num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return DASH
    return f"{value:.{digits}f}"


def regression_row(summary: dict[str, Any]) -> list[str]:
    """One row of REGRESSION_COLUMNS: errors of the model each client uses, averaged over clients."""
    final = summary["final"]
    reg = final.get("regression") or {}
    return [
        summary["method"],
        num(reg.get("mae"), 3),
        num(reg.get("mape")),
        num(reg.get("rmse"), 3),
        num(reg.get("mae-h12"), 3),
        num(reg.get("worst-5%-mae"), 3),
        num((final.get("global-regression") or {}).get("mae"), 3),
        num((final.get("finetuned-regression") or {}).get("mae"), 3),
        num(summary["bytes-per-round"] / 1e6 if summary.get("bytes-per-round") else None),
        num(summary.get("seconds-per-round"), 3),
    ]


def table_row(summary: dict[str, Any]) -> list[str]:
    if summary.get("task") == "regression" or "regression" in summary["final"]:
        return regression_row(summary)
    final = summary["final"]
    pers = final.get("personalized") or {}
    return [
        summary["method"],
        num(pers.get("mean")),
        num(pers.get("std")),
        num(pers.get("best-5%")),
        num(pers.get("worst-5%")),
        num(final.get("global-accuracy")),
        num((final.get("finetuned") or {}).get("mean")),
        num(summary["bytes-per-round"] / 1e6 if summary.get("bytes-per-round") else None),
        num(summary.get("seconds-per-round"), 3),
    ]


def summary_table(summaries: list[dict[str, Any]]) -> list[str]:
    """The comparison's table: one row per method (`table_row`), numbers right-aligned."""
    columns = columns_for(summaries)
    return markdown_table(columns, "l" + "r" * (len(columns) - 1),
                          [table_row(summary) for summary in summaries])


def parts_line(meta: dict[str, Any]) -> list[str]:
    """Where the file's methods were run by several commands (`benchmarks.compare --config --methods`
    adding to a cell's file): each command's methods, date and code; the date line above is the last's."""
    if not meta.get("parts"):
        return []
    return ["- run in parts: " + "; ".join(
        f"{', '.join(p['methods'])} on {p['date']} (commit {p['code'].get('commit', '?')}"
        + (" with local changes" if p["code"].get("local-changes") else "") + ")"
        for p in meta["parts"])]


def markdown(meta: dict[str, Any], summaries: list[dict[str, Any]]) -> str:
    s = meta["settings"]
    rounds = s["num-rounds"]
    lines = [
        *provenance(meta, f"# {meta['name']}"),
        *parts_line(meta),
        f"- setting: {s['dataset']}, partition `{s['partition']}`, {s['num-clients']} clients"
        f" on {meta['nodes'] or s['num-clients']} in-process nodes, model `{s['model']}`, "
        f"{rounds} rounds, {s['local-epochs']} local epoch(s), batch {s['batch-size']}, "
        f"lr {s['lr']}, momentum {s['momentum']}, seed {s['seed']}, "
        + (f"traffic-days {s.get('traffic-days') or 'all (traffic-synthetic: 14)'}"
           if s["partition"] == "sensors" else
           f"max-samples-per-client {s['max-samples-per-client'] or 'no cap (all data)'}"),
    ]
    method_keys = [f"{key}={format_value(value)}" for key, value in sorted(s.items())
                   if key.split(".")[0] in meta["methods"] and "." in key]
    if method_keys:
        lines.append(f"- method settings: {', '.join(method_keys)}")
    regression = is_regression(summaries)
    if regression:
        explanation = (
            f"Forecast errors on each client's (sensor's) own test split after round {rounds} (the last "
            "evaluated round), in data units (speed), masked (missing readings skipped), averaged over the "
            "12 horizon steps and then over clients. **MAE / MAPE / RMSE**: the model each client uses "
            "(its personalized model; for global-model methods the global model). **MAE 60 min**: the "
            "last horizon step only. **worst 5% MAE**: mean MAE of the ⌈5%·K⌉ worst clients. **global "
            "MAE**: the global model. **global+FT MAE**: the global model after "
            f"{s['finetune-epochs']} local epoch(s) of fine-tuning on each client. Lower is better. "
        )
    else:
        explanation = (
            f"Accuracies in percent on each client's own test split after round {rounds} "
            "(the last evaluated round). **mean / std / best 5% / worst 5%**: the model each client uses "
            "(its personalized model; for global-model methods the global model). **global acc.**: the "
            "global model on the union of client test splits. **global+FT mean**: the global model after "
            f"{s['finetune-epochs']} local epoch(s) of fine-tuning on each client, mean over clients "
            "(a graph method with the safeguard on: the model the client uses after those epochs). "
        )
    lines += [
        "",
        explanation + "**MB/round**: model bytes down+up summed over all clients, median round. "
        f"**s/round**: median wall time of a round (train + evaluate). {DASH} = the method has no such "
        "model.",
        "",
        *summary_table(summaries),
    ]
    curve = "MAE per round" if regression else "personalized mean accuracy per round"
    lines += [
        "",
        f"![{curve}]({meta['name']}.png)",
        "",
        "<details><summary>All common settings (run config)</summary>",
        "",
        *markdown_table(["key", "value"], "ll",
                        [(key, format_value(value)) for key, value in sorted(s.items())]),
    ]
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def plot_curves(series: list[tuple[str, list[tuple[float, float]]]], path: Path, ylabel: str,
                title: str = "", xlabel: str = "round") -> None:
    """One line per (label, [(x, value), ...]) series, saved as a PNG (x: the round by default)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in series:
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=label)
    if xlabel == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(summaries: list[dict[str, Any]], path: Path, title: str = "") -> None:
    regression = is_regression(summaries)
    key = "mae" if regression else "personalized-mean"
    series = [(summary["method"], [(p["round"], p[key]) for p in summary["curve"] if key in p])
              for summary in summaries]
    plot_curves(series, path, "MAE averaged over clients (lower is better)" if regression
                else "personalized mean accuracy (%)", title)
