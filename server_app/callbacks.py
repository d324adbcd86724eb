"""Cross-cutting work around the round loop, as callbacks: the method's own report, per-round byte
counts, the round's log line and checkpoints. `FederationRunner` runs the rounds and calls every
callback's hooks in order; each hook is a no-op unless a callback overrides it. `TensorBoardLog`
writes the run's TensorBoard event files beside its results.

Hooks, in the order of a round: `round_fields` (fields merged into the round's record while its state
is current), `completing_round` (turn what was measured into record fields), `round_recorded` (after
the rounds.jsonl line is written), `round_finished` (the round's state is final: checkpoint);
`run_finished` once, with the summary.
"""

from __future__ import annotations

import logging
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from datasets.partition import Partition
from server_app.checkpoint import CheckpointStore
from strategies.shared.reporter import MethodReporter, colour_range, constant_value

if TYPE_CHECKING:
    from server_app.runner import FederationRunner

log = logging.getLogger("flwr.bouquet")

# Settings that may differ between a checkpointed run and its resumption.
RESUMABLE_CHANGES = ("resume", "num-rounds", "round-timeout", "client-threads", "checkpoint-every",
                     "keep-checkpoints", "eval-every", "max-update-norm", "fuse-evaluate")


class ResumeError(RuntimeError):
    """A checkpoint that cannot continue this run (different settings, beyond num-rounds)."""


class RunCallback:
    """The hooks of the round loop (no-ops here)."""

    def round_fields(self, server_round: int) -> dict[str, Any]:
        return {}

    def completing_round(self, record: dict[str, Any]) -> None:
        """`record` is about to be written; may add or rewrite fields."""

    def round_recorded(self, record: dict[str, Any]) -> None:
        """`record` was written to rounds.jsonl."""

    def round_finished(self, server_round: int, arrays: ArrayRecord, seconds: float,
                       pending: dict[str, Any] | None) -> None:
        """Round `server_round` is over (`pending`: its record when its evaluation is still due)."""

    def run_finished(self, summary: dict[str, Any]) -> None:
        """The run is over; may add fields to `summary`."""


class MethodReport(RunCallback):
    """The strategy's own reporting (`MethodReporter`): per-round fields and final artifacts."""

    def __init__(self, runner: FederationRunner, truth: Partition | None) -> None:
        self.runner, self.truth = runner, truth

    @property
    def reporter(self) -> MethodReporter:
        strategy = self.runner.strategy  # the strategy may be replaced by a resumed one
        return strategy if isinstance(strategy, MethodReporter) else MethodReporter()

    def round_fields(self, server_round: int) -> dict[str, Any]:
        return self.reporter.round_report(server_round)

    def run_finished(self, summary: dict[str, Any]) -> None:
        summary.update(self.reporter.report(self.runner.recorder.directory, self.truth))


class TrafficCount(RunCallback):
    """Bytes down and up per round (total and per client) from the per-client counts the runner
    collected (`_down`, `_up`), and the run's totals per client."""

    def __init__(self, num_clients: int) -> None:
        self.totals: dict[int, list[int]] = {c: [0, 0] for c in range(num_clients)}

    def completing_round(self, record: dict[str, Any]) -> None:
        down, up = record.pop("_down", {}), record.pop("_up", {})
        for client, value in down.items():
            self.totals[client][0] += value
        for client, value in up.items():
            self.totals[client][1] += value
        seconds = record.pop("seconds")
        record["seconds"] = seconds  # keeps its place after the results, as before
        record["bytes-down"] = sum(down.values())
        record["bytes-up"] = sum(up.values())
        record["bytes-down-per-client"] = sum(down.values()) / max(len(down), 1)
        record["bytes-up-per-client"] = sum(up.values()) / max(len(up), 1)


