"""A deployed ClientApp process that outlives its SuperNode or executor exits by itself.

Flower 1.39 starts one `flwr-clientapp` process per message (`flower-superexec` → `flwr-clientapp
--runtime-api-address <SuperNode's runtime API> --parent-pid <executor>`). Its HTTP calls to the
runtime API retry without limit (`make_simple_http_retry_invoker`: no max tries, no max time), so a
process whose SuperNode died keeps retrying for as long as its executor lives; and its own parent
monitor (a SIGINT when the executor's PID is gone) runs Flower's exit handlers, which talk to that
same runtime API and can wait on it. Processes started at a kill were seen alive 20-31 min later.

Bouquet's part: when the ClientApp module is imported inside such a process, `start()` runs a daemon
thread that ends the process (`os._exit(EXIT_CODE)`, after a log line) when the runtime API has
refused connections for `BOUQUET_CLIENTAPP_GRACE` seconds (default 60) in a row, or when the parent
(executor) is gone and Flower's own exit has not finished within 10 s. The work of such a process
cannot be delivered any more: its SuperNode lost the task with its restart.
Not ours: a process stuck before it imports the app (pulling its task or installing the FAB).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time

log = logging.getLogger("flwr.bouquet")

EXIT_CODE = 75  # EX_TEMPFAIL: the node is gone, nothing is wrong with the app
GRACE_ENV = "BOUQUET_CLIENTAPP_GRACE"
DEFAULT_GRACE = 60.0  # seconds without the runtime API before the process gives up
PARENT_GRACE = 10.0  # seconds Flower's own exit gets once the executor is gone
POLL = 2.0

_started = False


def runtime_address(argv: list[str]) -> tuple[str, int] | None:
    """(host, port) of `--runtime-api-address` in a `flwr-clientapp` command line, else None."""
    if not argv or not os.path.basename(argv[0]).startswith("flwr-clientapp"):
        return None
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--runtime-api-address" and i + 1 < len(argv) else (
            arg.split("=", 1)[1] if arg.startswith("--runtime-api-address=") else None)
        if value:
            host, _, port = value.rpartition(":")
            return host.strip("[]") or "127.0.0.1", int(port)
    return None


def _listening_locally(port: int) -> bool | None:
    """Whether a socket of this network namespace listens on `port` (from /proc/net/tcp*), or None
    where /proc cannot tell. Asking the kernel opens no connection to the SuperNode's API."""
    found = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]  # noqa: SIM115 - tiny file
        except OSError:
            continue
        found = bool(found)
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return found


def reachable(address: tuple[str, int], timeout: float = 2.0) -> bool:
    """Is the runtime API up? Loopback addresses are looked up in the kernel's socket table."""
    if address[0] in ("127.0.0.1", "localhost", "::1"):
        listening = _listening_locally(address[1])
        if listening is not None:
            return listening
    try:
        with socket.create_connection(address, timeout=timeout):
            return True
    except OSError:
        return False


def _grace() -> float:
    raw = os.environ.get(GRACE_ENV, "")
    try:
        grace = float(raw) if raw else DEFAULT_GRACE
    except ValueError:
        raise ValueError(f"{GRACE_ENV}={raw!r}: expected a number of seconds (default "
                         f"{DEFAULT_GRACE:.0f})") from None
    if grace <= 0:
        raise ValueError(f"{GRACE_ENV}={raw!r}: must be positive")
    return grace


def watch(address: tuple[str, int], parent: int, grace: float, poll: float = POLL) -> str:
    """Block until the process should give up; returns why."""
    unreachable_since: float | None = None
    orphaned_since: float | None = None
    while True:
        now = time.monotonic()
        if os.getppid() != parent:
            orphaned_since = orphaned_since or now
            if now - orphaned_since >= PARENT_GRACE:
                return f"its executor (PID {parent}) is gone"
        if reachable(address):
            unreachable_since = None
        else:
            unreachable_since = unreachable_since or now
            if now - unreachable_since >= grace:
                return (f"the SuperNode's runtime API at {address[0]}:{address[1]} refused "
                        f"connections for {grace:.0f} s")
        time.sleep(poll)


def start(argv: list[str] | None = None) -> bool:
    """Start the watchdog when this is a deployed ClientApp process (once); True if started."""
    global _started
    address = runtime_address(sys.argv if argv is None else argv)
    if _started or address is None:
        return False
    grace, parent = _grace(), os.getppid()

    def run() -> None:
        reason = watch(address, parent, grace)
        log.error("ClientApp process %d exits: %s", os.getpid(), reason)
        for handler in logging.getLogger("flwr").handlers:
            handler.flush()
        os._exit(EXIT_CODE)

    threading.Thread(target=run, name="bouquet-clientapp-watchdog", daemon=True).start()
    _started = True
    return True
