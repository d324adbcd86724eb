"""The robustness suite: every method on the settings users meet, full and partial participation.

    python -m benchmarks.suite --seeds 0,1,2
    python -m benchmarks.suite --seeds 0,1,2 --workers 2          # cells as tasks on 2 local Ray CPUs
    python -m benchmarks.suite --seeds 0,1,2 --ray HEAD_IP:6379   # cells as tasks on a Ray cluster
    python -m benchmarks.suite --config my-grid.toml              # another grid, same runner

The grid is data: `benchmarks/experiments/suite.toml` (the default `--config`) names the methods,
the participation fractions, the budget every cell shares and the data settings (MNIST shards q = 2,
label-clusters 5 × 2, rotated domains (4 rotations, 10 classes), Dirichlet α = 0.1; on the domains
setting also fedcg with the conv model); `load_grid` checks it. Every
cell runs through `benchmarks.compare.compare` (same data, partition, seed and budget for every method
of the cell; one process per cell: serially in this one, or as Ray tasks with `--workers` / `--ray`,
with the same numbers, see `benchmarks.parallel`). On the label-clusters and domains cells IFCA and FedSEM also run with a wrong
cluster count (C = true − 2 and true + 3).

Writes into `--results-dir` (default `benchmarks/results/suite/`): each cell's compare files
(`<setting>-rho<ρ>-seed<s>.{md,png,json}`), and
- `suite-<setting>.md`: per method and ρ, mean and worst-5% accuracy (mean ± std over the seeds),
  plus the learned graphs' share inside the true structure for sfl-star / fedska;
- `suite-delta.md`: the matrix "method × cell: mean − max(FedAvg, FedAvg+FT, Local)" (points, seed
  means); FedAvg+FT is FedAvg's global model after `finetune-epochs` local epochs on each client, and a
  graph method's "+FT" row its own model after the same epochs (with the safeguard on);
- `suite-bytes-<setting>-rho<ρ>.png`: accuracy against cumulative bytes (down + up, all clients) for
  the clustered settings;
- `suite.json`: every number above.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    benchmark_parser,
    log_progress,
    parse_set,
    set_threads,
)
from benchmarks.compare import RUNS_DIR, compare, read_rounds
from benchmarks.parallel import Placement, add_placement_arguments, ordered, placement_from, run_all
from docs.results.compare import plot_curves

log = logging.getLogger("bouquet.benchmarks")

SUITE_DIR = RESULTS_DIR / "suite"
GRID = Path(__file__).resolve().parent / "experiments" / "suite.toml"
# the row labels of suite.json, as the docs read them
from docs.render import BASELINES, CONV, FT, GRAPH_METHODS  # noqa: E402
# the suite's pages, as the docs render them
from docs.results.suite import (  # noqa: E402,F401
    CellResult,
    cell_name,
    delta_matrix,
    delta_table,
    delta_vs_baselines,
    final_share,
    load_results,
    setting_table as _setting_table,
)
# per-round keys of rounds.jsonl that hold a learned graph's share inside the true structure
SHARE_KEYS = {"sfl-star": "sfl-learned-share-", "fedska": "fedska-share-"}


@dataclass(frozen=True)
class Setting:
    """One data setting of the grid: its run-config overrides and, for clustered partitions, the
    true cluster count (the wrong-count variants of IFCA / FedSEM are derived from it)."""

    name: str
    title: str
    overrides: dict[str, Any] = field(default_factory=dict)
    true_clusters: int = 0  # 0: no true clusters
    fedcg: bool = False  # also run fedcg with the conv model (domains)

    def cluster_counts(self) -> list[int]:
        """Wrong cluster counts for IFCA / FedSEM: true − 2 (at least 1) and true + 3."""
        if not self.true_clusters:
            return []
        return [max(1, self.true_clusters - 2), self.true_clusters + 3]


@dataclass(frozen=True)
class Grid:
    """A suite's grid as its TOML file states it (`benchmarks/experiments/suite.toml`)."""

    methods: tuple[str, ...]
    participation: tuple[float, ...]
    seeds: tuple[int, ...]
    common: dict[str, Any]
    settings: dict[str, Setting]


