"""Cross-cutting work around the round loop, as callbacks: the method's own report, per-round byte
counts, the round's log line, checkpoints, the TensorBoard event files and the safeguard
(server_app/safeguard.py). `FederationRunner` runs the rounds and calls every callback's hooks in
order; each hook is a no-op unless a callback overrides it. Callbacks come as a list (server_app/app.py
`run_callbacks`); the runner names none of them.

A callback sees the run through `RunView` (given once, `attach`): its config, its folder, the current
strategy and the ground truth the clients reported, never the runner. Hooks, in the order of a round:
`request_records` (records added to every train / evaluate request), `step_records` (records added to
every train request, asked for after the method's own step before training), `train_replies` and
`evaluate_replies` (round-record fields read from the good replies), `round_fields` (fields merged into
the round's record while its state is current), `bytes_exchanged` (the bytes of a phase),
`completing_round` (turn what was measured into record fields), `round_recorded` (after the rounds.jsonl
line is written), `round_finished` (the round's state is final: checkpoint); `run_finished` once, with
the summary; `resume` when the run continues a checkpointed one.

A component with state a resumed run needs (`Stateful`: the strategy, the round history, byte counts,
the safeguard, TensorBoard) names itself (`state_name`) and saves and restores its own state
(`state` / `restore`); `Checkpointing` stores every component's state under its name.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp.strategy import Strategy

from server_app.checkpoint import CheckpointStore
from strategies.shared.reporter import MethodReporter, colour_range, constant_value
from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")

# Settings that may differ between a checkpointed run and its resumption.
RESUMABLE_CHANGES = ("resume", "num-rounds", "round-timeout", "client-threads", "checkpoint-every",
                     "keep-checkpoints", "eval-every", "max-update-norm", "fuse-evaluate")

# (client id, reply) pairs of the good replies of a phase, by client id.
Replies = Sequence[tuple[int, Message]]


class ResumeError(RuntimeError):
    """A checkpoint that cannot continue this run (different settings, beyond num-rounds)."""


@runtime_checkable
class Stateful(Protocol):
    """A component whose state a checkpoint holds, under its `state_name`: `state()` is what it needs
    to continue (picklable), `restore(state)` loads it back."""

    state_name: str

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


@dataclass
class RunView:
    """What callbacks see of the run: the run config, its results folder, the current strategy (a
    resumed run restores another object), the ground truth the clients reported (None: none, or not
    connected yet) and the run's stateful components by name (what a checkpoint holds)."""

    cfg: RunConfig
    directory: Path
    strategy: Strategy
    truth: Any = None
    parts: dict[str, Stateful] = field(default_factory=dict)


@dataclass(frozen=True)
class Resumed:
    """Where a resumed run continues: the global model, its round, the seconds run so far and the
    record of a round whose evaluation is still due."""

    arrays: ArrayRecord
    server_round: int
    seconds: float
    pending: dict[str, Any] | None


class RunCallback:
    """The hooks of the round loop (no-ops here)."""

    state_name: ClassVar[str | None] = None  # set by a callback with state to checkpoint

    def attach(self, run: RunView) -> None:
        """The run this callback serves (called once, before the first round)."""
        self.run = run

    def request_records(self, kind: str, server_round: int) -> Mapping[str, ConfigRecord]:
        """Records to add to every `kind` ("train" / "evaluate") request of `server_round`."""
        return {}

    def step_records(self, kind: str, server_round: int) -> Mapping[str, ConfigRecord]:
        """Records to add to every `kind` ("train") request of `server_round`, asked for after the
        method's own step before the phase (records that depend on what that step exchanged, such
        as a privacy ledger its phases charged)."""
        return {}

    def train_replies(self, server_round: int, replies: Replies) -> dict[str, Any]:
        """Round-record fields from the round's good train replies (after aggregation)."""
        return {}

    def evaluate_replies(self, server_round: int, replies: Replies) -> dict[str, Any]:
        """Round-record fields from a classification evaluation's good replies."""
        return {}

    def round_fields(self, server_round: int) -> dict[str, Any]:
        return {}

    def bytes_exchanged(self, server_round: int, down: Mapping[int, int],
                        up: Mapping[int, int]) -> None:
        """Model bytes sent to (`down`) and received from (`up`) each client, counted for the
        record of round `server_round`."""

    def completing_round(self, record: dict[str, Any]) -> None:
        """`record` is about to be written; may add or rewrite fields."""

    def round_recorded(self, record: dict[str, Any]) -> None:
        """`record` was written to rounds.jsonl."""

    def round_finished(self, server_round: int, arrays: ArrayRecord, seconds: float,
                       pending: dict[str, Any] | None) -> None:
        """Round `server_round` is over (`pending`: its record when its evaluation is still due)."""

    def run_finished(self, summary: dict[str, Any]) -> None:
        """The run is over; may add fields to `summary`."""

    def resume(self) -> Resumed | None:
        """Where to continue a resumed run, with every stateful component restored (None: this
        callback does not resume runs)."""
        return None


class MethodReport(RunCallback):
    """The strategy's own reporting (`MethodReporter`): per-round fields and final artifacts, with
    the ground truth the clients reported."""

    @property
    def reporter(self) -> MethodReporter:
        strategy = self.run.strategy  # the strategy may be replaced by a resumed one
        return strategy if isinstance(strategy, MethodReporter) else MethodReporter()

    def round_fields(self, server_round: int) -> dict[str, Any]:
        return self.reporter.round_report(server_round)

    def run_finished(self, summary: dict[str, Any]) -> None:
        summary.update(self.reporter.report(self.run.directory, self.run.truth))


