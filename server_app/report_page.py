"""`report.html`: one self-contained page per run (and per comparison) that a person can open offline.

A run's page shows the summary table, the accuracy curves, the per-client table, every picture the
method wrote in the run's folder (learned graphs, UMAP, domain adjacency, ...) and the settings. The
pictures are embedded as base64 PNG, so the page needs no network and survives being copied alone;
only bulky per-round picture series in subfolders (e.g. FedSKA's `graphs/round-*.png`) are linked
relatively.
"""

from __future__ import annotations

import base64
import csv
import html
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from server_app.summary_table import display_value, summary_rows

REPORT_NAME = "report.html"
# Pictures a run writes, in the order and with the caption the page gives them; any other PNG in the
# run's folder follows with its file name as caption.
CAPTIONS = {
    "accuracy.png": "Accuracy per round (regression: MAE per round)",
    "graph.png": "Client graph the method used",
    "prior-graph.png": "Prior client graph",
    "learned-graph.png": "Learned client graph",
    "cluster-graph.png": "Cluster graph (one model per cluster)",
    "distance.png": "Client distances",
    "umap.png": "UMAP of the clients' centroids",
    "adjacency.png": "Domain adjacency (final)",
    "adjacency-rounds.png": "Domain adjacency per round",
    "fedcg.png": "FedCG domains",
}
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; font-size: .9em; }
td, th { border: 1px solid #ccc; padding: .2em .6em; text-align: right; }
td:first-child, th:first-child { text-align: left; }
figure { display: inline-block; margin: .5em 1em .5em 0; vertical-align: top; }
figcaption { font-size: .9em; color: #555; } img { max-width: 100%; }
pre, code { background: #f5f5f5; padding: .1em .3em; } pre { padding: .6em; overflow-x: auto; }
"""


# --- building blocks ------------------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape(str(value))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def html_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def embedded_figure(path: Path, caption: str) -> str:
    """A <figure> with the PNG at `path` inlined as a data URI."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{_e(path.name)}" '
            f'data-file="{_e(path.name)}"><figcaption>{_e(caption)}</figcaption></figure>')


def page(title: str, sections: Iterable[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{_e(title)}</h1>" + "\n".join(sections) + "</body></html>\n")


def _section(heading: str, body: str) -> str:
    return f"<h2>{_e(heading)}</h2>\n{body}"


def _pictures(directory: Path) -> list[Path]:
    """The run folder's PNGs: known ones first in CAPTIONS order, then the rest by name."""
    found = {p.name: p for p in directory.glob("*.png")}
    known = [found.pop(name) for name in CAPTIONS if name in found]
    return known + [found[name] for name in sorted(found)]


def _series_links(directory: Path) -> str:
    """Relative links to picture series in subfolders (too many to embed)."""
    items = []
    for folder in sorted(p for p in directory.iterdir() if p.is_dir() and p.name != "checkpoints"):
        pictures = sorted(folder.glob("*.png"))
        if pictures:
            links = " ".join(f'<a href="{_e(folder.name)}/{_e(p.name)}">{_e(p.stem)}</a>'
                             for p in pictures)
            items.append(f"<p><code>{_e(folder.name)}/</code> ({len(pictures)} pictures): {links}</p>")
    return "\n".join(items)


# --- a run ----------------------------------------------------------------------------------------
def write_run_report(directory: Path) -> Path:
    """Write `<directory>/report.html` from the files the run wrote there; returns its path."""
    summary = json.loads((directory / "summary.json").read_text())
    config = json.loads((directory / "config.json").read_text())
    rounds = [json.loads(line) for line in (directory / "rounds.jsonl").read_text().splitlines()
              if line.strip()]
    title, rows = summary_rows(summary)
    sections = [
        f"<p>Method <b>{_e(summary['method'])}</b> on {_e(summary['dataset'])}, partition "
        f"<code>{_e(summary['partition'])}</code>, {_e(summary['num-clients'])} clients, "
        f"{_e(summary['rounds'])} rounds. Folder: <code>{_e(directory.resolve())}</code></p>",
        _section(title, html_table(("", "value"), ((name, display_value(v)) for name, v in rows))),
    ]
    pictures = _pictures(directory)
    if pictures:
        figures = "\n".join(embedded_figure(p, CAPTIONS.get(p.name, p.stem)) for p in pictures)
        sections.append(_section("Curves and graphs", figures + _series_links(directory)))
    sections.append(_section("Per round", _rounds_table(rounds)))
    clients = directory / "clients.csv"
    if clients.exists():
        with clients.open(newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            sections.append(_section("Per client (final round)",
                                     html_table(header, [[_number(v) for v in row] for row in reader])))
    method_block = {k: v for k, v in summary.items() if isinstance(v, dict)
                    and k not in ("final", "round-0")}
    if method_block:
        sections.append(_section("Method details (summary.json)",
                                 f"<pre>{_e(json.dumps(method_block, indent=2))}</pre>"))
    sections.append(_section("Settings (config.json)",
                             html_table(("key", "value"), sorted(config.items()))))
    path = directory / REPORT_NAME
    path.write_text(page(f"Bouquet run {directory.name}", sections), encoding="utf-8")
    return path


def _number(text: str) -> Any:
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text else value


def _rounds_table(rounds: list[dict[str, Any]]) -> str:
    def get(record: dict[str, Any], *path: str) -> Any:
        for key in path:
            record = record.get(key) if isinstance(record, dict) else None
        return "" if record is None else record

    regression = any("regression" in r for r in rounds)
    if regression:
        header = ("round", "seconds", "MAE", "worst 5% MAE", "global MAE")
        keys = (("regression", "mae"), ("regression", "worst-5%-mae"), ("global-regression", "mae"))
    else:
        header = ("round", "seconds", "personalized mean (%)", "worst 5% (%)", "global (%)",
                  "global + local epochs (%)")
        keys = (("personalized", "mean"), ("personalized", "worst-5%"), ("global-accuracy",),
                ("finetuned", "mean"))
    rows = [[r["round"], get(r, "seconds"), *(get(r, *k) for k in keys)] for r in rounds]
    return html_table(header, rows)


# --- a comparison ---------------------------------------------------------------------------------
def write_comparison_report(path: Path, name: str, command: str, header: Sequence[str],
                            rows: Sequence[Sequence[Any]], picture: Path,
                            run_reports: dict[str, Path], notes: str = "") -> Path:
    """A comparison's page: its command, the table, the curves and links to each method's report
    (relative to `path`)."""
    links = " · ".join(
        f'<a href="{_e(report.resolve().relative_to(path.parent.resolve()).as_posix())}">{_e(m)}</a>'
        for m, report in run_reports.items() if report.exists())
    sections = [
        f"<p>Produced by</p><pre>{_e(command)}</pre>" + (f"<p>{_e(notes)}</p>" if notes else ""),
        _section("Results", html_table(header, rows)),
        _section("Curves", embedded_figure(picture, "per round, one line per method")),
    ]
    if links:
        sections.append(_section("Each method's run report", f"<p>{links}</p>"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(f"Bouquet comparison {name}", sections), encoding="utf-8")
    return path
