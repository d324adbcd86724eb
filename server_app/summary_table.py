"""The run summary as labelled rows: the console table a run ends with and the table of report.html."""

from __future__ import annotations

from typing import Any


def console_table(summary: dict[str, Any]) -> str:
    """A short table of the final round for the console."""
    title, rows = summary_rows(summary)
    width = max(len(name) for name, _ in rows)
    return "\n".join([title] + [f"  {name:<{width}}  {display_value(value)}" for name, value in rows])


def summary_rows(summary: dict[str, Any]) -> tuple[str, list[tuple[str, Any]]]:
    """The title and the (name, value) rows of a run's summary table (console and report.html);
    rows without a value are left out."""
    final = summary["final"]
    if "regression" in final:
        return _regression_rows(summary)
    pers = final.get("personalized") or {}
    rows = [
        ("method", summary["method"]),
        ("rounds", summary["rounds"]),
        ("personalized mean (%)", pers.get("mean")),
        ("personalized std", pers.get("std")),
        ("best 5% / worst 5% (%)", _pair(pers.get("best-5%"), pers.get("worst-5%"))),
        ("global accuracy (%)", final.get("global-accuracy")),
        ("global + local epochs (%)", (final.get("finetuned") or {}).get("mean")),
    ]
    return _with_costs("Bouquet run summary", rows, summary)


def _regression_rows(summary: dict[str, Any]) -> tuple[str, list[tuple[str, Any]]]:
    """The summary rows of a regression (traffic) run: errors averaged over clients."""
    final = summary["final"]
    reg = final["regression"]
    rows = [
        ("method", summary["method"]),
        ("rounds", summary["rounds"]),
        ("MAE / MAPE (%) / RMSE", _triple(reg)),
        ("same at horizon 12 (60 min)", _triple(reg, "-h12")),
        ("MAE best 5% / worst 5%", _pair(reg.get("best-5%-mae"), reg.get("worst-5%-mae"))),
        ("global model MAE / MAPE / RMSE", _triple(final.get("global-regression"))),
        ("global + local epochs MAE / MAPE / RMSE", _triple(final.get("finetuned-regression"))),
    ]
    return _with_costs("Bouquet run summary (regression: errors averaged over clients)", rows, summary)


def _with_costs(title: str, rows: list[tuple[str, Any]],
                summary: dict[str, Any]) -> tuple[str, list[tuple[str, Any]]]:
    """The title and the rows that have a value, ending with the cost rows every run has."""
    rows = rows + [
        ("bytes/round (down+up)", summary.get("bytes-per-round")),
        ("s/round (median)", summary.get("seconds-per-round")),
    ]
    return title, [(name, value) for name, value in rows if value is not None]


def _triple(errors: dict[str, float] | None, suffix: str = "") -> str | None:
    keys = [f"mae{suffix}", f"mape{suffix}", f"rmse{suffix}"]
    if not errors or any(key not in errors for key in keys):
        return None
    mae, mape, rmse = (errors[key] for key in keys)
    return f"{mae:.3f} / {mape:.2f} / {rmse:.3f}"


def _pair(a: float | None, b: float | None) -> str | None:
    return None if a is None or b is None else f"{a:.2f} / {b:.2f}"


def display_value(value: Any) -> str:
    """A summary value as the console and report.html show it."""
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, int) and value >= 10_000:
        return f"{value:,}"
    return str(value)
