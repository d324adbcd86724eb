"""Compare methods on one setting: same data, partition, seed and budget, one process, one table.

    python -m benchmarks.compare --methods fedavg,fedprox,local,ditto \
        --set num-clients=20 --set partition=shards --set shards-per-client=2 --set num-rounds=20 \
        --name mnist-shards-q2-k20

Every method runs through `server_app.harness.simulate.simulate` (the real ClientApp on an in-process grid).
With `--workers N` (a private local Ray instance) or `--ray ADDRESS` (a running Ray cluster) the methods
run as parallel Ray tasks, each number the same as the serial run's (`benchmarks.parallel`).
Writes `<results-dir>/<name>.md` (command, date, machine, common settings, one row per method),
`<name>.png` (personalized mean accuracy per round, from each run's rounds.jsonl; for a regression
data set such as traffic, the MAE per round) and `<name>.json` (the raw summaries and curves). On a
regression data set the table has MAE / MAPE / RMSE columns instead of accuracies. Each run's own
outputs go to `outputs/benchmarks/<name>/<method>/`, and `outputs/benchmarks/<name>/report.html` shows
the comparison (table, curves, links to each method's report.html).
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from functools import partial
from typing import TYPE_CHECKING, Any

from benchmarks.common import (
    REPO,
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    log,
    log_progress,
    machine_facts,
    parse_set,
    progress,
    set_threads,
    write_study,
)
from docs.results.compare import (  # the page of a comparison, as the docs render it  # noqa: F401
    COLUMNS,
    DASH,
    REGRESSION_COLUMNS,
    columns_for,
    markdown,
    plot,
    summary_table,
    table_row,
)
from server_app.run_values import format_value
from strategies.shared.run_config import flat_keys

if TYPE_CHECKING:
    from benchmarks.parallel import Placement
    from strategies.shared.run_config import RunConfig

RUNS_DIR = REPO / "outputs" / "benchmarks"  # `outputs/` is git-ignored
# Keys compare() sets per method; a user may not override them with --set.
PER_METHOD_KEYS = ("method", "run-name", "output-dir")

# --- the command line ----------------------------------------------------------------------------
def format_command(methods: Sequence[str], overrides: dict[str, Any], name: str,
                   nodes: int | None = None) -> str:
    args = ["--methods", ",".join(methods)]
    for key, value in overrides.items():
        args += ["--set", f"{key}={format_value(value)}"]
    args += ["--name", name]
    if nodes:
        args += ["--nodes", str(nodes)]
    return "python -m benchmarks.compare " + shlex.join(args)


# --- running --------------------------------------------------------------------------------------
def _check(methods: Sequence[str], overrides: dict[str, Any]) -> None:
    """Fail before the first (possibly long) run: unknown method, reserved or invalid key."""
    from strategies.shared.run_config import default_run_config
    from strategies.shared.run_config import RunConfig
    from strategies.shared.registry import method_names

    if not methods:
        raise ValueError("no methods given")
    unknown = [m for m in methods if m not in method_names()]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; registered: {', '.join(method_names())}")
    reserved = [k for k in overrides if k in PER_METHOD_KEYS]
    if reserved:
        raise ValueError(f"{reserved} are set per method by compare; use --methods / --name")
    for method in methods:
        RunConfig.from_flower({**default_run_config(), **overrides, "method": method})


def read_rounds(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare(
    methods: Sequence[str],
    overrides: dict[str, Any],
    name: str,
    nodes: int | None = None,
    *,
    results_dir: str | Path = RESULTS_DIR,
    runs_dir: str | Path | None = None,
    command: str | None = None,
    placement: Placement | None = None,
    earlier: dict[str, Any] | None = None,
    order: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Run every method with the same `overrides`; write `<results_dir>/<name>.{md,png,json}`.

    Returns one summary per method (as `simulate` returns it, plus `wall-seconds` and `curve`:
    the per-round records of rounds.jsonl reduced to round, seconds and accuracies). With a Ray
    `placement` the methods run as parallel tasks (`benchmarks.parallel`); the numbers are the same.
    """
    from benchmarks.parallel import ordered, run_all
    from strategies.shared.run_config import RunConfig
    from server_app.report_page import write_comparison_report
    from strategies.shared.run_config import default_run_config

    methods = list(methods)
    overrides = dict(overrides)
    _check(methods, overrides)
    results_dir = Path(results_dir)
    runs_dir = Path(runs_dir) if runs_dir is not None else RUNS_DIR / name
    command = command or format_command(methods, overrides, name, nodes)
    started = datetime.now(timezone.utc)
    # the settings as the code that runs them reads them (before the runs: a long run's file does not
    # depend on edits to the defaults made while it ran)
    common = RunConfig.from_flower({**default_run_config(), **overrides,
                                    "method": methods[0]}).flat()
    for key in PER_METHOD_KEYS:
        common.pop(key, None)

    run = partial(run_method, overrides=overrides, name=name, runs_dir=runs_dir, nodes=nodes)
    if placement is None or placement.serial:
        summaries = [run(method) for method in progress(methods, f"compare {name}")]
    else:
        summaries = ordered(dict(run_all(run, methods, placement)))

    report_summaries = summaries
    meta = {
        "name": name,
        "command": command,
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_facts(),
        "code": code_version(),
        "methods": methods,
        "nodes": nodes,
        "overrides": overrides,
        "settings": common,
        "runs-dir": str(runs_dir),
    }
    if earlier is not None:
        meta, summaries = merged(earlier, meta, summaries, order)
    write_study(results_dir, name, {**meta, "summaries": summaries}, markdown(meta, summaries), indent=2,
                echo=None)
    plot(summaries, results_dir / f"{name}.png", title=name)
    report = write_comparison_report(
        runs_dir / "report.html", name, command, columns_for(report_summaries),
        [table_row(summary) for summary in report_summaries], results_dir / f"{name}.png",
        {method: runs_dir / method / "report.html" for method in methods},
        notes=f"Results table: {results_dir / name}.md")
    log.info("compare %s: report %s", name, report)
    return summaries


