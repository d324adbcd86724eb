"""Read committed results for the docs' generated blocks, and format their numbers.

Every accessor reads a file under `benchmarks/results/` and records it in the current block's
sources (`docs.blocks.render` lists them under the block), so a generated number always names the
committed file it came from:

- `compare(name)`: a `benchmarks.compare` results JSON (`summaries` per method);
- `suite(folder)`: a `benchmarks.suite` `suite.json` (one row per setting, ρ, seed and method);
- `raw(path)`: any other results JSON as a dict (`benchmarks.studies.sfl_scale`, `fedcg_domains`, ...);
- `markdown_run(path)`: the table of a `benchmarks.compare` run whose JSON was never committed
  (the diagnosis runs of the robustness suite): the committed Markdown is the only record, and
  the page says so (`JSON_LESS`).

A value that no committed result holds is `NOT_RECORDED`, never a number.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from docs.render import baselines_of, markdown_table  # noqa: F401 (the blocks' table)

REPO = Path(__file__).resolve().parent.parent.parent
RESULTS = REPO / "benchmarks" / "results"
MINUS = "−"
DASH = "—"
NOT_RECORDED = "not recorded in a committed result"
# the mark after a number read from a committed Markdown run table (its JSON was never committed)
JSON_LESS = "†"


class Sources:
    """The committed files the block being rendered has read, in order."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def add(self, path: Path) -> None:
        if path not in self.paths:
            self.paths.append(path)


_current: list[Sources] = []
# every committed result file the docs have read in this process, block sources or not (the files a
# check reads, such as a suite folder's per-cell runs, included): `docs.cited` keeps them
TOUCHED: set[Path] = set()


def touch(path: Path) -> None:
    """Record that the docs read the committed result `path` (see `TOUCHED`)."""
    TOUCHED.add(path.resolve())


def _read(path: Path) -> None:
    touch(path)
    if _current:
        _current[-1].add(path)


def _resolve(name: str, suffix: str) -> Path:
    path = (RESULTS / (name if name.endswith(suffix) else name + suffix)).resolve()
    if RESULTS.resolve() not in path.parents:
        raise ValueError(f"docs: '{name}' is not under benchmarks/results/")
    if not path.is_file():
        raise FileNotFoundError(f"docs: no committed result {path.relative_to(REPO)}")
    return path


@lru_cache(maxsize=None)
def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def raw(name: str) -> Any:
    """The committed results JSON `benchmarks/results/<name>.json`."""
    path = _resolve(name, ".json")
    _read(path)
    return _load(path)


# --- formatting ------------------------------------------------------------------------------------
def num(value: float | None, digits: int = 2) -> str:
    """`value` with `digits` decimals (— when missing)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return DASH
    text = f"{value:.{digits}f}"
    if float(text) == 0:
        return text.lstrip("-")
    return text.replace("-", MINUS) if text.startswith("-") else text


def signed(value: float | None, digits: int = 2) -> str:
    """`value` with its sign (+1.23, −0.40, 0.00)."""
    if value is None:
        return DASH
    text = f"{value:+.{digits}f}"
    if float(text) == 0:
        return f"{0:.{digits}f}"
    return text.replace("-", MINUS)


def pct(fraction: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: 0.9204 → 92.0 %."""
    return DASH if fraction is None else f"{num(100 * fraction, digits)} %"


def times(ratio: float | None, digits: int = 1) -> str:
    """A ratio: 3.94 → 3.9×."""
    return DASH if ratio is None else f"{num(ratio, digits)}×"


def span(values: Iterable[float | None], digits: int = 2, unit: str = "") -> str:
    """The range of `values` as `low–high` (one value when they round alike)."""
    present = [v for v in values if v is not None]
    if not present:
        return DASH
    low, high = num(min(present), digits), num(max(present), digits)
    return f"{low}{unit}" if low == high else f"{low}–{high}{unit}"


def joined(values: Iterable[str], sep: str = " / ") -> str:
    return sep.join(values)


def mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1, as the benchmarks' ± columns)."""
    m = sum(values) / len(values)
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return m, math.sqrt(var)


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str | None = None) -> str:
    """A Markdown table (`benchmarks.common.markdown_table`); `align`: one letter per column, `l` or
    `r` (default: first left, rest right)."""
    return "\n".join(markdown_table(header, align or "l" + "r" * (len(header) - 1), rows))