class TrafficCount(RunCallback):
    """Bytes down and up per round (total and per client) from the bytes of each phase
    (`bytes_exchanged`), the run's totals per client (`bytes-down` / `bytes-up` of the summary's
    clients) and its median bytes per round (`bytes-per-round`)."""

    state_name = "traffic"

    def __init__(self, num_clients: int) -> None:
        self.totals: dict[int, list[int]] = {c: [0, 0] for c in range(num_clients)}
        # round -> bytes per client (down, up) of a round not yet recorded
        self.open: dict[int, tuple[dict[int, int], dict[int, int]]] = {}
        self.per_round: dict[int, int] = {}  # recorded round -> its bytes down + up

    def bytes_exchanged(self, server_round: int, down: Mapping[int, int],
                        up: Mapping[int, int]) -> None:
        counted_down, counted_up = self.open.setdefault(server_round, ({}, {}))
        for counted, values in ((counted_down, down), (counted_up, up)):
            for client, value in values.items():
                counted[client] = counted.get(client, 0) + value

    def completing_round(self, record: dict[str, Any]) -> None:
        down, up = self.open.pop(record["round"], ({}, {}))
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
        self.per_round[record["round"]] = record["bytes-down"] + record["bytes-up"]

    def run_finished(self, summary: dict[str, Any]) -> None:
        rounds = [total for r, total in self.per_round.items() if r > 0]
        if rounds:
            summary["bytes-per-round"] = int(statistics.median(rounds))
        for client in summary.get("clients", []):
            down, up = self.totals.get(client["client-id"], (0, 0))
            client["bytes-down"], client["bytes-up"] = down, up

    def state(self) -> dict[str, Any]:
        return {"totals": self.totals, "open": self.open, "per-round": self.per_round}

    def restore(self, state: dict[str, Any]) -> None:
        self.totals, self.open, self.per_round = state["totals"], state["open"], state["per-round"]


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
    `server_app.checkpoint`): the global model, the round, the RNG states, the record of a round
    whose evaluation is still due and the state of every stateful component (`RunView.parts`, each
    under its name). `resume` loads the newest valid checkpoint back into those components."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store

    def round_finished(self, server_round: int, arrays: ArrayRecord, seconds: float,
                       pending: dict[str, Any] | None) -> None:
        cfg = self.run.cfg
        every = cfg.checkpoint_every
        if not every or (server_round % every and server_round != cfg.num_rounds):
            return
        self.store.save(server_round, {
            "round": server_round,
            "config": cfg.flat(),
            "arrays": arrays,
            "random": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "seconds": seconds,
            "pending": pending,
            "parts": {name: part.state() for name, part in self.run.parts.items()},
        })

    def resume(self) -> Resumed:
        """The newest valid checkpoint, its components' state loaded back."""
        cfg = self.run.cfg
        state = self.store.load_latest()
        mismatch = {key: (value, state["config"].get(key)) for key, value in cfg.flat().items()
                    if key not in RESUMABLE_CHANGES and state["config"].get(key) != value}
        if mismatch:
            key, (now, then) = next(iter(mismatch.items()))
            raise ResumeError(
                f"cannot resume: the checkpoint was written with {key}={then!r} but this run has "
                f"{key}={now!r}; use the original settings (only {', '.join(RESUMABLE_CHANGES)} "
                "may change)")
        if state["round"] > cfg.num_rounds:
            raise ResumeError(f"cannot resume: the checkpoint is of round {state['round']}, beyond "
                              f"num-rounds={cfg.num_rounds}")
        parts = state.get("parts", {})
        missing = sorted(set(self.run.parts) - set(parts))
        if missing:
            raise ResumeError(f"cannot resume: the checkpoint of round {state['round']} holds no "
                              f"state of {', '.join(missing)} (written by another version of "
                              "Bouquet); start the run again without resume")
        random.setstate(state["random"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        for name, part in self.run.parts.items():
            part.restore(parts[name])
        return Resumed(state["arrays"], state["round"], state["seconds"], state["pending"])


def scalar_fields(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric fields of a record, nested keys joined by '/' (`personalized/mean`); lists,
    strings, None, NaN and private `_` fields are left out."""
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
    `purge_step` = that round, so a resumed run replaces the rounds it repeats; the last graph
    written is its checkpointed state."""

    state_name = "tensorboard"

    def __init__(self) -> None:
        self.writer: Any = None
        self.last_graph: np.ndarray | None = None

    def state(self) -> dict[str, Any]:
        return {"last-graph": self.last_graph}

    def restore(self, state: dict[str, Any]) -> None:
        self.last_graph = state["last-graph"]

    def _open(self, first_step: int) -> Any:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter  # server side only (lean client)

            self.writer = SummaryWriter(log_dir=str(self.run.directory), purge_step=first_step)
        return self.writer

    def round_recorded(self, record: dict[str, Any]) -> None:
        step = int(record["round"])
        writer = self._open(step)
        for tag, value in scalar_tags(record).items():
            writer.add_scalar(tag, value, step)
        strategy = self.run.strategy
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
        config = self.run.cfg.flat()
        settings = {key: value if isinstance(value, (bool, int, float, str)) else str(value)
                    for key, value in settings_that_apply(config, self.run.cfg.method).items()}
        final = {f"final/{tag}": value for tag, value in scalar_fields(summary.get("final", {})).items()}
        for summary_proto in hparams(settings, final):
            writer.file_writer.add_summary(summary_proto)
        step = int(summary.get("final", {}).get("round", self.run.cfg.num_rounds))
        for tag, value in final.items():
            writer.add_scalar(tag, value, step)
        writer.close()