PART_KEYS = ("methods", "command", "date", "code", "machine", "runs-dir")


def same_run(earlier: dict[str, Any], overrides: dict[str, Any], nodes: int | None) -> None:
    """ValueError naming the keys unless the `earlier` results file ran `overrides` on `nodes`."""
    ran = earlier.get("overrides", {})
    differ = sorted(k for k in set(ran) | set(overrides) if ran.get(k) != overrides.get(k))
    if differ or earlier.get("nodes") != nodes:
        shown = [f"{k} = {ran.get(k)!r} (now {overrides.get(k)!r})" for k in differ]
        if earlier.get("nodes") != nodes:
            shown.append(f"nodes = {earlier.get('nodes')!r} (now {nodes!r})")
        raise ValueError(f"results {earlier.get('name')!r}: the file ran other settings "
                         f"({', '.join(shown)}); run the whole cell, or write elsewhere with --results-dir")


def merged(earlier: dict[str, Any], meta: dict[str, Any], summaries: list[dict[str, Any]],
           order: Sequence[str] = ()) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A comparison of more methods than one command ran: the `earlier` results file's methods that
    this run (`meta`, `summaries`) did not re-run, kept, then this run's, in `order` (the cell's
    methods). Each method runs on its own with the same settings, so the file holds what one command
    over all of them would; `parts` records each command's methods, date, code and machine, and
    `command` chains the commands (` && `). ValueError naming the key unless both ran the same
    settings on the same nodes."""
    same_run(earlier, meta["overrides"], meta["nodes"])
    ran = {s["method"] for s in summaries}
    parts = [p for p in earlier.get("parts") or [{k: earlier.get(k) for k in PART_KEYS}]
             if set(p["methods"]) - ran]
    parts = [{**p, "methods": [m for m in p["methods"] if m not in ran]} for p in parts]
    parts.append({k: meta.get(k) for k in PART_KEYS})
    kept = [s for s in earlier["summaries"] if s["method"] not in ran]
    rank = {m: i for i, m in enumerate(order)}
    everything = sorted(kept + summaries, key=lambda s: rank.get(s["method"], len(rank)))
    meta = {**meta, "methods": [s["method"] for s in everything],
            "command": " && ".join(p["command"] for p in parts), "parts": parts}
    return meta, everything


def run_method(method: str, *, overrides: dict[str, Any], name: str, runs_dir: Path,
               nodes: int | None = None) -> dict[str, Any]:
    """One method of a comparison: its federation (outputs in `runs_dir/<method>/`), summarised with
    `wall-seconds` and the per-round `curve`. Independent of the other methods (a Ray task)."""
    from server_app.harness.simulate import simulate

    run_overrides = {**overrides, "method": method, "output-dir": str(runs_dir), "run-name": method}
    log.info("compare %s: running %s", name, method)
    t0 = time.perf_counter()
    summary = simulate(run_overrides, num_nodes=nodes)
    summary["wall-seconds"] = time.perf_counter() - t0
    rounds = read_rounds(runs_dir / method / "rounds.jsonl")
    summary["curve"] = [_curve_point(r) for r in rounds]
    log.info("compare %s: %s done in %.0f s", name, method, summary["wall-seconds"])
    return summary


def _curve_point(record: dict[str, Any]) -> dict[str, Any]:
    point = {"round": record["round"], "seconds": record.get("seconds")}
    for key, value in (("personalized-mean", (record.get("personalized") or {}).get("mean")),
                       ("worst-5%", (record.get("personalized") or {}).get("worst-5%")),
                       ("global-accuracy", record.get("global-accuracy")),
                       ("finetuned-mean", (record.get("finetuned") or {}).get("mean")),
                       ("mae", (record.get("regression") or {}).get("mae")),
                       ("worst-5%-mae", (record.get("regression") or {}).get("worst-5%-mae")),
                       ("global-mae", (record.get("global-regression") or {}).get("mae")),
                       ("finetuned-mae", (record.get("finetuned-regression") or {}).get("mae")),
                       # the safeguard (graph methods): the clients' mean own weight and, where
                       # it hands out the consensus, the federation's pooled weight, whether
                       # the round's sampled clients trained from the consensus and the pooled
                       # evidence for the fine-tuned answers
                       ("safeguard-own", record.get("safeguard-own")),
                       ("safeguard-finetuned", record.get("safeguard-finetuned")),
                       ("safeguard-weight", record.get("safeguard-weight")),
                       ("safeguard-start", record.get("safeguard-start")),
                       ("safeguard-finetune-evidence", record.get("safeguard-finetune-evidence"))):
        if value is not None:
            point[key] = value
    return point


# --- experiment configs (one per paper table: benchmarks/papers/*.toml) ----------------------------
# `reported` and `differences` (and a cell's `label` and `reported`): the paper's numbers and the
# settings that differ from it, read by the docs (docs/blocks/papers.py), not by the runs
GRID_KEYS = {"paper", "table", "title", "methods", "seeds", "common", "cells", "reported", "differences",
             "calibrate-noise"}
CELL_KEYS = {"name", "methods", "set", "note", "label", "reported"}


def load_grid(path: str | Path) -> dict[str, Any]:
    """A paper table as data (TOML): `methods`, `seeds`, `common` run-config keys and `[[cells]]`, each
    with a `name`, its own `set` keys (data set, partition, model, ...) and optionally its own
    `methods`. ValueError naming the file and key otherwise."""
    import tomllib

    path = Path(path)
    try:
        grid = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"--config {path}: not a readable TOML file ({err})") from None
    unknown = sorted(set(grid) - GRID_KEYS)
    if unknown or not grid.get("cells") or not grid.get("methods"):
        raise ValueError(f"--config {path}: keys {unknown} unknown or methods/cells missing; allowed: "
                         f"{', '.join(sorted(GRID_KEYS))}, with methods = [...] and [[cells]] name/set")
    for cell in grid["cells"]:
        bad = sorted(set(cell) - CELL_KEYS)
        if bad or "name" not in cell:
            raise ValueError(f"--config {path}: a cell has keys {bad} or no name; allowed: "
                             f"{', '.join(sorted(CELL_KEYS))}")
    seeds = grid.get("seeds", [0])
    if not seeds or not all(isinstance(seed, int) and seed >= 0 for seed in seeds):
        raise ValueError(f"--config {path}: seeds must be a list of integers >= 0, got {seeds!r}")
    return grid


def grid_runs(grid: dict[str, Any], stem: str, overrides: dict[str, Any],
              cells: Sequence[str] = ()) -> list[tuple[str, list[str], dict[str, Any]]]:
    """(name, methods, run config) of every (cell, seed) of a grid: `common`, then the cell's `set`,
    then the command line's `--set` (e.g. data-root, or a smaller size); `cells` picks cells by name."""
    names = [cell["name"] for cell in grid["cells"]]
    missing = [name for name in cells if name not in names]
    if missing:
        raise ValueError(f"--cells {missing} not in the config; its cells: {', '.join(names)}")
    runs = []
    for cell in grid["cells"]:
        if cells and cell["name"] not in cells:
            continue
        for seed in grid.get("seeds", [0]):
            settings = {**flat_keys(grid.get("common", {})), **flat_keys(cell.get("set", {})), "seed": seed,
                        **overrides}
            methods = list(cell.get("methods", grid["methods"]))
            if grid.get("calibrate-noise"):
                settings = calibrate_noise(settings, methods)
            runs.append((f"{stem}-{cell['name']}-seed{settings['seed']}", methods, settings))
    return runs


