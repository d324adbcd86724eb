"""What a method reports beyond the common metrics, and how: `MethodReporter`, the base of every
strategy's reporting (no-op by default), and `save_matrix`, the graph heatmaps it writes.

The runner merges `round_report` into each round's line of rounds.jsonl and `report` into
summary.json; the strategy saves its graphs (`graph.npy` + PNG, ...) in the run directory there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from datasets.partition import Partition


class MethodReporter:
    """Per-method reporting hooks; override what the method has to say."""

    def round_report(self, server_round: int) -> dict[str, Any]:
        """Fields merged into round `server_round`'s record (graph quality, losses, histograms)."""
        return {}

    def report(self, directory: Path, truth: Partition | None) -> dict[str, Any]:
        """Fields merged into summary.json; may save figures and arrays into `directory`. `truth`:
        the partition's ground truth when the server can rebuild it (reporting only)."""
        return {}

    def client_graph(self) -> np.ndarray | None:
        """The client graph the method aggregates over now (N×N), or None when it has none; the
        TensorBoard log draws it whenever it changes."""
        return None


def colour_range(matrix: np.ndarray) -> tuple[float, float]:
    """The colour scale (vmin, vmax) of a matrix heatmap: its own range; a constant matrix c gets
    [min(0, c), max(0, c)] ([0, 1] for c = 0), so its one colour says where c lies (the top of the
    scale for a positive c, e.g. a complete graph of ones) instead of an arbitrary flat colour."""
    finite = np.asarray(matrix, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    if high > low:
        return low, high
    return (0.0, 1.0) if low == 0.0 else (min(0.0, low), max(0.0, low))


def constant_value(matrix: np.ndarray) -> float | None:
    """The one value of a constant matrix (NaN entries aside), else None."""
    finite = np.asarray(matrix, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(finite[0]) if finite.size and finite.min() == finite.max() else None


def save_matrix(directory: Path, name: str, matrix: np.ndarray, *, order: np.ndarray | None = None,
                title: str = "", labels: str = "client", caption: str = "") -> None:
    """Save a square matrix (a client or domain graph) as `<name>.npy` plus a heatmap PNG.

    `order` permutes rows and columns of the picture only (e.g. clients grouped by cluster); the
    .npy keeps the original order. The colour scale is `colour_range`'s; a constant matrix says its
    value in the title. `caption`: what the picture shows, stored in the PNG (`Description`) for
    report.html to show under it (`server_app.report_page`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matrix = np.asarray(matrix, dtype=np.float64)
    np.save(directory / f"{name}.npy", matrix)
    shown = matrix if order is None else matrix[np.ix_(order, order)]
    low, high = colour_range(shown)
    fig, ax = plt.subplots(figsize=(5, 4.4))
    image = ax.imshow(shown, cmap="viridis", interpolation="nearest", vmin=low, vmax=high)
    fig.colorbar(image, ax=ax, fraction=0.046)
    constant = constant_value(shown)
    ax.set_title((title or name) + ("" if constant is None else f"\n(every entry {constant:g})"))
    suffix = " (reordered)" if order is not None else ""
    ax.set_xlabel(labels + suffix)
    ax.set_ylabel(labels + suffix)
    fig.tight_layout()
    fig.savefig(directory / f"{name}.png", dpi=120,
                metadata={"Description": caption} if caption else None)
    plt.close(fig)