# --- benchmarks.compare ----------------------------------------------------------------------------
@dataclass
class Comparison:
    """A committed `benchmarks.compare` results JSON."""

    name: str
    data: dict[str, Any]

    @property
    def settings(self) -> dict[str, Any]:
        return self.data["settings"]

    @property
    def methods(self) -> list[str]:
        return [s["method"] for s in self.data["summaries"]]

    def summary(self, method: str) -> dict[str, Any]:
        for s in self.data["summaries"]:
            if s["method"] == method:
                return s
        raise KeyError(f"docs: results '{self.name}' has no method '{method}' "
                       f"(it has {', '.join(self.methods)})")

    def get(self, method: str, *keys: str | int) -> Any:
        """A value of the method's summary by its keys, e.g. get('sfl', 'final', 'round')."""
        value: Any = self.summary(method)
        for key in keys:
            value = value[key]
        return value

    def pers(self, method: str, key: str = "mean") -> float:
        """The method's final personalized accuracy: `mean`, `worst-5%`, `best-5%`, `std`."""
        return self.get(method, "final", "personalized", key)

    def final(self, method: str, key: str) -> Any:
        """A final metric: `global-accuracy`, or `finetuned` (a dict like `personalized`)."""
        return self.summary(method)["final"].get(key)

    def ft(self, method: str) -> float | None:
        """The method's final mean after the evaluation's fine-tuning epochs (None: not measured)."""
        return (self.final(method, "finetuned") or {}).get("mean")

    def baselines(self) -> dict[str, float]:
        """The no-regret baselines this comparison ran: `fedavg`, `fedavg+FT` (FedAvg's global model
        after the fine-tuning epochs) and `local`, final personalized means."""
        base = {m: self.pers(m) for m in ("fedavg", "local") if m in self.methods}
        if "fedavg" in base and self.ft("fedavg") is not None:
            base["fedavg+FT"] = self.ft("fedavg")
        return base

    def curve(self, method: str, key: str = "personalized-mean") -> list[tuple[int, float]]:
        return [(p["round"], p[key]) for p in self.get(method, "curve") if p.get(key) is not None]

    def first_round_at(self, method: str, level: float) -> int | None:
        """The first round whose personalized mean is at least `level`."""
        return next((r for r, v in self.curve(method) if v >= level), None)


def compare(name: str) -> Comparison:
    data = raw(name)
    if "summaries" not in data:
        raise ValueError(f"docs: results '{name}' is not a benchmarks.compare comparison")
    return Comparison(name, data)


def expect_same_training(a: Comparison, b: Comparison, methods: Iterable[str]) -> None:
    """Fail unless `a` and `b` report the same fine-tuned result for each of `methods`: runs that
    differ only in which model a client answers with (the safeguard's answer) train the same models."""
    for method in methods:
        if a.ft(method) != b.ft(method):
            raise ValueError(f"docs: {a.name} and {b.name} differ in {method}'s fine-tuned models: "
                             "only the answer should separate them")


def expect_run_setting(run: Comparison, key: str, value: Any) -> None:
    """Fail unless the comparison `run` ran with `key` = `value`: a column labelled by the setting
    it varies cannot keep that label over a run made with another."""
    if run.settings.get(key) != value:
        raise ValueError(f"docs: {run.name} ran with {key} = {run.settings.get(key)!r}, not {value!r}")


# --- benchmarks.suite ------------------------------------------------------------------------------
# baselines_of (docs.render): the rows a suite row's Δ is taken against, max(FedAvg, FedAvg+FT,
# Local) run with the same model; a baseline a run lacks is left out of the max
BASELINES = baselines_of("fedavg")
# the label suffix of a graph method's rows run with `safeguard = "off"` beside the default rows
SAFEGUARD_OFF = " (safeguard off)"