def calibrated_noise(cfg: RunConfig) -> float:
    """The noise multiplier that brings `cfg`'s accountant(s) to `dp-target-epsilon` at `dp-delta`
    after `num-rounds` rounds (`run_schedules`, `noise_for_epsilon` of strategies.shared.privacy);
    under `sample` the clients' train sizes come from the run's partition, loaded here on the
    benchmark's side (the server never loads it). Under `sample`, a method that declares what its
    clients release beyond the DP-SGD rounds (`Method.sample_releases`: FLT's autoencoder steps and
    centroids, FedSKA's noised uploads every round) gets the one σ, with σ_u = σ for the uploads,
    at which every client's whole schedule ends at or below the target (`joint_noise`)."""
    from datasets.federated import load_partition
    from strategies.shared.privacy import noise_for_epsilon, run_schedules

    sizes: list[int] = []
    if cfg.dp == "sample":
        _, partition = load_partition(cfg.data_spec)
        sizes = [len(indices) for indices in partition.train_indices]
    sigma = noise_for_epsilon(cfg.dp_target_epsilon, cfg.dp_delta, run_schedules(cfg, sizes))
    releases = sample_releases(cfg.method) if cfg.dp == "sample" else None
    if releases is None:
        return sigma
    return joint_noise(cfg, sizes, releases, start=sigma)