GRID_KEYS = {"methods", "participation", "seeds", "common", "settings"}
SETTING_KEYS = {"name", "title", "set", "true-clusters", "fedcg"}


def load_grid(path: str | Path = GRID) -> Grid:
    """The grid of the suite TOML at `path`; ValueError naming the file, the key and what is allowed."""
    import tomllib

    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"suite grid {path}: not a readable TOML file ({err})") from None

    def fail(what: str) -> ValueError:
        return ValueError(f"suite grid {path}: {what}")

    unknown = sorted(set(raw) - GRID_KEYS)
    if unknown:
        raise fail(f"unknown keys {unknown}; allowed: {', '.join(sorted(GRID_KEYS))}")
    missing = sorted({"methods", "participation", "common", "settings"} - set(raw))
    if missing:
        raise fail(f"missing keys {missing}")
    names = raw["methods"]
    if not isinstance(names, list) or not names or not all(isinstance(m, str) and m for m in names):
        raise fail(f"methods must be a non-empty list of method names, got {names!r}")
    rhos = raw["participation"]
    if not rhos or not all(isinstance(r, (int, float)) and 0 < r <= 1 for r in rhos):
        raise fail(f"participation must be a list of fractions in (0, 1], got {rhos!r}")
    seeds = raw.get("seeds", [0])
    if not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise fail(f"seeds must be a list of integers >= 0, got {seeds!r}")
    if not isinstance(raw["common"], dict):
        raise fail("[common] must be a table of run-config keys")
    settings: dict[str, Setting] = {}
    for item in raw["settings"]:
        bad = sorted(set(item) - SETTING_KEYS)
        if bad or not item.get("name") or not item.get("title"):
            raise fail(f"a [[settings]] entry has keys {bad} or no name / title; allowed: "
                       f"{', '.join(sorted(SETTING_KEYS))}")
        if item["name"] in settings:
            raise fail(f"setting '{item['name']}' given twice")
        clusters = item.get("true-clusters", 0)
        if not isinstance(clusters, int) or clusters < 0:
            raise fail(f"setting '{item['name']}': true-clusters must be an integer >= 0, got {clusters!r}")
        settings[item["name"]] = Setting(item["name"], item["title"], dict(item.get("set", {})),
                                         true_clusters=clusters, fedcg=bool(item.get("fedcg", False)))
    if not settings:
        raise fail("no [[settings]]")
    return Grid(tuple(raw["methods"]), tuple(float(r) for r in rhos), tuple(seeds), dict(raw["common"]), settings)


_DEFAULT = load_grid()
METHODS = _DEFAULT.methods
PARTICIPATION = _DEFAULT.participation
COMMON: dict[str, Any] = _DEFAULT.common
SETTINGS: dict[str, Setting] = _DEFAULT.settings
BUDGET_KEYS = ("dataset", "num-clients", "model", "max-samples-per-client", "local-epochs", "batch-size",
               "lr")


def data_budget() -> dict[str, Any]:
    """The suite's clients, model and local training (COMMON without its run length, fine-tuning
    and checkpoints), for benchmarks that run their own rounds on the suite's data."""
    return {key: COMMON[key] for key in BUDGET_KEYS}


def _results(setting: str, rho: float, seed: int, label: str, summary: dict[str, Any],
             runs_dir: Path) -> list[CellResult]:
    """A run's `CellResult`, and for FedAvg and the graph methods with a "+ local epochs" result
    (`finetuned`) a second one labelled `<label>+FT`."""
    out = [_result(setting, rho, seed, label, summary, runs_dir)]
    if summary["method"] in ("fedavg", *GRAPH_METHODS) and summary["final"].get("finetuned"):
        out.append(_result(setting, rho, seed, label + FT, summary, runs_dir, "finetuned"))
    return out


