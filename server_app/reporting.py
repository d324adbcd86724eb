"""Results of a run in `<output-dir>/<run-name>/`: config.json, rounds.jsonl (one line per round),
clients.csv (final per-client metrics), summary.json, accuracy.png (accuracy per round; for regression
the MAE per round), report.html (server_app/report_page.py) and a console summary table."""

from __future__ import annotations

import csv
import json
import logging
import math
import shlex
from pathlib import Path
from typing import Any

from server_app.summary_table import console_table


log = logging.getLogger("flwr.bouquet")

REFERENCE = "default-job"  # the committed comparison of the default job (README: Quick start)
# its numbers as package data (written by `python -m benchmarks.reference` from the comparison)
REFERENCE_FILE = Path(__file__).with_name("reference.json")
# Keys that name, place or pace a run without changing its numbers (client-matrix-mmap-bytes only
# chooses where the server keeps the per-client matrices: tests/test_client_matrix.py).
RUN_KEYS = frozenset({"method", "run-name", "output-dir", "data-root", "device", "resume",
                      "checkpoint-every", "round-timeout", "client-threads", "eval-every",
                      "client-matrix-mmap-bytes"})
_MISSING = object()

CURVES = (
    ("personalized.mean", "personalized mean"),
    ("personalized.worst-5%", "personalized worst 5%"),
    ("global-accuracy", "global model"),
    ("finetuned.mean", "global + local epochs"),
)
REGRESSION_CURVES = (
    ("regression.mae", "MAE (model each client uses)"),
    ("regression.worst-5%-mae", "worst 5% MAE"),
    ("global-regression.mae", "global model MAE"),
    ("finetuned-regression.mae", "global + local epochs MAE"),
)


def _lookup(record: dict[str, Any], dotted: str) -> Any:
    value: Any = record
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


class RunRecorder:
    """Writes a run's results as it goes; nothing is held back until the end except the plot."""

    def __init__(self, directory: Path, config: dict[str, Any], fresh: bool = True) -> None:
        """`fresh=False` (resume): touch no file until `restore` has the checkpoint's history."""
        self.directory = directory
        self.config = config
        self.rounds_path = directory / "rounds.jsonl"
        self.rounds: list[dict[str, Any]] = []
        if fresh:
            self._start([])

    def _start(self, rounds: list[dict[str, Any]]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "config.json").write_text(json.dumps(self.config, indent=2, sort_keys=True))
        self.rounds = list(rounds)
        self.rounds_path.write_text("".join(json.dumps(r) + "\n" for r in self.rounds))

    state_name = "rounds"

    def state(self) -> dict[str, Any]:
        """The round records so far (a checkpoint's history)."""
        return {"rounds": self.rounds}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue a resumed run: its history is that of the checkpoint (lines a crashed process
        wrote after its last checkpoint are replaced)."""
        self._start(state["rounds"])

    def record_round(self, record: dict[str, Any]) -> None:
        self.rounds.append(record)
        with self.rounds_path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def finish(self, clients: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        if clients:
            columns = sorted({key for row in clients for key in row}, key=_column_order)
            with (self.directory / "clients.csv").open("w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=columns)
                writer.writeheader()
                writer.writerows(clients)
        (self.directory / "summary.json").write_text(json.dumps(summary, indent=2))
        self.plot()
        from server_app.report_page import write_run_report

        hint = comparison_hint(summary, self.config)
        report = write_run_report(self.directory, hint)
        log.info("%s\n%s", console_table(summary), hint)
        log.info("results written to %s (open %s in a browser)", self.directory.resolve(),
                 report.name)

    def plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        regression = any("regression" in r for r in self.rounds)
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, label in REGRESSION_CURVES if regression else CURVES:
            points = [(r["round"], _lookup(r, key)) for r in self.rounds]
            points = [(x, y) for x, y in points if isinstance(y, (int, float)) and math.isfinite(y)]
            if points:
                ax.plot(*zip(*points), marker="o", label=label)
        ax.set_xlabel("round")
        ax.set_ylabel("test MAE (data units, lower is better)" if regression else "test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(self.directory / "accuracy.png", dpi=120)
        plt.close(fig)


def _column_order(name: str) -> tuple[int, str]:
    return (0 if name == "client-id" else 1, name)


def comparison_hint(summary: dict[str, Any], config: dict[str, Any],
                    reference_file: Path = REFERENCE_FILE) -> str:
    """Lines that put the run's accuracy next to other methods on the same data and settings:
    the default job's committed comparison (its numbers in `reference_file`, package data) when its
    settings are this run's, otherwise the `benchmarks.compare` command that measures them."""
    reference = matching_comparison(config, reference_file)
    method = summary["method"]
    if reference is not None and "personalized" in summary["final"]:
        listed = ", ".join(_reference_entry(s["method"], s["final"])
                           for s in reference["summaries"] if s["method"] != method
                           and (s["final"].get("personalized") or {}).get("mean") is not None)
        own = next((s for s in reference["summaries"] if s["method"] == method
                    and (s["final"].get("personalized") or {}).get("mean") is not None), None)
        lines = [f"  other methods, same data and settings (benchmarks/results/{REFERENCE}.md), "
                 f"personalized mean (%):\n    {listed}"]
        if own is not None:
            lines.append(f"  this job's committed result: {_reference_entry(method, own['final'])}; "
                         f"this run: {_reference_entry(method, summary['final'])} "
                         f"({_agreement(summary['final'], own['final'])})")
        return "\n".join(lines)
    baselines = ",".join(dict.fromkeys([method, "fedavg", "local"]))
    from server_app.run_values import format_value as set_value
    from strategies.shared.run_config import default_run_config

    defaults = default_run_config()
    sets = " ".join("--set " + shlex.quote(f"{key}={set_value(value)}")
                    for key, value in sorted(config.items())
                    if key not in RUN_KEYS and defaults.get(key) != value and value is not None)
    return (f"  compare with baselines on these settings: python -m benchmarks.compare "
            f"--methods {baselines} {sets}{' ' if sets else ''}--name my-comparison")


