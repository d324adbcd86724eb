"""The shape of a committed result, as both sides read it: the docs render results with these and
the benchmarks write their Markdown with them (benchmarks import this module, never the reverse).

- `markdown_table`: every results table;
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