def sample_releases(method: str) -> Any:
    """The method's `Method.sample_releases` as a callable (a `"module:function"` imported), or None
    where it declares none."""
    import importlib

    from strategies.shared.registry import METHODS

    declared = METHODS[method].sample_releases
    if declared is None or callable(declared):
        return declared
    module, _, function = declared.partition(":")
    found = getattr(importlib.import_module(module), function, None)
    if not callable(found):
        raise ImportError(f"method {method!r}: sample_releases={declared!r} is not a function")
    return found


def run_epsilon(cfg: RunConfig, sizes: Sequence[int], releases: Any, sigma: float) -> float:
    """The largest ε at `dp-delta` any client of train size in `sizes` ends a run of `cfg` at with
    DP-SGD σ = `sigma` and upload σ_u = `sigma`: its rounds' DP-SGD steps (`run_schedules`) and the
    method's other releases (`releases(cfg, n, σ, σ_u)`), composed by the runs' own accountant
    (`strategies.shared.privacy.epsilon`)."""
    from strategies.shared.privacy import epsilon, sample_schedule

    worst = 0.0
    for n in sorted(set(int(n) for n in sizes if n > 0)):
        rate, steps = sample_schedule(n, cfg.batch_size, cfg.local_epochs)
        history = [(sigma, rate, steps * cfg.num_rounds), *releases(cfg, n, sigma, sigma)]
        worst = max(worst, epsilon(history, cfg.dp_delta))
    return worst


