"""docs/benchmarks.md, Timings: `flwr run` speed of Bouquet against Flower's minimal app and in process
(`benchmarks/studies/flwr_run_speed.py`)."""

from __future__ import annotations

import statistics

from docs.blocks import block
from docs.blocks.data import num, raw, table, times

FLWR_RUN = "flwr-run-speed"
LABELS = {
    "bouquet": "Bouquet, `flwr run` (defaults)",
    "bouquet-threads": "Bouquet, `flwr run`, client-threads={threads}",
    "flower": "Flower's minimal app, `flwr run`",
    "in-process": "Bouquet in process (`simulate`)",
}


def _ratios(rows: list[dict], side: str) -> list[float]:
    """Per pair: `side`'s wall time over the minimal app's."""
    out = []
    for pair in sorted({r["pair"] for r in rows}):
        a = [r["wall"] for r in rows if r["pair"] == pair and r["side"] == side]
        b = [r["wall"] for r in rows if r["pair"] == pair and r["side"] == "flower"]
        if a and b:
            out.append(a[0] / b[0])
    return out


@block("flwr-run-speed")
def flwr_run_speed(prefix: str) -> str:
    data = raw(FLWR_RUN)
    rows, args = data["rows"], data["args"]
    body = []
    for side, label in LABELS.items():
        mine = [r for r in rows if r["side"] == side]
        if not mine:
            continue
        ratios = _ratios(rows, side)
        body.append((
            label.format(threads=args.get("threads_variant")),
            num(statistics.median(r["wall"] for r in mine), 1),
            num(statistics.median(statistics.median(r["seconds"]) for r in mine)),
            num(statistics.median(r["outside-rounds"] for r in mine), 1),
            "1" if side == "flower" else times(statistics.median(ratios), 2) if ratios else "",
        ))
    loads = [r["load-before"] for r in rows]
    return (
        f"{args['clients']} simulated SuperNodes, {args['rounds']} rounds, digits, CNN, "
        f"{args['samples']} samples per client, no fine-tuning; {args['pairs']} pairs run back to "
        f"back ({data['date']}, load average {num(min(loads), 1)}–{num(max(loads), 1)} on "
        f"{data['machine']['cores']} cores), medians ([`{FLWR_RUN}`]({prefix}results/{FLWR_RUN}.md)):"
        "\n\n"
        + table(("run", "wall s", "s/round", "outside the rounds s", "wall / minimal app's"), body)
    )
