"""The shape of a committed result, as both sides read it: the docs render results with these and
the benchmarks write their Markdown with them (benchmarks import this module, never the reverse).

- `markdown_table`: every results table;
- `provenance` / `versions_line`: the head of every results page (the command that produced it, its
  date, code and machine, from the result file's `command`, `date`, `code` and `machine`);
- the robustness suite's row labels in a `suite.json`: `BASELINES` (what a Δ is taken against),
  the `FT` and `CONV` label suffixes, `baselines_of(label)` and `GRAPH_METHODS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

ALIGNMENTS = {"l": "---", "r": "---:", "c": ":---:"}


def markdown_table(headers: Sequence[str], align: str, rows: Iterable[Sequence[Any]]) -> list[str]:
    """The lines of a Markdown table: the header row, the separator row and one line per row.

    `align` has one letter per column: `l` left (`---`), `r` right (`---:`), `c` centred (`:---:`).
    A cell is `str(cell)` between single spaces, written as it is (escape a `|` in it yourself);
    None leaves the cell blank (`| |`), an empty string is an empty value (`|  |`)."""
    if len(align) != len(headers) or any(letter not in ALIGNMENTS for letter in align):
        raise ValueError(f"markdown_table: align {align!r} must have one of "
                         f"{'/'.join(ALIGNMENTS)} per column ({len(headers)} columns)")
    lines = [_table_row(headers), "|" + "|".join(ALIGNMENTS[letter] for letter in align) + "|"]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"markdown_table: a row has {len(row)} cells, the header "
                             f"{len(headers)}: {list(row)!r}")
        lines.append(_table_row(row))
    return lines


def _table_row(cells: Sequence[Any]) -> str:
    return "|" + "|".join(" " if cell is None else f" {cell} " for cell in cells) + "|"


# --- the head of a results page ---------------------------------------------------------------------
def provenance(meta: dict[str, Any], title: str, machine_note: str = "") -> list[str]:
    """The head of a results file: title, the command that produced it, date, code and machine."""
    m = meta["machine"]
    return [
        title,
        "",
        "Produced by",
        "",
        "```",
        meta["command"],
        "```",
        "",
        f"- date: {meta['date']}; code: commit {meta['code'].get('commit', '?')}"
        + (" (with local changes)" if meta["code"].get("local-changes") else "")
        + f", fingerprint {meta['code']['code-fingerprint']}",
        f"- machine: {m['cpu']}, {m['cores']} cores (torch threads {m['torch-threads']}), "
        f"torch {m['torch']}, flwr {m['flwr']}, Python {m['python']}{machine_note}",
        *versions_line(m),
    ]


def versions_line(machine: dict[str, Any]) -> list[str]:
    """The libraries and CPU kernels line of a results file (absent in files written before they were
    recorded)."""
    if "libraries" not in machine:
        return []
    libraries = ", ".join(f"{name} {v}" for name, v in machine["libraries"].items())
    kernels = machine.get("cpu-kernels", {})
    return [f"- libraries: {libraries}; CPU kernels: {kernels.get('mode', '?')} "
            f"(torch {kernels.get('torch-cpu-capability', '?')})"]


# --- the robustness suite's row labels (suite.json) -------------------------------------------------
BASELINES = ("fedavg", "fedavg+FT", "local")
FT = "+FT"  # label suffix of a method's "used model + finetune-epochs local epochs" row
CONV = " (cnn)"  # label suffix of the domains setting's conv-model runs (FedCG and its baselines)
# the methods whose rows a suite `--merge DIR::SUFFIX` relabels and whose "+FT" row is their own model
GRAPH_METHODS = ("flt", "sfl", "sfl-star", "fedska", "fedu")


def baselines_of(label: str) -> tuple[str, ...]:
    """The rows a suite row's Δ is taken against: max(FedAvg, FedAvg+FT, Local) run with the same
    model (the `(cnn)` rows against the `(cnn)` baselines)."""
    suffix = CONV if label.endswith(CONV) else ""
    return tuple(b.replace(FT, suffix + FT) if b.endswith(FT) else b + suffix for b in BASELINES)