def joint_noise(cfg: RunConfig, sizes: Sequence[int], releases: Any, start: float,
                tolerance: float = 1e-5) -> float:
    """The smallest σ (within `tolerance`, relative) at which `run_epsilon` is at most
    `dp-target-epsilon`, by bisection from `start` (the σ of the DP-SGD steps alone: with more
    releases ε can only grow, so the answer is at least that)."""
    target = cfg.dp_target_epsilon
    low, high = start, start
    while run_epsilon(cfg, sizes, releases, high) > target:
        low, high = high, high * 2.0
        if high > 1e6:
            raise ValueError(f"no noise multiplier up to 1e6 brings method '{cfg.method}' to "
                             f"dp-target-epsilon = {target:g}")
    while high - low > tolerance * high:
        middle = (low + high) / 2.0
        if run_epsilon(cfg, sizes, releases, middle) > target:
            low = middle
        else:
            high = middle
    return high


def calibrate_noise(settings: dict[str, Any], methods: str | Sequence[str]) -> dict[str, Any]:
    """A grid with `calibrate-noise = true`: a run with `dp` and a `dp-target-epsilon` gets the
    `dp-noise-multiplier` that brings its accountant to that ε after `num-rounds` rounds
    (`calibrated_noise`, rounded up to 4 decimals), and the same
    `dp-upload-noise-multiplier` (the noise of the graph methods' other uploads: FLT's centroids,
    FedSKA's descriptors, slot features and gradients); other runs as given. Under 'sample' σ covers
    every release the method declares (`Method.sample_releases`), so a client's whole run ends at
    the target; under 'client' one aggregate a round: what a method's server releases beyond that (a
    client-level aggregate per neighbourhood, noised uploads) is charged to the same ledger, and the
    target stops the federation before it would pass. The cell's `methods` must share one σ
    (ValueError naming them otherwise: give each its own cell)."""
    from strategies.shared.run_config import RunConfig, default_run_config

    methods = [methods] if isinstance(methods, str) else list(methods)
    found: dict[float, list[str]] = {}
    for method in methods:
        cfg = RunConfig.from_flower({**default_run_config(), **settings, "method": method})
        if cfg.dp == "off" or cfg.dp_target_epsilon <= 0:
            return settings
        found.setdefault(math.ceil(calibrated_noise(cfg) * 1e4) / 1e4, []).append(method)
    if len(found) > 1:
        shown = "; ".join(f"{', '.join(m)}: σ = {sigma:g}" for sigma, m in found.items())
        raise ValueError(f"calibrate-noise: the cell's methods need different noise multipliers "
                         f"({shown}); give each its own cell")
    sigma = next(iter(found))
    return {**settings, "dp-noise-multiplier": sigma, "dp-upload-noise-multiplier": sigma}


