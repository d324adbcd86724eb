"""What a committed result file is, and its page: the schema of `benchmarks/results/**/*.json` and the
renderers the docs make its pages with, importing no benchmark code (the benchmarks import these
to write their Markdown, never the reverse).

Every result file is one JSON object: an envelope that says where it came from, and a body of its
kind.

- Envelope (`ENVELOPE`): `command` (the command line that produced it, as it was run: history, kept
  when a script moves), `machine` (CPU, cores, torch threads, library versions: `benchmarks.common.
  machine_facts`) and `code` (commit, local changes, code fingerprint); most also carry `name` (the
  file's stem) and `date`. Two kinds keep a shorter envelope, from before it was settled: a suite's
  `suite.json` has only `command` (its machine and code are in the head of its Markdown pages), and
  `what-leaves.json` keeps its envelope under `meta`.
- Body, by kind (`kind_of`):
  - `comparison` (`python -m benchmarks.compare`; the default job, the method pages, the paper
    tables): `methods`, `nodes`, `overrides` (the `--set` keys), `settings` (the whole run config),
    `runs-dir` and `summaries` (one per method: final metrics and the per-round curve);
    rendered by `docs.results.compare`;
  - `suite` (`python -m benchmarks.suite`, a folder's `suite.json`): `seeds`, `rhos`, `settings`,
    `common` and `results` (one row per setting, ρ, seed and method label); its Δ matrix is
    `docs.results.suite.delta_table`;
  - `study` (a script of `benchmarks/studies/`): the study's own tables (mostly `rows`); those named
    in `STUDY_PAGES` are rendered by their function in `docs.results.studies`, the others' page is
    their committed Markdown.

`tests/test_results_schema.py` checks every committed result file against this.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

ENVELOPE = ("command", "machine", "code")
COMPARISON = ("name", *ENVELOPE, "date", "methods", "nodes", "overrides", "settings", "runs-dir",
              "summaries")
SUITE = ("command", "seeds", "rhos", "settings", "common", "results")

# results file-name prefix -> (the study that wrote it, its renderer in docs.results.studies, the
# body keys the renderer takes after the whole result)
STUDY_PAGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("fedcg-styles", "fedcg_domains", ("rows",)),
    ("fedcg-rotated", "fedcg_domains", ("rows",)),
    ("fedcg-classifier-ceiling", "fedcg_ceiling", ("rows",)),
    ("fedcg-discovery", "fedcg_discovery", ("rows",)),
    ("aggregation-floor", "aggregation_floor", ("rows",)),
    ("flt-thresholds", "flt_thresholds", ("rows",)),
    ("flt-structure", "flt_structure", ("rows",)),
    ("flt-scale", "flt_scale", ("fcr", "aggregation")),
    ("sfl-scale", "sfl_scale", ("rows",)),
    ("first-run", "first_run", ()),
    ("untuned", "untuned", ("rows",)),
    ("slice-cost", "slice_cost", ("rows",)),
)


def kind_of(path: Path, data: Any) -> str:
    """`comparison`, `suite` or `study` (see the module's docstring); ValueError naming the file
    when it is not a JSON object."""
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a result file is one JSON object, not {type(data).__name__}")
    if "summaries" in data:
        return "comparison"
    if path.name == "suite.json":
        return "suite"
    return "study"


def problems(path: Path, data: Any) -> list[str]:
    """What the result file at `path` (its parsed JSON `data`) lacks of its kind's schema; [] when
    it has it all."""
    try:
        kind = kind_of(path, data)
    except ValueError as err:
        return [str(err)]
    if kind == "comparison":
        required: tuple[str, ...] = COMPARISON
    elif kind == "suite":
        required = SUITE
    else:
        envelope = data.get("meta", {}) if path.name == "what-leaves.json" else data
        missing = [f"{path}: study result without envelope key '{key}' (every result file has "
                   f"{', '.join(ENVELOPE)})" for key in ENVELOPE if key not in envelope]
        page = study_page(path)
        if page is not None:
            missing += [f"{path}: {page[0]} result without '{key}', which its renderer "
                        f"docs.results.studies.{page[0]} reads" for key in page[1] if key not in data]
        return missing
    return [f"{path}: {kind} result without key '{key}' (a {kind} has {', '.join(required)})"
            for key in required if key not in data]


def study_page(path: Path) -> tuple[str, tuple[str, ...]] | None:
    """(renderer name, body keys) of a study result with a page renderer, from its file name."""
    for prefix, study, keys in STUDY_PAGES:
        if path.stem.startswith(prefix):
            return study, keys
    return None


def renderer(path: Path, data: Any) -> Callable[[], str] | None:
    """The function that renders the result file at `path` (its parsed JSON `data`) into its Markdown
    page, or None for results without a page renderer (a suite's `suite.json`, whose pages are its
    tables; studies not in `STUDY_PAGES`, whose committed Markdown is the page)."""
    if not isinstance(data, dict):
        return None
    if "summaries" in data:
        from docs.results import compare

        return lambda: compare.markdown(data, data["summaries"])
    page = study_page(path)
    if page is None or path.name == "suite.json":
        return None
    study, keys = page
    if not all(key in data for key in keys):
        return None
    from docs.results import studies

    render = getattr(studies, study)
    return lambda: render(data, *(data[key] for key in keys)) if keys else render(data, data)


def plot(path: Path, data: Any, out: Path) -> bool:
    """Draw the per-round plot of the result file at `path` into `out` (PNG), as the benchmark that
    wrote it does; False when it has none."""
    if not isinstance(data, dict):
        return False
    if "summaries" in data:
        from docs.results import compare

        compare.plot(data["summaries"], out, title=data["name"])
        return True
    if path.stem.startswith(("fedcg-styles", "fedcg-rotated")) and "rows" in data:
        from docs.results import studies

        studies.fedcg_domains_plot(data["rows"], out, data["name"])
        return True
    return False