def _result(setting: str, rho: float, seed: int, label: str, summary: dict[str, Any],
            runs_dir: Path, key: str = "personalized") -> CellResult:
    """A `CellResult` from a compare summary and the run's rounds.jsonl (`key`: the result it takes,
    `personalized` or `finetuned`)."""
    method = summary["method"]
    personalized = summary["final"].get(key) or {}
    rounds = read_rounds(runs_dir / method / "rounds.jsonl")
    curve, spent, cumulative = [], 0.0, []
    share: list[float | None] = []
    kind = ""
    for record in rounds:
        spent += float(record.get("bytes-down", 0) or 0) + float(record.get("bytes-up", 0) or 0)
        accuracy = (record.get(key) or {}).get("mean")
        if accuracy is not None:
            curve.append((record["round"], accuracy))
            cumulative.append((spent, accuracy))
        prefix = SHARE_KEYS.get(method)
        if prefix and record.get("round", 0) > 0:
            found = [(k, v) for k, v in record.items() if k.startswith(prefix)]
            found = [(k, v) for k, v in found if "random" not in k]
            if found:
                kind = found[0][0][len(prefix):]
            share.append(found[0][1] if found else None)
    return CellResult(setting, rho, seed, label, method, personalized.get("mean"),
                      personalized.get("worst-5%"), curve, cumulative, share, kind,
                      summary.get("wall-seconds", 0.0))


def run_cell(setting: Setting, rho: float, seed: int, methods: Sequence[str],
             extra: dict[str, Any], results_dir: Path, runs_root: Path,
             fedcg: bool = True, common: dict[str, Any] | None = None) -> list[CellResult]:
    """Every method of one cell through `compare`, then the wrong-cluster-count and FedCG runs;
    `common`: the budget every cell shares (default the suite's, `COMMON`)."""
    overrides = {**(COMMON if common is None else common), **setting.overrides, "fraction-train": rho, "seed": seed, **extra}
    out: list[CellResult] = []
    name = cell_name(setting.name, rho, seed)
    runs = runs_root / name
    for summary in compare(methods, overrides, name, results_dir=results_dir, runs_dir=runs):
        out.extend(_results(setting.name, rho, seed, summary["method"], summary, runs))
    clustered = [m for m in ("ifca", "fedsem") if m in methods]
    for count in setting.cluster_counts() if clustered else []:
        variant = cell_name(setting.name, rho, seed, f"-clusters{count}")
        runs = runs_root / variant
        wrong = {**overrides, "ifca.clusters": count, "fedsem.clusters": count}
        for summary in compare(clustered, wrong, variant, results_dir=results_dir, runs_dir=runs):
            out.append(_result(setting.name, rho, seed, f"{summary['method']} (C={count})",
                               summary, runs))
    if setting.fedcg and fedcg:  # FedCG needs a conv model: its baselines run with it too
        variant = cell_name(setting.name, rho, seed, "-fedcg")
        runs = runs_root / variant
        conv = {**overrides, "model": "cnn"}
        for summary in compare([*BASELINES, "fedcg"], conv, variant, results_dir=results_dir,
                               runs_dir=runs):
            out.extend(_results(setting.name, rho, seed, summary["method"] + CONV, summary, runs))
    return out


def setting_table(results: list[CellResult], setting: Setting, rhos: Sequence[float],
                  seeds: Sequence[int], header: list[str], rounds: int | None = None) -> str:
    """`suite-<setting>.md` (`docs.results.suite.setting_table`); `rounds` defaults to the grid's."""
    return _setting_table(results, setting, rhos, seeds, header,
                          COMMON["num-rounds"] if rounds is None else rounds)


def plot_bytes(results: list[CellResult], setting: str, rho: float, seed: int,
               path: Path) -> None:
    """Accuracy against cumulative bytes (down + up, all clients, evaluation included) per method."""
    series = [(r.label, [(b / 1e6, a) for b, a in r.cumulative_bytes])
              for r in results if r.setting == setting and r.rho == rho and r.seed == seed]
    plot_curves(series, path, "personalized mean accuracy (%)",
                f"{setting}, ρ={rho:g}, seed {seed}", xlabel="cumulative MB (down + up)")


