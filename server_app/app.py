"""The Bouquet ServerApp: validate the run config, build the model and strategy, run, write results.

A mistake a user can fix (a run-config value, missing data, a resume without checkpoint, nodes that
cannot host their clients) ends the run with one ERROR line naming what to change: `main` logs it and
re-raises, so Flower still marks the run failed, and `QuietUserErrors` keeps Flower's runtime from
printing that exception's traceback and its generic "unhandled exception" exit message after it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from datasets.sources import SOURCE_INFO, DataNotFoundError
from models import build_model
from server_app.callbacks import (Checkpointing, MethodReport, ResumeError, RoundLog, RunCallback,
                                  TensorBoardLog, TrafficCount)
from server_app.checkpoint import CheckpointError, CheckpointStore
from server_app.privacy import Privacy
from server_app.clients import CodeMismatchError
from server_app.reporting import RunRecorder
from server_app.run_lock import OwnershipCheck, RunLock
from server_app.runner import ClientsUnavailableError, FederationRunner
from server_app.safeguard import Safeguard
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.settings import ConfigError
from strategies.shared.run_config import RunConfig
from strategies.shared.registry import build_strategy

log = logging.getLogger("flwr.bouquet")

app = ServerApp()

# Errors whose message is the whole story: one line naming the key, file or value and what to do.
USER_ERRORS = (ConfigError, DataNotFoundError, ResumeError, CheckpointError, ClientsUnavailableError,
               CodeMismatchError)
_REPORTED = "_bouquet_reported"  # set on an exception `main` has logged as its one line


class QuietUserErrors(logging.Filter):
    """On Flower's logger: drop the record that logs a reported user error with its traceback
    ("ServerApp raised an exception" deployed, "Simulation raised an exception" simulated), and
    shorten Flower's exit message that follows it ("Exit Code: 700 ... An unhandled exception
    occurred ...") to one line. Flower still marks the run failed, with the error as its details."""

    def __init__(self) -> None:
        super().__init__("bouquet-user-errors")
        self.swallowed = False  # a reported error was dropped: the next exit message is its

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and getattr(error, _REPORTED, False):
            self.swallowed = True
            return False
        if self.swallowed and isinstance(record.msg, str) and record.msg.startswith("Exit Code:"):
            self.swallowed = False
            code = record.msg.split("\n", 1)[0].removeprefix("Exit Code:").strip()
            record.msg, record.args = "run failed (Flower exit code %s): see the error above", (code,)
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def quiet_user_errors(logger: logging.Logger | None = None) -> QuietUserErrors:
    """Install `QuietUserErrors` on Flower's logger once per process; returns the installed one."""
    logger = logger or logging.getLogger("flwr")
    for existing in logger.filters:
        if isinstance(existing, logging.Filter) and existing.name == "bouquet-user-errors":
            return existing  # type: ignore[return-value]
    installed = QuietUserErrors()
    logger.addFilter(installed)
    return installed


def initial_arrays(cfg: RunConfig) -> ArrayRecord:
    """The round-0 global model, seeded by the run seed."""
    input_shape, num_classes = SOURCE_INFO[cfg.dataset]
    torch.manual_seed(cfg.seed)
    return ArrayRecord(build_model(cfg.model, input_shape, num_classes).state_dict())


def run_directory(cfg: RunConfig) -> Path:
    """`<output-dir>/<run-name>`, absolute. A relative output-dir is resolved against this process's
    working directory: the caller's in process; under `flwr run`, the directory the SuperLink (local:
    the first `flwr run` that started it) or the SuperExec was started in. `bouquet run` (server_app/
    cli.py) passes an absolute output-dir of the folder it was run from to a SuperLink on this machine."""
    name = cfg.run_name or f"{cfg.method}-{cfg.dataset}-{cfg.partition}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.output_dir).expanduser().resolve() / name