@dataclass
class Suite:
    """A committed `benchmarks.suite` `suite.json`: one row per (setting, ρ, seed, label)."""

    folder: str
    data: dict[str, Any]
    baselines_from: Suite | None = field(default=None, repr=False)

    def rows(self, setting: str | None = None, rho: float | None = None, seed: int | None = None,
             label: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.data["results"]
                if (setting is None or r["setting"] == setting) and (rho is None or r["rho"] == rho)
                and (seed is None or r["seed"] == seed) and (label is None or r["label"] == label)]

    def row(self, setting: str, rho: float, seed: int, label: str) -> dict[str, Any]:
        found = self.rows(setting, rho, seed, label)
        if len(found) != 1:
            raise KeyError(f"docs: {self.folder}/suite.json: {len(found)} rows for {label} on "
                           f"{setting} ρ={rho:g} seed {seed}")
        return found[0]

    @property
    def settings(self) -> list[str]:
        """The settings of the suite, in its order (each folder's `settings`, joined)."""
        return list(dict.fromkeys(self.data.get("settings") or [r["setting"] for r in self.data["results"]]))

    @property
    def rhos(self) -> list[float]:
        return list(dict.fromkeys(self.data.get("rhos") or [r["rho"] for r in self.data["results"]]))

    def cells(self) -> list[tuple[str, float]]:
        """(setting, ρ) of every cell some row ran, in the suite's order."""
        ran = {(r["setting"], r["rho"]) for r in self.data["results"]}
        return [(s, rho) for s in self.settings for rho in self.rhos if (s, rho) in ran]

    def labels(self, setting: str | None = None, rho: float | None = None) -> list[str]:
        """Every row label (method, or e.g. `ifca (C=3)`), in the order the suite ran them."""
        return list(dict.fromkeys(r["label"] for r in self.rows(setting, rho)))

    def has(self, label: str, setting: str | None = None, rho: float | None = None) -> bool:
        return bool(self.rows(setting, rho, label=label))

    def paper(self, method: str) -> str:
        """The row of `method` with its paper's behaviour: `<method> (safeguard off)` where the suite
        holds one (the runs before the per-client safeguard, relabelled), else `<method>`."""
        return method + SAFEGUARD_OFF if self.has(method + SAFEGUARD_OFF) else method

    def best_baseline(self, setting: str, rho: float, label: str = "fedavg",
                      seeds: Sequence[int] | None = None) -> float | None:
        """Seed mean of max(baselines of `label`) on a cell: what the Δ of `label` is taken from."""
        base_suite = self.baselines_from or self
        values = []
        for seed in sorted({r["seed"] for r in base_suite.rows(setting, rho)}):
            if seeds is not None and seed not in seeds:
                continue
            base = [b["mean"] for b in base_suite.rows(setting, rho, seed)
                    if b["label"] in baselines_of(label) and b["mean"] is not None]
            if base:
                values.append(max(base))
        return mean(values)

    def seeds(self, setting: str, rho: float, label: str) -> list[int]:
        return sorted(r["seed"] for r in self.rows(setting, rho, label=label))

    def value(self, setting: str, rho: float, label: str, key: str = "mean",
              seeds: Sequence[int] | None = None) -> float | None:
        """Seed mean of a row field (`mean`, `worst`)."""
        rows = [r for r in self.rows(setting, rho, label=label) if seeds is None or r["seed"] in seeds]
        if not rows:
            raise KeyError(f"docs: {self.folder}/suite.json has no {label} on {setting} ρ={rho:g}")
        return mean(r[key] for r in rows)

    def share(self, setting: str, rho: float, label: str,
              seeds: Sequence[int] | None = None) -> float | None:
        """Seed mean of the last round's share of the graph inside the true structure."""
        rows = [r for r in self.rows(setting, rho, label=label) if seeds is None or r["seed"] in seeds]
        return mean(r["share"][-1] for r in rows if r["share"] and r["share"][-1] is not None)

    def delta(self, setting: str, rho: float, label: str,
              seeds: Sequence[int] | None = None) -> float | None:
        """Seed mean of (mean − max(FedAvg, FedAvg+FT, Local) of the same seed), as the suite's Δ
        matrix (`baselines_of`); the baselines come from `baselines_from` when this suite did not
        run them."""
        base_suite = self.baselines_from or self
        deltas = []
        for r in self.rows(setting, rho, label=label):
            if seeds is not None and r["seed"] not in seeds:
                continue
            base = [b["mean"] for b in base_suite.rows(setting, rho, r["seed"])
                    if b["label"] in baselines_of(label) and b["mean"] is not None]
            if r["mean"] is not None and base:
                deltas.append(r["mean"] - max(base))
        return mean(deltas)


