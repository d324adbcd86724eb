"""Per-round checkpoints of a federation: atomic, checksummed, only the newest `keep-checkpoints` kept.

After every round `Checkpointing` (server_app/callbacks.py) hands `CheckpointStore.save` everything
needed to continue: the round number, the global model, the RNG states of `random` (Flower's client
sampling), numpy and torch, and the state of every stateful component under its name: the whole
strategy object (per-client matrix, graphs, graph learners and their optimiser state, cluster models,
FLT's relatedness and UMAP reducer, ...), the metric history, byte counts, the safeguard's pooled
weight, start and fine-tuning evidence, TensorBoard's last graph. The strategy is pickled
as it is, so every method's state is covered without per-method code. A strategy holds no transport
(the runner hands it client ids and replies), so a checkpoint holds none either: a grid reached while
pickling is an error.

File format: `round-<r>.ckpt` = MAGIC line, sha256 hex of the payload, newline, pickled payload. A file
is written to a temporary name, fsynced and renamed, so a crash leaves either the old set of files or
the new one; older files are deleted only after the new one is durable. A run keeps its newest
`keep-checkpoints` files (default 1: a checkpoint holds the whole strategy, megabytes for a few
clients); with 2 or more, a truncated or altered newest file fails its checksum and `load_latest` falls
back to the one before it.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

from flwr.app import Array
from flwr.serverapp import Grid

from server_app.clients import ClientGrid


log = logging.getLogger("flwr.bouquet")

MAGIC = b"BOUQUET-CHECKPOINT-1\n"
_NAME = re.compile(r"^round-(\d{5})\.ckpt$")


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was needed (or the directory cannot hold one)."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file that is truncated, altered or not a checkpoint."""


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        """Flower `Array`s received over gRPC hold memoryviews of the message buffer, which pickle
        cannot store: save each one as its numpy array (restored as an equal `Array`)."""
        if isinstance(obj, Array):
            return Array, (obj.numpy(),)
        return NotImplemented

    def persistent_id(self, obj: Any) -> None:
        if isinstance(obj, (ClientGrid, Grid)):
            raise CheckpointError(f"the checkpoint reached a {type(obj).__name__}: a strategy must not "
                                  "keep the transport (the runner hands it client ids and replies)")
        return None


def checkpoint_path(directory: Path, server_round: int) -> Path:
    return directory / f"round-{server_round:05d}.ckpt"


class CheckpointStore:
    """Checkpoints of one run in `directory` (`<run-dir>/checkpoints`); keeps the newest `keep`."""

    def __init__(self, directory: Path, keep: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"keep-checkpoints = {keep} must be at least 1 (resume needs one)")
        self.directory = directory
        self.keep = keep

    def rounds(self) -> list[int]:
        """Rounds with a checkpoint file, newest first."""
        if not self.directory.is_dir():
            return []
        found = [int(m.group(1)) for p in self.directory.iterdir() if (m := _NAME.match(p.name))]
        return sorted(found, reverse=True)

    def save(self, server_round: int, payload: dict[str, Any]) -> Path:
        """Write round `server_round` atomically (temp file, fsync, rename), then delete all but
        the `keep` newest checkpoints, this one always among them."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CheckpointError(f"cannot create the checkpoint directory {self.directory}: {err}; "
                                  "set output-dir to a writable location") from None
        buffer = io.BytesIO()
        _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(payload)
        data = buffer.getvalue()
        final = checkpoint_path(self.directory, server_round)
        temporary = final.with_name(f".{final.name}.tmp")
        with temporary.open("wb") as handle:
            handle.write(MAGIC + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
        _fsync_directory(self.directory)
        for old in [r for r in self.rounds() if r != server_round][self.keep - 1:]:
            checkpoint_path(self.directory, old).unlink(missing_ok=True)
        return final

    def load(self, server_round: int) -> dict[str, Any]:
        path = checkpoint_path(self.directory, server_round)
        raw = path.read_bytes()
        header_end = len(MAGIC) + 64
        if not raw.startswith(MAGIC) or len(raw) < header_end + 1 or raw[header_end:header_end + 1] != b"\n":
            raise CorruptCheckpointError(f"{path} is not a Bouquet checkpoint (bad header)")
        data = raw[header_end + 1:]
        if hashlib.sha256(data).hexdigest().encode() != raw[len(MAGIC):header_end]:
            raise CorruptCheckpointError(f"{path} fails its sha256 checksum (truncated or altered)")
        return pickle.Unpickler(io.BytesIO(data)).load()

    def load_latest(self) -> dict[str, Any]:
        """The newest checkpoint that passes its checksum; corrupt ones are reported and skipped."""
        rounds = self.rounds()
        if not rounds:
            raise CheckpointError(
                f"resume=true but {self.directory} holds no checkpoint; run without resume, or set "
                "run-name (and output-dir) to those of the run to continue")
        for server_round in rounds:
            try:
                payload = self.load(server_round)
            except CorruptCheckpointError as err:
                log.warning("checkpoint of round %d is unusable (%s); trying the one before",
                            server_round, err)
                continue
            log.info("resuming from the checkpoint of round %d (%s)", server_round,
                     checkpoint_path(self.directory, server_round))
            return payload
        raise CheckpointError(
            f"every checkpoint in {self.directory} is corrupt (rounds {rounds}); the run cannot be "
            "resumed: start it again without resume=true (and another run-name)")


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