# --- command line ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.parallel import add_placement_arguments, placement_from

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("compare", __doc__)
    parser.add_argument("--methods", help="comma-separated registered method names (required "
                        "without --config)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="run-config override (repeatable), e.g. --set num-rounds=20")
    parser.add_argument("--name", help="results file stem (required without --config; with it the "
                        "stem of every <stem>-<cell>-seed<N> result, default the config's file name)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="a paper table as data (benchmarks/papers/*.toml): every cell and seed "
                             "is one comparison; --set applies on top of each cell's settings")
    parser.add_argument("--cells", default="", help="with --config: comma-separated cell names to run "
                        "(default: all)")
    parser.add_argument("--seeds", default="", help="with --config: comma-separated subset of the "
                        "config's seeds to run (default: all)")
    parser.add_argument("--nodes", type=int, default=None,
                        help="virtual nodes hosting the clients (default: one per client)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a small shared machine more "
                             "threads oversubscribe the cores and rounds get many times slower; "
                             "0 = torch's default)")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    parser.add_argument("--runs-dir", default=None,
                        help="where each run's outputs go (default outputs/benchmarks/<name>)")
    add_placement_arguments(parser)
    args = parser.parse_args(argv)
    log_progress()
    set_threads(args.threads)
    if args.config:
        return _main_grid(parser, args, argv)
    if not args.methods or not args.name:
        parser.error("--methods and --name are required (or give --config FILE)")
    try:
        overrides = parse_set(args.set)
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        _check(methods, overrides)
        placement = placement_from(args)
    except ValueError as err:
        parser.error(str(err))
    summaries = compare(methods, overrides, args.name, args.nodes, results_dir=args.results_dir,
                        runs_dir=args.runs_dir,
                        command="python -m benchmarks.compare " + shlex.join(argv),
                        placement=placement)
    print("\n".join(summary_table(summaries)))
    print(f"written: {Path(args.results_dir) / args.name}.md/.png/.json")
    print(f"report: {Path(args.runs_dir or RUNS_DIR / args.name) / 'report.html'}")
    return 0


def _main_grid(parser: Any, args: Any, argv: Sequence[str]) -> int:
    """`--config FILE`: run every (cell, seed) of the table, each a comparison of its own."""
    from benchmarks.parallel import placement_from

    try:
        grid = load_grid(args.config)
        overrides = parse_set(args.set)
        cells = [c.strip() for c in args.cells.split(",") if c.strip()]
        if args.seeds:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
            unknown = [s for s in seeds if s not in grid.get("seeds", [0])]
            if unknown:
                raise ValueError(f"--seeds {unknown} not in the config's seeds {grid.get('seeds', [0])}")
            grid = {**grid, "seeds": seeds}
        grid_stem = args.name or Path(args.config).stem
        runs = grid_runs(grid, grid_stem, overrides, cells)
        if args.methods:  # a subset of the table's methods
            keep = [m.strip() for m in args.methods.split(",") if m.strip()]
            runs = [(name, [m for m in methods if m in keep], settings) for name, methods, settings in runs]
        for name, methods, settings in runs:
            _check(methods, settings)
            existing = Path(args.results_dir) / f"{name}.json"
            if args.methods and existing.is_file():  # checked before any run: they add to it
                same_run(json.loads(existing.read_text()), settings, args.nodes)
        placement = placement_from(args)
    except ValueError as err:
        parser.error(str(err))
    for name, methods, settings in runs:
        # a subset of a cell's methods adds to (or replaces those methods in) its results file
        existing = Path(args.results_dir) / f"{name}.json"
        earlier = json.loads(existing.read_text()) if args.methods and existing.is_file() else None
        order = [m for cell in grid["cells"] if name.startswith(f"{grid_stem}-{cell['name']}-seed")
                 for m in cell.get("methods", grid["methods"])]
        summaries = compare(methods, settings, name, args.nodes, results_dir=args.results_dir,
                            runs_dir=None if args.runs_dir is None else Path(args.runs_dir) / name,
                            command="python -m benchmarks.compare " + shlex.join(argv),
                            placement=placement, earlier=earlier, order=order)
        print(f"## {name}")
        print("\n".join(summary_table(summaries)))
        print(f"written: {Path(args.results_dir) / name}.md/.png/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