def write_outputs(results: list[CellResult], settings: Sequence[Setting], rhos: Sequence[float],
                  seeds: Sequence[int], results_dir: Path, command: str,
                  started: float, extra: dict[str, Any] | None = None,
                  common: dict[str, Any] | None = None) -> None:
    from benchmarks.common import code_version, machine_facts, versions_line

    m, code = machine_facts(), code_version()
    extra = extra or {}
    common = COMMON if common is None else common
    header = [
        "Produced by", "", "```", command, "```", "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}; code: commit "
        f"{code.get('commit', '?')}" + (" (with local changes)" if code.get("local-changes") else "")
        + f"; wall time {(time.time() - started) / 60:.1f} min",
        f"- machine: {m['cpu']}, {m['cores']} cores (torch threads {m['torch-threads']})",
        *versions_line(m),
        "- common budget: " + ", ".join(f"{k}={v}" for k, v in common.items())
        + ("; overridden: " + ", ".join(f"{k}={v}" for k, v in extra.items()) if extra else ""),
    ]
    results_dir.mkdir(parents=True, exist_ok=True)
    for setting in settings:
        (results_dir / f"suite-{setting.name}.md").write_text(
            setting_table(results, setting, rhos, seeds, [f"# Suite: {setting.title}", "", *header],
                          {**common, **extra}.get("num-rounds")))
        if setting.true_clusters:
            for rho in rhos:
                plot_bytes(results, setting.name, rho, seeds[0],
                           results_dir / f"suite-bytes-{setting.name}-rho{rho:g}.png")
    (results_dir / "suite-delta.md").write_text(
        delta_matrix(results, settings, rhos, ["# Suite: Δ vs max(FedAvg, FedAvg+FT, Local)", "",
                                                 *header]))
    (results_dir / "suite.json").write_text(json.dumps(
        {"command": command, "seeds": list(seeds), "rhos": list(rhos),
         "settings": [s.name for s in settings], "common": common,
         "results": [r.__dict__ for r in results]}, indent=1, default=str))


def _run_cell(cell: tuple[Setting, float, int], *, methods: Sequence[str], extra: dict[str, Any],
              results_dir: Path, runs_root: Path, fedcg: bool,
              common: dict[str, Any] | None = None) -> list[CellResult]:
    """`run_cell` of one (setting, ρ, seed): the unit a Ray task runs."""
    setting, rho, seed = cell
    return run_cell(setting, rho, seed, methods, extra, results_dir, runs_root, fedcg=fedcg,
                    common=common)


def run_suite(settings: Sequence[Setting], rhos: Sequence[float], seeds: Sequence[int],
              methods: Sequence[str], extra: dict[str, Any], results_dir: Path, runs_root: Path,
              command: str, fedcg: bool = True, placement: Placement | None = None,
              common: dict[str, Any] | None = None) -> list[CellResult]:
    """Every cell (seed × setting × ρ); with a Ray `placement` the cells run as parallel tasks
    (`benchmarks.parallel`). The tables are rewritten after every finished cell, rows in the serial
    order."""
    started = time.time()
    cells = [(setting, rho, seed) for seed in seeds for setting in settings for rho in rhos]
    run = partial(_run_cell, methods=methods, extra=extra, results_dir=results_dir,
                  runs_root=runs_root, fedcg=fedcg, common=common)
    done: dict[int, list[CellResult]] = {}
    for index, cell_results in run_all(run, cells, placement or Placement()):
        done[index] = cell_results
        results = [r for part in ordered(done) for r in part]
        write_outputs(results, settings, rhos, seeds, results_dir, command, started, extra, common)
    return [r for part in ordered(done) for r in part]


def relabelled(part: str) -> tuple[Path, str]:
    """A `--merge` part "DIR" or "DIR::SUFFIX" → (DIR, SUFFIX): the graph methods' rows of a part
    with a suffix keep their label + SUFFIX (e.g. earlier defaults beside the new ones)."""
    path, _, suffix = part.partition("::")
    return Path(path), suffix


