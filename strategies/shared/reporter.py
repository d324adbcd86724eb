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


def save_matrix(directory: Path, name: str, matrix: np.ndarray, *, order: np.ndarray | None = None,
                title: str = "", labels: str = "client") -> None:
    """Save a square matrix (a client or domain graph) as `<name>.npy` plus a heatmap PNG.

    `order` permutes rows and columns of the picture only (e.g. clients grouped by cluster); the
    .npy keeps the original order.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matrix = np.asarray(matrix, dtype=np.float64)
    np.save(directory / f"{name}.npy", matrix)
    shown = matrix if order is None else matrix[np.ix_(order, order)]
    fig, ax = plt.subplots(figsize=(5, 4.4))
    image = ax.imshow(shown, cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046)
    ax.set_title(title or name)
    suffix = " (reordered)" if order is not None else ""
    ax.set_xlabel(labels + suffix)
    ax.set_ylabel(labels + suffix)
    fig.tight_layout()
    fig.savefig(directory / f"{name}.png", dpi=120)
    plt.close(fig)