def check_run_directory(cfg: RunConfig, directory: Path, checkpoints: CheckpointStore) -> None:
    """Refuse, before any file is written or client contacted, to overwrite an earlier run's results
    or to resume a run that has no checkpoint."""
    if cfg.resume:
        if not checkpoints.rounds():
            raise ConfigError(f"run config: resume=true but {checkpoints.directory} holds no "
                              "checkpoint; check run-name and output-dir, or run without resume")
    else:
        rounds = directory / "rounds.jsonl"
        if rounds.exists() and rounds.stat().st_size > 0:
            last = checkpoints.rounds()[:1]
            hint = (f"set resume=true to continue it from round {last[0]}, " if last and not
                    (directory / "summary.json").exists() else "")
            raise ConfigError(f"run config: {directory} already holds the results of a run with "
                              f"run-name '{directory.name}'; {hint}choose another run-name, or "
                              "move that directory away")
    try:  # an unwritable output-dir fails now, not after the first round's work
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"run config: cannot write results to {directory} ({err.strerror or err}); "
                          "set output-dir to a writable folder") from None


def run_callbacks(cfg: RunConfig, checkpoints: CheckpointStore | None) -> list[RunCallback]:
    """The cross-cutting work of every run, in hook order: the method's report, byte counts, the
    round log, checkpoints (with a store), TensorBoard, the per-client safeguard and differential
    privacy."""
    return [MethodReport(), TrafficCount(cfg.num_clients), RoundLog(),
            *([Checkpointing(checkpoints)] if checkpoints is not None else []),
            TensorBoardLog(), Safeguard(cfg), Privacy(cfg)]


def run(grid: Grid, cfg: RunConfig, connect_timeout: float = 300.0,
        callbacks: Sequence[RunCallback] = ()) -> dict:
    """Run a whole federation; returns the summary that was also written to summary.json.
    `callbacks`: more cross-cutting work around the rounds (`server_app.callbacks.RunCallback`)."""
    directory = run_directory(cfg)
    log.info("Bouquet: method=%s dataset=%s partition=%s clients=%d rounds=%d → %s", cfg.method,
             cfg.dataset, cfg.partition, cfg.num_clients, cfg.num_rounds, directory)
    if not Path(cfg.output_dir).expanduser().is_absolute():
        log.info("output-dir '%s' is relative: resolved against this ServerApp's working directory "
                 "%s (`bouquet run` passes the folder it is run from; or give an absolute "
                 "output-dir)", cfg.output_dir, os.getcwd())
    # may reject inputs (e.g. a graph file): before writing anything; per-client matrices above the
    # size are files in the run directory (made when the first one is allocated, in round 1)
    strategy = build_strategy(cfg, ClientMatrixStorage(cfg.client_matrix_mmap_bytes, directory))
    checkpoints = CheckpointStore(directory / "checkpoints", keep=cfg.keep_checkpoints)
    with RunLock(directory) as lock:  # one live ServerApp per run directory (server_app/run_lock.py)
        check_run_directory(cfg, directory, checkpoints)
        recorder = RunRecorder(directory, cfg.flat(), fresh=not cfg.resume)
        # the server reads no client data: ground truth and label sets are what the clients report
        # in query.identify (FederationRunner.take_reports)
        runner = FederationRunner(grid, cfg, strategy, recorder,
                                  [*run_callbacks(cfg, checkpoints), *callbacks,
                                   OwnershipCheck(lock)])
        runner.connect(timeout=connect_timeout)
        summary = runner.run(initial_arrays(cfg), resume=cfg.resume)
        lock.verify()
        recorder.finish(summary.pop("clients"), summary)
    return summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    quiet_user_errors()
    try:
        cfg = RunConfig.from_flower(context.run_config)
        run(grid, cfg)
    except USER_ERRORS as err:
        log.error("%s", err)  # the one line a user needs; Flower then marks the run failed
        setattr(err, _REPORTED, True)  # no traceback after it (QuietUserErrors)
        raise
