"""One live owner per run directory: a lock file naming host, PID and a heartbeat.

A deployed ServerApp is a child of the SuperLink's executor, not of the SuperLink: it outlives a
SuperLink crash and keeps working once the SuperLink is back. A `resume=true` submitted meanwhile
would start a second ServerApp on the same `<output-dir>/<run-name>/`, and both would append to
`rounds.jsonl`. So the ServerApp takes the directory with `owner.lock` before it reads or writes
anything there:

- the lock holds `{"host", "pid", "token", "started", "heartbeat"}` (JSON) and a thread rewrites
  `heartbeat` every `interval` seconds while the run goes on;
- another ServerApp finding a live owner is refused (`RunLockedError`, saying which process holds
  it); an owner is dead when, on this host, its PID no longer exists, or, anywhere, its heartbeat
  is older than `stale_after` seconds. A dead owner's lock is taken over and the takeover logged;
- before each `rounds.jsonl` line the owner checks the lock still carries its token
  (`RunLock.verify`); a process that lost it (it hung past `stale_after` and was taken over) stops
  with `RunLockLostError` instead of writing a round the new owner also writes.

Decisions are made under an `fcntl.flock` on `.owner.guard` beside the lock, so two processes
taking over the same stale lock cannot both win (flock is reliable on local file systems; on a
network file system the heartbeat age still protects against a dead owner, not against a race).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from server_app.callbacks import RunCallback
from strategies.shared.settings import ConfigError

log = logging.getLogger("flwr.bouquet")

LOCK_NAME = "owner.lock"
GUARD_NAME = ".owner.guard"
HEARTBEAT_INTERVAL = 10.0  # seconds between heartbeats
STALE_AFTER = 60.0  # a heartbeat older than this means the owner is gone (6 missed beats)


class RunLockedError(ConfigError):
    """The run directory belongs to a live ServerApp."""


class RunLockLostError(RuntimeError):
    """This process no longer owns its run directory (its lock was taken over)."""


@dataclass(frozen=True)
class Owner:
    """The content of `owner.lock`."""

    host: str
    pid: int
    token: str
    started: float
    heartbeat: float

    def describe(self, now: float) -> str:
        return (f"PID {self.pid} on host {self.host} (started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started))}, last heartbeat "
                f"{now - self.heartbeat:.0f} s ago)")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, belongs to another user
        return True
    return True


def read_owner(directory: Path) -> Owner | None:
    """The recorded owner of `directory`, or None when there is no (readable) lock."""
    try:
        data = json.loads((directory / LOCK_NAME).read_text())
        return Owner(str(data["host"]), int(data["pid"]), str(data["token"]),
                     float(data["started"]), float(data["heartbeat"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("run lock %s is unreadable (%s): treating it as stale", directory / LOCK_NAME, err)
        return None


def dead_reason(owner: Owner, now: float, stale_after: float, host: str) -> str:
    """Why `owner` no longer holds its lock, or "" while it is alive."""
    if owner.host == host and not _pid_alive(owner.pid):
        return f"process {owner.pid} no longer exists"
    if now - owner.heartbeat > stale_after:
        return f"its heartbeat is {now - owner.heartbeat:.0f} s old (limit {stale_after:.0f} s)"
    return ""


def _write(directory: Path, owner: Owner) -> None:
    """Replace the lock atomically (a reader sees the old or the new content, never half)."""
    temporary = directory / f".{LOCK_NAME}.{owner.token}"
    temporary.write_text(json.dumps(asdict(owner)))
    os.replace(temporary, directory / LOCK_NAME)


@contextmanager
def _guard(directory: Path) -> Iterator[None]:
    with (directory / GUARD_NAME).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class RunLock:
    """Ownership of one run directory; `acquire` it, `release` it (also a context manager)."""

    def __init__(self, directory: Path, interval: float = HEARTBEAT_INTERVAL,
                 stale_after: float = STALE_AFTER) -> None:
        if not 0 < interval < stale_after:
            raise ValueError(f"run lock: heartbeat interval {interval} must be in (0, stale_after="
                             f"{stale_after})")
        self.directory = Path(directory)
        self.interval = interval
        self.stale_after = stale_after
        self.host = socket.gethostname()
        self.token = uuid.uuid4().hex
        self.started = 0.0
        self.lost = ""  # why the lock was lost, "" while held
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- taking and giving back ------------------------------------------------------------------
    def acquire(self) -> RunLock:
        """Take the directory (creating it), or raise `RunLockedError` naming the live owner."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with _guard(self.directory):
                now = time.time()
                owner = read_owner(self.directory)
                if owner is not None:
                    reason = dead_reason(owner, now, self.stale_after, self.host)
                    if not reason:
                        raise RunLockedError(
                            f"run directory {self.directory} is in use by the ServerApp with "
                            f"{owner.describe(now)}; wait for that run to end or stop that process "
                            f"(its lock {self.directory / LOCK_NAME} is taken over once the process "
                            f"is gone or {self.stale_after:.0f} s after its last heartbeat)")
                    log.warning("run lock: taking over %s from %s: %s", self.directory / LOCK_NAME,
                                owner.describe(now), reason)
                self.started = now
                _write(self.directory, self._owner(now))
        except OSError as err:
            raise ConfigError(f"run config: cannot write results to {self.directory} (its lock "
                              f"file: {err.strerror or err}); set output-dir to a writable folder"
                              ) from None
        self._thread = threading.Thread(target=self._beat, name="bouquet-run-lock", daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            with _guard(self.directory):
                owner = read_owner(self.directory)
                if owner is not None and owner.token == self.token:
                    (self.directory / LOCK_NAME).unlink()
        except OSError as err:
            log.warning("run lock: could not remove %s (%s)", self.directory / LOCK_NAME, err)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # --- while running ---------------------------------------------------------------------------
    def verify(self) -> None:
        """Raise `RunLockLostError` unless this process still owns the directory."""
        owner = read_owner(self.directory)
        if owner is None or owner.token != self.token:
            holder = owner.describe(time.time()) if owner else "nobody (the lock file is gone)"
            self.lost = self.lost or f"the lock is now held by {holder}"
            raise RunLockLostError(f"run directory {self.directory}: this ServerApp (PID "
                                   f"{os.getpid()}) no longer owns it: {self.lost}; stopping "
                                   "without writing more results")

    def _owner(self, now: float) -> Owner:
        return Owner(self.host, os.getpid(), self.token, self.started, now)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with _guard(self.directory):
                    owner = read_owner(self.directory)
                    if owner is None or owner.token != self.token:
                        self.lost = (f"taken over by {owner.describe(time.time())}" if owner
                                     else "the lock file was removed")
                        log.error("run lock %s lost: %s", self.directory / LOCK_NAME, self.lost)
                        return
                    _write(self.directory, self._owner(time.time()))
            except OSError as err:  # a full disk or a vanished directory: try again next beat
                log.warning("run lock: heartbeat not written (%s)", err)


class OwnershipCheck(RunCallback):
    """Before each `rounds.jsonl` line: still the owner? (`RunLock.verify`)."""

    def __init__(self, lock: RunLock) -> None:
        self.lock = lock

    def completing_round(self, record: dict[str, Any]) -> None:
        self.lock.verify()
