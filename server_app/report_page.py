"""`report.html`: one self-contained page per run (and per comparison) that a person can open offline.

A run's page shows the summary table, the line that puts it beside other methods (the committed
reference comparison when the run has its settings, else the command that measures one), the
accuracy curves, the per-client table (scrolls inside the page when it is wider or longer than
it), every picture the method wrote in the run's folder (learned graphs, UMAP, domain adjacency, ...,
each captioned with what it shows: a method writes that into the PNG, `save_matrix(caption=...)`)
and the settings that apply to the run (`settings_that_apply`: the common keys its data, partition
and method use, and its method's own section). Every quantity has one unit: accuracies and MAPE in percent everywhere (clients.csv
stores fractions; the page shows them ×100). The
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

from server_app.run_values import method_settings
from strategies.shared import registry
from server_app.summary_table import display_value, summary_rows

REPORT_NAME = "report.html"
# Pictures a run writes, in the order and with the caption the page gives them; any other PNG in the
# run's folder follows with its file name as caption.
CAPTIONS = {
    "accuracy.png": "Accuracy per round (regression: MAE per round)",
    "graph.png": "Client graph the method used",
    "thresholded-graph.png": "Thresholded client graph",
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
figure { max-width: calc(50% - 1.5em); }  /* two pictures side by side */
figcaption { font-size: .9em; color: #555; } img { max-width: 100%; }
.scroll { max-width: 100%; max-height: 36em; overflow: auto; margin: .5em 0; }
.scroll table { margin: 0; } .scroll thead th { position: sticky; top: 0; background: #fafafa; }
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
    """A <figure> with the PNG at `path` inlined as a data URI; `caption`, followed by the
    description the picture carries (`picture_description`) when it has one."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    described = picture_description(path)
    text = f"<b>{_e(caption)}</b>" + (f": {_e(described)}" if described else "")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{_e(path.name)}" '
            f'data-file="{_e(path.name)}"><figcaption>{text}</figcaption></figure>')


