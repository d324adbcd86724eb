"""The Bouquet ServerApp: validate the run config, build the model and strategy, run, write results."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from datasets.partition import Partition
from datasets.sources import SOURCE_INFO
from models import build_model
from server_app.callbacks import RunCallback
from server_app.checkpoint import CheckpointStore
from server_app.reporting import RunRecorder
from server_app.run_lock import OwnershipCheck, RunLock
from server_app.runner import FederationRunner
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.settings import ConfigError
from strategies.shared.run_config import RunConfig
from strategies.shared import priors
from strategies.shared.registry import build_strategy

log = logging.getLogger("flwr.bouquet")

app = ServerApp()


def initial_arrays(cfg: RunConfig) -> ArrayRecord:
    """The round-0 global model, seeded by the run seed."""
    input_shape, num_classes = SOURCE_INFO[cfg.dataset]
    torch.manual_seed(cfg.seed)
    return ArrayRecord(build_model(cfg.model, input_shape, num_classes).state_dict())


def run_directory(cfg: RunConfig) -> Path:
    name = cfg.run_name or f"{cfg.method}-{cfg.dataset}-{cfg.partition}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.output_dir).expanduser().resolve() / name


def ground_truth(cfg: RunConfig) -> Partition | None:
    """The partition's ground truth (clusters, label-sharing graph) when the server can rebuild it;
    used only for reporting graph quality. A server without the data set reports none."""
    truth = priors.ground_truth(cfg)
    if truth is None:
        log.info("no ground truth for reporting: the data set '%s' is not available here",
                 cfg.dataset)
    return truth


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


def run(grid: Grid, cfg: RunConfig, connect_timeout: float = 300.0,
        callbacks: Sequence[RunCallback] = ()) -> dict:
    """Run a whole federation; returns the summary that was also written to summary.json.
    `callbacks`: more cross-cutting work around the rounds (`server_app.callbacks.RunCallback`)."""
    directory = run_directory(cfg)
    log.info("Bouquet: method=%s dataset=%s partition=%s clients=%d rounds=%d → %s", cfg.method,
             cfg.dataset, cfg.partition, cfg.num_clients, cfg.num_rounds, directory)
    # may reject inputs (e.g. a graph file): before writing anything; per-client matrices above the
    # size are files in the run directory (made when the first one is allocated, in round 1)
    strategy = build_strategy(cfg, ClientMatrixStorage(cfg.client_matrix_mmap_bytes, directory))
    checkpoints = CheckpointStore(directory / "checkpoints")
    with RunLock(directory) as lock:  # one live ServerApp per run directory (server_app/run_lock.py)
        check_run_directory(cfg, directory, checkpoints)
        recorder = RunRecorder(directory, cfg.flat(), fresh=not cfg.resume)
        runner = FederationRunner(grid, cfg, strategy, recorder, ground_truth(cfg), checkpoints,
                                  [*callbacks, OwnershipCheck(lock)])
        runner.connect(timeout=connect_timeout)
        summary = runner.run(initial_arrays(cfg), resume=cfg.resume)
        lock.verify()
        recorder.finish(summary.pop("clients"), summary)
    return summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        cfg = RunConfig.from_flower(context.run_config)
        run(grid, cfg)
    except ConfigError as err:
        log.error("%s", err)  # the one line a user needs; Flower then marks the run failed
        raise