def merge(parts: Sequence[Path | str], results_dir: Path, command: str) -> list[CellResult]:
    """Join suites run separately (e.g. one process per setting or seed) into one set of tables:
    every part's `suite.json` is read and its cell files are copied into `results_dir`. A later part
    that re-ran some methods of a cell (e.g. one method with a new default) replaces those methods'
    rows; the cell's files then stay those of the first part that ran it (the later part's files
    remain in its own directory). A part given as "DIR::SUFFIX" keeps its graph methods' rows under
    their label + SUFFIX (`relabelled`), beside the rows of later parts."""
    import shutil

    results: dict[tuple[str, float, int, str], CellResult] = {}
    commands = []
    copied: set[str] = set()
    for spec in parts:
        part, suffix = relabelled(str(spec))
        stored = json.loads((part / "suite.json").read_text())
        commands.append(stored["command"])
        for result in load_results(part / "suite.json"):
            if suffix and result.method in GRAPH_METHODS:
                result.label += suffix
            results[(result.setting, result.rho, result.seed, result.label)] = result
        if part.resolve() != results_dir.resolve():
            results_dir.mkdir(parents=True, exist_ok=True)
            for path in part.iterdir():
                if not path.name.startswith("suite") and path.is_file() and path.name not in copied:
                    shutil.copy2(path, results_dir / path.name)
                    copied.add(path.name)
    results = list(results.values())
    names = [r.setting for r in results]
    settings = [SETTINGS[n] for n in SETTINGS if n in names]
    rhos = sorted({r.rho for r in results}, reverse=True)
    seeds = sorted({r.seed for r in results})
    write_outputs(results, settings, rhos, seeds, results_dir,
                  "\n".join([*commands, command]), time.time())
    return results


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("suite", __doc__)
    parser.add_argument("--config", default=str(GRID), metavar="FILE",
                        help="the grid (TOML): methods, participation, seeds, common budget and "
                             "settings (default benchmarks/experiments/suite.toml)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the grid's)")
    parser.add_argument("--settings", default=None,
                        help=f"comma-separated subset of the grid's settings (default all: "
                             f"{', '.join(SETTINGS)})")
    parser.add_argument("--rhos", default=None,
                        help="comma-separated participation fractions (default: the grid's, "
                             + ",".join(f"{r:g}" for r in PARTICIPATION) + ")")
    parser.add_argument("--methods", default=None, help="comma-separated methods (default: the "
                        "grid's)")
    parser.add_argument("--no-fedcg", action="store_true", help="skip fedcg on the domains setting")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="run-config override for every cell (repeatable)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results-dir", default=str(SUITE_DIR))
    parser.add_argument("--runs-dir", default=str(RUNS_DIR / "suite"))
    parser.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                        help="run nothing: join the suite.json of these result folders into "
                             "--results-dir (DIR::SUFFIX: that folder's graph-method rows keep "
                             "their label + SUFFIX)")
    add_placement_arguments(parser)
    args = parser.parse_args(argv)
    log_progress()
    if args.merge:
        command = "python -m benchmarks.suite " + shlex.join(argv)
        results = merge(args.merge, Path(args.results_dir), command)
        print((Path(args.results_dir) / "suite-delta.md").read_text())
        log.info("suite: %d runs merged into %s", len(results), args.results_dir)
        return 0
    set_threads(args.threads)
    try:
        grid = load_grid(args.config)
        seeds = ([int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds is not None
                 else list(grid.seeds))
        rhos = ([float(r) for r in args.rhos.split(",") if r.strip()] if args.rhos is not None
                else list(grid.participation))
        names = (args.settings.split(",") if args.settings is not None else list(grid.settings))
        unknown = [s for s in names if s.strip() and s.strip() not in grid.settings]
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; allowed: {', '.join(grid.settings)}")
        settings = [grid.settings[s.strip()] for s in names if s.strip()]
        methods = ([m.strip() for m in args.methods.split(",") if m.strip()]
                   if args.methods is not None else list(grid.methods))
        extra = parse_set(args.set)
        if not seeds or not rhos or not settings or not methods:
            raise ValueError("--seeds, --rhos, --settings and --methods must each name at least one")
        placement = placement_from(args)
    except ValueError as err:
        parser.error(str(err))
    command = "python -m benchmarks.suite " + shlex.join(argv)
    results = run_suite(settings, rhos, seeds, methods, extra, Path(args.results_dir),
                        Path(args.runs_dir), command, fedcg=not args.no_fedcg, placement=placement,
                        common=grid.common)
    print((Path(args.results_dir) / "suite-delta.md").read_text())
    log.info("suite: %d runs written to %s", len(results), args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