def picture_description(path: Path) -> str:
    """The `Description` text a PNG carries (written by `save_matrix(caption=...)`), or ''."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return str(getattr(image, "text", {}).get("Description", "")).strip()
    except OSError:
        return ""


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


def percent_columns(header: Sequence[str]) -> set[int]:
    """Indices of the clients.csv columns that hold fractions in [0, 1] (`accuracy`,
    `global-accuracy`, `mape`, ...): shown in percent like every other accuracy."""
    return {i for i, name in enumerate(header) if name.endswith(("accuracy", "mape"))}


def client_rows(header: Sequence[str], rows: Iterable[Sequence[str]]) -> tuple[list[str], list[list[Any]]]:
    """clients.csv as shown: fraction columns ×100 with `(%)` in their heading."""
    percent = percent_columns(header)
    shown_header = [f"{name} (%)" if i in percent else name for i, name in enumerate(header)]
    shown = []
    for row in rows:
        values = [_number(v) for v in row]
        shown.append([100.0 * v if i in percent and isinstance(v, (int, float)) else v
                      for i, v in enumerate(values)])
    return shown_header, shown


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
def write_run_report(directory: Path, comparison: str = "") -> Path:
    """Write `<directory>/report.html` from the files the run wrote there; returns its path.
    `comparison`: the lines that put the run beside other methods
    (`server_app.reporting.comparison_hint`), shown under the summary."""
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
    if comparison.strip():
        sections.append(f'<pre class="comparison">{_e(comparison.strip())}</pre>')
    pictures = _pictures(directory)
    if pictures:
        figures = "\n".join(embedded_figure(p, CAPTIONS.get(p.name, p.stem)) for p in pictures)
        sections.append(_section("Curves and graphs", figures + _series_links(directory)))
    sections.append(_section("Per round", _rounds_table(rounds)))
    clients = directory / "clients.csv"
    if clients.exists():
        with clients.open(newline="") as handle:
            reader = csv.reader(handle)
            header, shown = client_rows(next(reader, []), reader)
            sections.append(_section("Per client (final round)",
                                     f'<div class="scroll">{html_table(header, shown)}</div>'))
    method_block = {k: v for k, v in summary.items() if isinstance(v, dict)
                    and k not in ("final", "round-0")}
    if method_block:
        sections.append(_section("Method details (summary.json)",
                                 f"<pre>{_e(json.dumps(method_block, indent=2))}</pre>"))
    settings = settings_that_apply(config, summary["method"])
    sections.append(_section(
        f"Settings of this run ({len(settings)} of the {len(config)} keys in config.json: those that "
        f"apply to its data, partition and method, and {summary['method']}'s own)",
        html_table(("key", "value"), sorted(settings.items()))))
    path = directory / REPORT_NAME
    path.write_text(page(f"Bouquet run {directory.name}", sections), encoding="utf-8")
    return path


# Common keys that apply only under some settings: key (or key prefix ending in '-') → when it applies,
# as a test of the run's flat config and its registered method. Every other common key always applies.
def _method(config: dict[str, Any]) -> Any:
    return registry.METHODS.get(config.get("method", ""))


def _partition(*schemes: str):
    return lambda config: config.get("partition") in schemes


def _domain_family(family: str):
    return lambda config: (config.get("partition") == "domains"
                           and config.get("domain-family", "rotations") == family)


def _regression(config: dict[str, Any]) -> bool:
    from datasets.sources import dataset_task

    try:
        return dataset_task(config.get("dataset", "")) == "regression"
    except (KeyError, ValueError):
        return False


def _safeguard_method(config: dict[str, Any]) -> bool:
    method = _method(config)
    return bool(method is not None and method.safeguard)


CONDITIONAL_KEYS = {
    "shards-per-client": _partition("shards"),
    "dirichlet-alpha": _partition("dirichlet"),
    "num-clusters": _partition("label-clusters"),
    "labels-per-cluster": _partition("label-clusters"),
    "power-law": _partition("label-clusters"),
    "domain-rotations": _domain_family("rotations"),
    "domain-unseen-rotations": _domain_family("rotations"),
    "domain-styles": _domain_family("styles"),
    "domain-unseen-styles": _domain_family("styles"),
    "domain-": _partition("domains"),  # domain-test-clients, domain-family
    "domains-per-client": _partition("domains"),
    "traffic-days": _regression,
    "safeguard": _safeguard_method,
    "safeguard-": lambda c: _safeguard_method(c) and c.get("safeguard") != "off",
    "aggregation": lambda c: bool(_method(c) is not None and _method(c).robust),
    "trim-fraction": lambda c: bool(_method(c) is not None and _method(c).robust
                                    and c.get("aggregation") == "trimmed-mean"),
}


def _applies(key: str, config: dict[str, Any]) -> bool:
    """Whether a common key applies to the run: the exact entry of CONDITIONAL_KEYS, else the longest
    prefix entry, else always."""
    if key in CONDITIONAL_KEYS:
        return CONDITIONAL_KEYS[key](config)
    prefixes = [p for p in CONDITIONAL_KEYS if p.endswith("-") and key.startswith(p)]
    return CONDITIONAL_KEYS[max(prefixes, key=len)](config) if prefixes else True


def settings_that_apply(config: dict[str, Any], method: str) -> dict[str, Any]:
    """The flat run-config keys that apply to the run: its method's own section
    (`run_values.method_settings`) and the common keys its data, partition and method use (no
    `domain-*` keys unless the partition is 'domains', no `safeguard*` keys for a method without
    the safeguard, no `aggregation` for a method that aggregates over a graph, ...)."""
    config = {**config, "method": config.get("method", method)}
    return {key: value for key, value in method_settings(config, method).items()
            if "." in key or _applies(key, config)}


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
