"""docs/papers.md: each paper table as its config runs it (`benchmarks/papers/<name>.toml`).

A page names a table by a marker, filled by `python -m docs.gen` (and at every build):

    <!-- gen:paper fedska-table1 -->  ...  <!-- /gen -->

Everything shown comes from the config and the committed results, never typed on the page: the
command of each group of cells, the paper's numbers (the config's `[reported]` table and each cell's
`reported` = { method = value }), Bouquet's numbers where a committed comparison
`benchmarks/results/<name>-<cell>-seed<N>.json` exists (read through `docs.blocks.data`, each row
linking its results page), the data set each other cell needs, and the settings that differ from the
paper (the config's `differences`).

The config's `[reported]` table:

- `metric`: what the paper's numbers are (e.g. "mean test accuracy (%)");
- `format`: how one method's numbers are written, `{field}` per value of the method's entry
  (default `{value}`: the entry is one number);
- `names`: the paper's name of a method, where it is not the method's own (e.g. local = "Separate");
- `bouquet`: how Bouquet's numbers are written, `{path}` per value of a method's final summary
  (`personalized.mean`, `regression.mae-h12`, `global-accuracy`), and `bouquet-metric`: what they are.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from docs.blocks.data import DASH, MISSING, REPO, RESULTS, compare, num, source_link, table
from strategies.shared.run_config import flat_keys

PAPERS = REPO / "benchmarks" / "papers"
DIGITS = 2
# data set → (its name on the page, whether a run needs its files at `data-root`)
DATA: dict[str, tuple[str, bool]] = {
    "mnist": ("MNIST", False),
    "emnist": ("EMNIST balanced", True),
    "cifar10": ("CIFAR-10", True),
    "femnist": ("LEAF FEMNIST", True),
    "shakespeare": ("LEAF Shakespeare", True),
    "celeba": ("LEAF CelebA", True),
    "metr-la": ("METR-LA", True),
    "pems-bay": ("PEMS-BAY", True),
}
# an example folder for `--set data-root=...` in the commands
DATA_ROOT = "/data"
FIELD = re.compile(r"\{([^{}]+)\}")
REPORTED_KEYS = {"metric", "format", "names", "bouquet", "bouquet-metric"}


def load(name: str) -> dict[str, Any]:
    """The config `benchmarks/papers/<name>.toml`, its `[reported]` table checked (ValueError naming
    the file and key)."""
    path = PAPERS / f"{name}.toml"
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PAPERS.glob("*.toml")))
        raise FileNotFoundError(f"docs: no paper table {where}; the configs: {known}")
    grid = tomllib.loads(path.read_text())
    reported = grid.get("reported")
    if not isinstance(reported, dict) or not {"metric", "bouquet", "bouquet-metric"} <= set(reported):
        raise ValueError(f"docs: {where} needs a [reported] table with metric, bouquet and bouquet-metric")
    unknown = sorted(set(reported) - REPORTED_KEYS)
    if unknown:
        raise ValueError(f"docs: {where} [reported] has keys {unknown}; allowed: "
                         f"{', '.join(sorted(REPORTED_KEYS))}")
    if not isinstance(grid.get("differences"), list) or not grid["differences"]:
        raise ValueError(f"docs: {where} needs differences = [...] (the settings that differ from the paper)")
    for cell in grid["cells"]:
        if "label" not in cell or not isinstance(cell.get("reported"), dict):
            raise ValueError(f"docs: {where} cell '{cell.get('name')}' needs a label and "
                             "reported = { method = value, ... }")
        extra = sorted(set(cell["reported"]) - set(cell.get("methods", grid["methods"])))
        if extra:
            raise ValueError(f"docs: {where} cell '{cell['name']}' reports {extra}, which it does not run")
    grid["path"] = where.as_posix()
    return grid


def cell_settings(grid: dict[str, Any], cell: dict[str, Any]) -> dict[str, Any]:
    """The run config of a cell, as `benchmarks.compare.grid_runs` builds it (`common`, then the
    cell's `set`)."""
    return {**flat_keys(grid.get("common", {})), **flat_keys(cell.get("set", {}))}


def data_of(grid: dict[str, Any], cell: dict[str, Any]) -> tuple[str, bool]:
    dataset = cell_settings(grid, cell).get("dataset")
    if dataset not in DATA:
        raise ValueError(f"docs: {grid['path']} cell '{cell['name']}': data set {dataset!r} has no name "
                         f"in docs/blocks/papers.py DATA ({', '.join(DATA)})")
    return DATA[dataset]


def fill(template: str, value_of: Any, where: str) -> str:
    """`template` with each `{key}` replaced by `value_of(key)` at DIGITS decimals (— when None);
    KeyError naming `where` and the key when there is none."""
    def one(match: re.Match[str]) -> str:
        try:
            return num(value_of(match.group(1)), DIGITS)
        except (KeyError, TypeError):
            raise KeyError(f"docs: {where} has no '{match.group(1)}' for '{template}'") from None
    return FIELD.sub(one, template)


def paper_value(grid: dict[str, Any], cell: dict[str, Any], method: str) -> str:
    """The paper's number(s) of `method` in `cell`, as the config's format writes them (blank: not
    reported)."""
    entry = cell["reported"].get(method)
    if entry is None:
        return ""
    values = entry if isinstance(entry, dict) else {"value": entry}
    template = grid["reported"].get("format", "{value}")
    return fill(template, values.__getitem__, f"{grid['path']} cell '{cell['name']}' {method}")


def summary_value(final: dict[str, Any], path: str) -> float | None:
    """A value of a method's final summary by its dotted path (None where the run did not record it)."""
    value: Any = final
    for key in path.split("."):
        if not isinstance(value, dict):
            raise KeyError(path)
        value = value.get(key)
        if value is None:
            return None
    return value


def committed(grid: dict[str, Any], name: str, cell: dict[str, Any]) -> list[str]:
    """The committed comparisons of a cell, one per seed of the config that ran."""
    stems = [f"{name}-{cell['name']}-seed{seed}" for seed in grid.get("seeds", [0])]
    return [stem for stem in stems if (RESULTS / f"{stem}.json").is_file()]


def checked_run(grid: dict[str, Any], cell: dict[str, Any], stem: str) -> Any:
    """The committed comparison `stem` of a cell, refused (ValueError naming the file and key) unless
    it ran exactly the cell's settings and seed (no `--set` on top) and only the config's methods:
    the page shows a run's numbers as the config's."""
    run = compare(stem)
    seed = int(stem.rsplit("seed", 1)[1])
    expected = {**cell_settings(grid, cell), "seed": seed}
    ran = run.data.get("overrides", {})
    differ = sorted(k for k in set(expected) | set(ran) if ran.get(k, MISSING) != expected.get(k, MISSING))
    if differ:
        shown = ", ".join(f"{k} = {ran.get(k, 'unset')!r} (config: {expected.get(k, 'unset')!r})"
                          for k in differ)
        raise ValueError(f"docs: benchmarks/results/{stem}.json did not run {grid['path']} cell "
                         f"'{cell['name']}' as configured: {shown}")
    extra = sorted(set(run.methods) - set(cell.get("methods", grid["methods"])))
    if extra:
        raise ValueError(f"docs: benchmarks/results/{stem}.json ran {extra}, which {grid['path']} "
                         f"cell '{cell['name']}' does not list")
    return run


def not_run(grid: dict[str, Any], name: str, cell: dict[str, Any]) -> list[str]:
    """The methods of a cell that no committed run of it ran (in the config's order)."""
    ran = {m for stem in committed(grid, name, cell) for m in compare(stem).methods}
    return [m for m in cell.get("methods", grid["methods"]) if m not in ran]


def method_header(grid: dict[str, Any], method: str) -> str:
    paper_name = grid["reported"].get("names", {}).get(method)
    return f"{paper_name} (`{method}`)" if paper_name else f"`{method}`"


def commands(grid: dict[str, Any], name: str) -> list[str]:
    """One command per run of consecutive cells that all need, or all do not need, their data at
    `data-root` (`--set data-root=...` for those that do); all cells: no `--cells`."""
    groups: list[tuple[bool, list[str]]] = []
    for cell in grid["cells"]:
        needs_root = data_of(grid, cell)[1]
        if groups and groups[-1][0] == needs_root:
            groups[-1][1].append(cell["name"])
        else:
            groups.append((needs_root, [cell["name"]]))
    lines = []
    for needs_root, cells in groups:
        line = f"python -m benchmarks.compare --config {grid['path']}"
        if len(groups) > 1:
            line += f" --cells {','.join(cells)}"
        if needs_root:
            line += f" --set data-root={DATA_ROOT}"
        lines.append(line)
    return lines


def pending(grid: dict[str, Any], name: str) -> list[str]:
    """Lines naming the cells that need no `data-root` but have no committed run, and the cells
    committed with part of their methods, each with the command that runs it (one results file per
    cell and seed: a cell's command re-runs all its methods)."""
    lines = []
    for cell in grid["cells"]:
        if data_of(grid, cell)[1]:
            continue
        command = f"`python -m benchmarks.compare --config {grid['path']} --cells {cell['name']}`"
        if not committed(grid, name, cell):
            lines.append(f"- {cell['label']} (`{cell['name']}`): not run here yet; {command}.")
        elif not_run(grid, name, cell):
            left = ", ".join(f"`{m}`" for m in not_run(grid, name, cell))
            lines.append(f"- {cell['label']} (`{cell['name']}`): committed without {left} (— in "
                         f"Bouquet's table); {command} runs the whole cell, all its methods, into "
                         "the same results file.")
    if not lines:
        return []
    return ["Not yet run here, though the data is here:", "", *lines, ""]


def paper_table(name: str, prefix: str = "") -> str:
    """The Markdown of paper table `name` (a config stem): its setting, commands, the paper's
    numbers, Bouquet's committed numbers and what differs from the paper."""
    grid = load(name)
    methods = grid["methods"]
    common = flat_keys(grid.get("common", {}))
    read: list[Path] = []
    out = [
        f"`{grid['path']}`: {grid['paper']}, {'Tables' if '-' in str(grid['table']) else 'Table'} "
        f"{grid['table']}: {grid['title']}. Methods "
        + ", ".join(method_header(grid, m) for m in methods)
        + f"; seeds {', '.join(str(s) for s in grid.get('seeds', [0]))}. Every cell runs with "
        + " ".join(f"`{k}={v}`" for k, v in common.items()) + ", then its own settings:",
        "",
    ]
    rows = []
    for cell in grid["cells"]:
        data, needs_root = data_of(grid, cell)
        own = " ".join(f"`{k}={v}`" for k, v in flat_keys(cell.get("set", {})).items())
        if "methods" in cell:
            own += " methods " + ", ".join(f"`{m}`" for m in cell["methods"])
        if cell.get("note"):
            own += f" ({cell['note']})"
        ran = committed(grid, name, cell)
        if ran:
            for stem in ran:
                checked_run(grid, cell, stem)
            here = "committed: " + ", ".join(f"seed {stem.rsplit('seed', 1)[1]}" for stem in ran)
            left = not_run(grid, name, cell)
            if left:
                here += "; not run yet: " + ", ".join(f"`{m}`" for m in left)
        elif needs_root:
            here = f"not run here: needs {data} at `data-root`"
        else:
            here = f"not run here yet ({data} needs no `data-root`)"
        rows.append((f"{cell['label']} (`{cell['name']}`)", data, own or DASH, here))
    out += [table(("cell", "data set", "its settings", "Bouquet"), rows, "llll"), ""]
    out += ["```bash", *commands(grid, name), "```", ""]
    out += pending(grid, name)
    out += [f"The paper, {grid['reported']['metric']} (blank: not reported):", ""]
    out.append(table(("cell", *(method_header(grid, m) for m in methods)),
                     [(cell["label"], *(paper_value(grid, cell, m) for m in methods))
                      for cell in grid["cells"]]))
    bouquet_rows, produced = [], []
    for cell in grid["cells"]:
        for stem in committed(grid, name, cell):
            run = checked_run(grid, cell, stem)
            produced.append(f"- `{stem}`: `{run.data['command']}`")
            read.append(RESULTS / f"{stem}.json")
            values = []
            for method in methods:
                if method not in run.methods:
                    values.append(DASH)
                    continue
                final = run.summary(method)["final"]
                values.append(fill(grid["reported"]["bouquet"], lambda p, f=final: summary_value(f, p),
                                   f"{stem}.json {method}"))
            bouquet_rows.append((f"{cell['label']}: [`{stem}`]({prefix}results/{stem}.md)", *values))
    if bouquet_rows:
        out += ["", f"Bouquet, {grid['reported']['bouquet-metric']}:", "",
                table(("run", *(method_header(grid, m) for m in methods)), bouquet_rows),
                "", "Each run's command (as its results file records it; — above: a method it did "
                "not run):", "", *produced]
    else:
        out += ["", "Bouquet: no cell of this table has a committed run yet."]
    out += ["", "Settings that differ from the paper:", "", *(f"- {d}" for d in grid["differences"])]
    sources = [f"`{grid['path']}`", *(source_link(p, prefix) for p in read)]
    out += ["", f"<small>Generated from {', '.join(sources)}.</small>"]
    return "\n".join(out)