class RoundLog(RunCallback):
    """One log line per recorded round: accuracy (or the traffic errors) and its seconds."""

    def round_recorded(self, record: dict[str, Any]) -> None:
        seconds = record["seconds"]
        if "regression" in record:
            log.info(
                "round %d: %.1f s, MAE %.3f, MAPE %.2f%%, RMSE %.3f, global MAE %s", record["round"],
                seconds, record["regression"]["mae"], record["regression"]["mape"],
                record["regression"]["rmse"],
                f"{record['global-regression']['mae']:.3f}" if "global-regression" in record else "-",
            )
            return
        pers = record.get("personalized", {})
        log.info(
            "round %d: %.1f s, personalized mean %s, global %s", record["round"], seconds,
            f"{pers['mean']:.2f}%" if pers else "-",
            f"{record['global-accuracy']:.2f}%" if "global-accuracy" in record else "-",
        )


class Checkpointing(RunCallback):
    """After every `checkpoint-every`-th round (and the last): everything needed to continue (see
    `server_app.checkpoint`), including a round whose evaluation is still due. `restore` loads the
    newest valid checkpoint back into the runner."""

    def __init__(self, runner: FederationRunner, store: CheckpointStore, traffic: TrafficCount) -> None:
        self.runner, self.store, self.traffic = runner, store, traffic

    def round_finished(self, server_round: int, arrays: ArrayRecord, seconds: float,
                       pending: dict[str, Any] | None) -> None:
        runner = self.runner
        every = runner.cfg.checkpoint_every
        if not every or (server_round % every and server_round != runner.cfg.num_rounds):
            return
        self.store.save(server_round, {
            "round": server_round,
            "config": runner.cfg.flat(),
            "arrays": arrays,
            "strategy": runner.strategy,
            "random": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "rounds": runner.recorder.rounds,
            "latest": runner.latest,
            "bytes-total": self.traffic.totals,
            "seconds": seconds,
            "pending": pending,
            "safeguard-weight": runner.safeguard_weight,  # the federation's pooled weight, if any
            "safeguard-start": runner.safeguard_start,  # where sampled clients train from, and why
        })

    def restore(self) -> tuple[ArrayRecord, int, float, dict[str, Any] | None]:
        """(global arrays, its round, seconds so far, the record of a round whose evaluation is
        still due) of the newest valid checkpoint, whose state is loaded into the runner."""
        runner = self.runner
        state = self.store.load_latest()
        mismatch = {key: (value, state["config"].get(key))
                    for key, value in runner.cfg.flat().items()
                    if key not in RESUMABLE_CHANGES and state["config"].get(key) != value}
        if mismatch:
            key, (now, then) = next(iter(mismatch.items()))
            raise ResumeError(
                f"cannot resume: the checkpoint was written with {key}={then!r} but this run has "
                f"{key}={now!r}; use the original settings (only {', '.join(RESUMABLE_CHANGES)} "
                "may change)")
        if state["round"] > runner.cfg.num_rounds:
            raise ResumeError(f"cannot resume: the checkpoint is of round {state['round']}, beyond "
                              f"num-rounds={runner.cfg.num_rounds}")
        runner.strategy = state["strategy"]
        random.setstate(state["random"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        runner.latest = state["latest"]
        self.traffic.totals = state["bytes-total"]
        runner.recorder.restore(state["rounds"])
        runner.safeguard_weight = state.get("safeguard-weight")  # absent in older checkpoints
        if state.get("safeguard-start") is not None:  # older checkpoints: the run config's start
            runner.safeguard_start = state["safeguard-start"]
        return state["arrays"], state["round"], state["seconds"], state.get("pending")


def scalar_fields(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric fields of a record, nested keys joined by '/' (`personalized/mean`); lists,
    strings, None, NaN and the runner's private `_` fields are left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key.startswith("_") or key == "round":
            continue
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalar_fields(value, f"{tag}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[tag] = float(value)
    return out


# The evaluation summaries of a round record; TensorBoard shows them first, under `accuracy/`
# (TensorBoard orders its sections by the tag's first part, alphabetically).
EVALUATION_FIELDS = ("personalized", "global-accuracy", "finetuned", "regression",
                     "global-regression", "finetuned-regression")


def scalar_tags(record: dict[str, Any]) -> dict[str, float]:
    """`scalar_fields` as TensorBoard tags: the evaluation summaries under `accuracy/`
    (`accuracy/personalized/mean`, `accuracy/global-accuracy`, `accuracy/regression/mae`), every
    other field under its own name (`bytes-down`, `train-loss`, `fedcg/student-loss`)."""
    return {(f"accuracy/{tag}" if tag.split("/")[0] in EVALUATION_FIELDS else tag): value
            for tag, value in scalar_fields(record).items()}


def graph_image(matrix: np.ndarray, title: str = "") -> np.ndarray:
    """A square matrix as an RGB heatmap picture (H×W×3 uint8): viridis on `colour_range`'s scale
    with a labelled colour bar, so a constant matrix (a complete graph) reads as its value (the
    title says it too) rather than as a flat colour of unknown meaning."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    matrix = np.asarray(matrix, dtype=np.float64)
    low, high = colour_range(matrix)
    figure = Figure(figsize=(4.0, 3.4), dpi=100)
    canvas = FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    image = ax.imshow(matrix, cmap="viridis", interpolation="nearest", vmin=low, vmax=high)
    figure.colorbar(image, ax=ax, fraction=0.046)
    constant = constant_value(matrix)
    note = "" if constant is None else f"every entry {constant:g}"
    ax.set_title("\n".join(part for part in (title, note) if part), fontsize=9)
    ax.set_xlabel("client", fontsize=8)
    ax.set_ylabel("client", fontsize=8)
    ax.tick_params(labelsize=7)
    figure.tight_layout()
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


class TensorBoardLog(RunCallback):
    """TensorBoard event files in the run's folder: every numeric field of each rounds.jsonl line
    as a scalar at step = round (`scalar_tags`: the accuracies first, under `accuracy/`), the
    method's client graph as an image whenever it changes (`MethodReporter.client_graph`, with its
    colour bar), and at the end the settings that apply to the run as hparams with the final
    metrics. `tensorboard --logdir outputs` then shows one run per folder,
    so the methods of a comparison overlay. The writer is opened at the first recorded round with
    `purge_step` = that round, so a resumed run replaces the rounds it repeats."""

    def __init__(self, runner: FederationRunner, directory: Path) -> None:
        self.runner, self.directory = runner, directory
        self.writer: Any = None
        self.last_graph: np.ndarray | None = None

    def _open(self, first_step: int) -> Any:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter  # server side only (lean client)

            self.writer = SummaryWriter(log_dir=str(self.directory), purge_step=first_step)
        return self.writer

    def round_recorded(self, record: dict[str, Any]) -> None:
        step = int(record["round"])
        writer = self._open(step)
        for tag, value in scalar_tags(record).items():
            writer.add_scalar(tag, value, step)
        strategy = self.runner.strategy
        graph = strategy.client_graph() if isinstance(strategy, MethodReporter) else None
        if graph is not None and (self.last_graph is None or self.last_graph.shape != graph.shape
                                  or not np.array_equal(self.last_graph, graph)):
            writer.add_image("client-graph", graph_image(graph, f"round {step}"), step,
                             dataformats="HWC")
            self.last_graph = np.array(graph, copy=True)
        writer.flush()

    def run_finished(self, summary: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        from server_app.report_page import settings_that_apply

        writer = self._open(0)
        config = self.runner.cfg.flat()
        settings = {key: value if isinstance(value, (bool, int, float, str)) else str(value)
                    for key, value in settings_that_apply(config, self.runner.cfg.method).items()}
        final = {f"final/{tag}": value for tag, value in scalar_fields(summary.get("final", {})).items()}
        for summary_proto in hparams(settings, final):
            writer.file_writer.add_summary(summary_proto)
        step = int(summary.get("final", {}).get("round", self.runner.cfg.num_rounds))
        for tag, value in final.items():
            writer.add_scalar(tag, value, step)
        writer.close()