def suite(*folders: str, baselines_from: Sequence[str] = ()) -> Suite:
    """The suite.json of `benchmarks/results/<folder>/`, or the rows of several joined (suites run
    one seed or setting per folder); `baselines_from`: the folders whose FedAvg and Local rows the
    Δ uses (suites that ran one method only)."""
    stored = [raw(f"{folder}/suite") for folder in folders]
    rows = [row for data in stored for row in data["results"]]
    settings = list(dict.fromkeys(s for data in stored for s in data.get("settings", ())))
    rhos = list(dict.fromkeys(rho for data in stored for rho in data.get("rhos", ())))
    return Suite(" + ".join(folders), {"results": rows, "settings": settings, "rhos": rhos},
                 suite(*baselines_from) if baselines_from else None)


MISSING = object()  # a setting the run's code did not have yet


def expect_setting(folders: Sequence[str], key: str, allowed: Sequence[Any]) -> None:
    """Fail unless every per-cell run of these suite folders recorded `key` as one of `allowed`
    (`MISSING`: the key did not exist when it ran). A block that labels a folder by the setting it
    ran with ("k = 5", "γ = 1") then cannot keep that label over a folder re-run with another."""
    for folder in folders:
        cells = [p for p in sorted((RESULTS / folder).glob("*.json")) if p.name != "suite.json"]
        if not cells:
            raise FileNotFoundError(f"docs: no per-cell results in benchmarks/results/{folder}/")
        for path in cells:
            touch(path)
            value = _load(path).get("settings", {}).get(key, MISSING)
            if value not in allowed:
                shown = "missing" if value is MISSING else repr(value)
                raise ValueError(f"docs: {path.relative_to(REPO)} ran with {key} = {shown}, not "
                                 f"{' or '.join('missing' if a is MISSING else repr(a) for a in allowed)}"
                                 " as the page says")


# --- committed Markdown of runs whose JSON was not committed ---------------------------------------
@dataclass
class MarkdownRun:
    """The method table of a committed `benchmarks.compare` Markdown page (no JSON committed)."""

    name: str
    columns: list[str]
    values: dict[str, dict[str, float | None]]

    def get(self, method: str, column: str = "mean") -> float | None:
        if method not in self.values:
            raise KeyError(f"docs: {self.name}.md has no method '{method}'")
        return self.values[method][column]


_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")


def markdown_run(name: str) -> MarkdownRun:
    """The first `| method | mean | ...` table of `benchmarks/results/<name>.md`, for runs whose
    JSON was never committed. Refused when the JSON exists: then the JSON is the source."""
    if (RESULTS / f"{name}.json").exists():
        raise ValueError(f"docs: {name}.json is committed: read it with compare()")
    path = _resolve(name, ".md")
    _read(path)
    lines = [line for line in path.read_text().splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("| method |"))
    columns = [c.strip() for c in lines[start].strip("|").split("|")]
    values: dict[str, dict[str, float | None]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        values[cells[0]] = {col: (float(cell) if _NUMBER.match(cell) else None)
                            for col, cell in zip(columns[1:], cells[1:])}
    return MarkdownRun(name, columns, values)


# --- links -----------------------------------------------------------------------------------------
# results folders with a page on the site (docs/hooks.py FOLDERS)
SITE_FOLDERS = (RESULTS, RESULTS / "suite", RESULTS / "suite" / "diagnosis", RESULTS / "method-safeguard")


def site_page(path: Path) -> str | None:
    """The site path (under results/) of a committed results file, when the site shows it."""
    if path.parent not in SITE_FOLDERS:
        return None
    page = path.with_suffix(".md")
    if path.suffix == ".json":
        from docs.gen import renderer  # the page is rendered from the JSON, or the committed .md

        if renderer(path, _load(path)) is None and not page.exists():
            return None
    elif not page.exists():
        return None
    return page.relative_to(RESULTS).as_posix()


# the link prefix of README.md (docs.gen.README_PREFIX): results link to their committed Markdown
README_PREFIX = "benchmarks/"


def docs_link(prefix: str) -> str:
    """The prefix of a link from a generated block to a docs page (`docs/` in README.md)."""
    return "docs/" if prefix == README_PREFIX else prefix


def source_link(path: Path, prefix: str) -> str:
    """`path` as a link to its results page, or as a path when the site has none (in README.md:
    when no Markdown of it is committed)."""
    rel = path.relative_to(REPO).as_posix()
    page = site_page(path)
    if page and prefix == README_PREFIX and not (RESULTS / page).is_file():
        page = None
    label = path.relative_to(RESULTS).as_posix()
    return f"[`{label}`]({prefix}results/{page})" if page else f"`{rel}`"
