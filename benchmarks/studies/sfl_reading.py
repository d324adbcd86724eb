"""How many lines must one read to follow SFL end to end, and how large a share of them is SFL's own?

    python -m benchmarks.studies.sfl_reading [--rounds 3] [--method sfl] [--set safeguard=off] [--json]

What is counted, reproducibly, from a real run rather than from a list typed by hand:

- **its own files**: every module of `strategies/methods/<method>/` (its folder: settings, server,
  declaration and what only it uses) and its client file `client_app/methods/<method>.py`;
- **the shared modules it calls every round**: every other module of the repository (under
  `client_app/`, `server_app/`, `strategies/`, `models/`, `datasets/`) in which, in *each* round of a
  small in-process run (`server_app.harness.simulate.simulate`: the real ServerApp loop and ClientApp
  on the in-process grid), a function runs that SFL's own code called directly, or that runs as a
  method of the SFL strategy object (a base class's method the runner calls on it: following SFL
  means reading that code too). What the runner and the ClientApp do for every method alike (the
  round loop, message transport, data loading, the report) is not SFL's and is not counted; a
  module called only in some rounds (set-up, round 1 only, checkpoints) is not counted either.

Lines are whole files (`wc -l`: what a reader opens), the share is own lines / all lines. The run
is small (`--rounds`, 10 clients of MNIST label-clusters, 40 samples per client) and its numbers
are not looked at: only which code runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
PROJECT = ("client_app", "server_app", "strategies", "models", "datasets")


def own_files(method: str) -> list[Path]:
    """The method's folder and its client file (`sfl-star` is SFL's folder too)."""
    package = method.split("-")[0].replace("-", "_")
    folder = REPO / "strategies" / "methods" / package
    client = REPO / "client_app" / "methods" / f"{package}.py"
    return sorted([*folder.glob("*.py"), *([client] if client.exists() else [])])


_SEEN: dict[str, Path | None] = {}


def _project(path: str) -> Path | None:
    """`path` relative to the repository when it is a module of the project, else None (cached:
    the profiler asks for every call)."""
    if path not in _SEEN:
        try:
            rel: Path | None = Path(path).resolve().relative_to(REPO)
        except ValueError:
            rel = None
        _SEEN[path] = rel if rel is not None and rel.parts and rel.parts[0] in PROJECT \
            and rel.suffix == ".py" else None
    return _SEEN[path]


def called_every_round(method: str, rounds: int, tmp: Path,
                       extra: dict[str, Any] | None = None) -> tuple[list[Path], int]:
    """The shared modules (relative paths) called from the method's own code, or run as methods of
    its strategy object, in every round of a small run; and the rounds seen."""
    from server_app.harness.simulate import simulate

    own = {p.relative_to(REPO) for p in own_files(method)}
    per_round: list[set[Path]] = []
    state = {"strategy": None}
    lock = threading.Lock()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = _project(frame.f_code.co_filename)
        if callee is None or callee in own:
            return
        code = frame.f_code
        this = frame.f_locals.get("self") if code.co_argcount else None
        if code.co_name == "configure_train" and this is not None and \
                _project(str(REPO / (type(this).__module__.replace(".", "/") + ".py"))) in own:
            with lock:  # a round starts: the first configure_train of the method's strategy in it
                state["strategy"] = this
                if frame.f_locals.get("server_round") != state.get("round"):
                    state["round"] = frame.f_locals.get("server_round")
                    per_round.append(set())
        if not per_round:
            return
        caller = frame.f_back
        from_own = caller is not None and _project(caller.f_code.co_filename) in own
        on_strategy = this is not None and this is state["strategy"]
        if from_own or on_strategy:
            with lock:
                per_round[-1].add(callee)

    overrides = {"method": method, "num-rounds": rounds, "num-clients": 10, "dataset": "mnist",
                 "partition": "label-clusters", "num-clusters": 5, "labels-per-cluster": 2,
                 "max-samples-per-client": 40, "local-epochs": 1, "finetune-epochs": 0,
                 "output-dir": str(tmp), "run-name": "reading", **(extra or {})}
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        simulate(overrides)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    if not per_round:
        raise RuntimeError(f"no round of {method} was seen (its strategy's configure_train never ran)")
    every = set.intersection(*per_round)
    return sorted(every), len(per_round)


def lines(path: Path) -> int:
    return len((REPO / path).read_text().splitlines())


def measure(method: str = "sfl", rounds: int = 3, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        shared, seen = called_every_round(method, rounds, Path(tmp), extra)
    own = [p.relative_to(REPO) for p in own_files(method)]
    own_lines = {str(p): lines(p) for p in own}
    shared_lines = {str(p): lines(p) for p in shared}
    total = sum(own_lines.values()) + sum(shared_lines.values())
    return {"method": method, "set": extra or {}, "rounds": seen, "own": own_lines, "shared": shared_lines,
            "files": len(own_lines) + len(shared_lines), "lines": total,
            "own-lines": sum(own_lines.values()),
            "own-share": round(sum(own_lines.values()) / total, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.sfl_reading",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="sfl")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="run-config override of the run, e.g. safeguard=off (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the measurement as JSON")
    args = parser.parse_args(argv)
    from benchmarks.common import parse_set

    result = measure(args.method, args.rounds, parse_set(args.set))
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for kind in ("own", "shared"):
        for path, count in result[kind].items():
            print(f"{count:5d}  {kind:6s}  {path}")
    print(f"{result['lines']:5d}  lines in {result['files']} files; own {result['own-lines']} "
          f"({100 * result['own-share']:.1f} %); shared modules called in every one of "
          f"{result['rounds']} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