def _agreement(run: dict[str, Any], committed: dict[str, Any]) -> str:
    """`the same` when the run's personalized (and fine-tuned) means equal the committed ones to the
    last digit, else by how much they differ."""
    keys = ("personalized", "finetuned")
    gaps = {key: (run.get(key) or {}).get("mean", 0.0) - (committed.get(key) or {}).get("mean", 0.0)
            for key in keys if (committed.get(key) or {}).get("mean") is not None}
    if all(gap == 0.0 for gap in gaps.values()):
        return "the same"
    return "differs: " + ", ".join(f"{key} {gap:+.2f}" for key, gap in gaps.items() if gap)


def _reference_entry(method: str, final: dict[str, Any]) -> str:
    """`fedavg 75.00 (+ local epochs 95.83)`: a method's personalized mean, and for a global-model
    method also the global model fine-tuned locally."""
    entry = f"{method} {final['personalized']['mean']:.2f}"
    finetuned = (final.get("finetuned") or {}).get("mean")
    return entry + (f" (+ local epochs {finetuned:.2f})" if finetuned is not None else "")


def matching_comparison(config: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """The committed comparison at `path` if it ran the run's method with the run's settings (keys
    that do not change the numbers, and other methods' keys, aside)."""
    try:
        reference = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    method = config.get("method", "")
    if method not in reference.get("methods", []):
        return None

    def relevant(key: str) -> bool:
        section = key.split(".")[0]
        return key not in RUN_KEYS and ("." not in key or method.split("-")[0] == section)

    from strategies.shared.run_config import default_run_config

    # a key the comparison did not know yet was added later with the behaviour of before as its
    # default: at that default the run is the committed job
    settings = {**default_run_config(), **reference.get("settings", {})}
    same = all(settings.get(key, _MISSING) == value for key, value in config.items()
               if relevant(key))
    return reference if same else None


