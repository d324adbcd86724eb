"""The server's half of the safeguard's purely local candidate (client_app/local_candidate.py): pool
what the clients' held-out slices say about their local models.

At each evaluation a client with a local model reports the summed per-sample gains of that model over
the model it would answer with otherwise, and their squares. One client's slice of a few dozen
samples rarely shows a gain of a few points; summed over the federation's clients it does.
`LocalEvidence.pool` sums the last evaluation's reports and sets `favoured`: the pooled gains are
`margin` standard errors above zero (`clearly_better`, the safeguard's own test). While favoured, the
next requests tell the clients (`SafeguardInstructions.local`) that the local model is the reference
they leave only on their own clear evidence; otherwise the other answer is. Each evaluation's reports
replace the last ones, so the decision follows the models as they train (as the federation's mixing
weight does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from strategies.shared.evidence import clearly_better


@dataclass
class LocalEvidence:
    """The federation's pooled held-out evidence on the clients' local models (module doc)."""

    favoured: bool = False  # whether the last evaluation's pooled gains favour the local models
    gain: float = 0.0  # Σ of the last evaluation's reported gains
    square: float = 0.0  # Σ of their squares
    answered: int = 0  # how many clients answered with their local model at the last evaluation

    @property
    def statistic(self) -> float | None:
        """The pooled gains in standard errors (None without a report)."""
        return self.gain / math.sqrt(self.square) if self.square > 0.0 else None

    def pool(self, reports: Sequence[tuple[float, float, float]], margin: float) -> bool:
        """Pool one evaluation's reports (gain, square, answered with the local model: 0 / 1);
        False (nothing changed) without any."""
        rows = [(g, s, a) for g, s, a in reports
                if math.isfinite(g) and math.isfinite(s) and s >= 0.0]
        if not rows:
            return False
        self.gain = float(sum(g for g, _, _ in rows))
        self.square = float(sum(s for _, s, _ in rows))
        self.answered = int(sum(a for _, _, a in rows))
        self.favoured = clearly_better(self.gain, self.square, margin) if margin > 0.0 else self.gain > 0.0
        return True
