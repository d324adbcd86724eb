"""The generated parts of the documentation, from the code and the committed results.

- Settings tables: from each method's settings model (`strategies.shared.registry.sections()`): key,
  allowed values, default and the comment beside the field in its source.
- Results: every committed results JSON in `benchmarks/results/` is rendered into its page by the
  renderer of its kind in `docs.results` (the schema of a result file; `docs.results.compare`,
  `docs.results.studies`, ...: the same functions the benchmark that wrote it writes its Markdown
  with), so a results page's numbers are the JSON's. Compact tables of comparisons go into the
  method pages between markers.

Markers in a docs page or in README.md, filled in place by `python -m docs.gen` (and, for the docs
pages, at every build by `docs/hooks.py`; `python -m docs.gen --check` fails when a committed page is
stale). README.md links results as `benchmarks/results/<name>.md` (the committed Markdown on GitHub),
a docs page as `results/<name>.md` (the site's page):

    <!-- gen:settings SECTION -->  ...  <!-- /gen -->
    <!-- gen:results NAME [NAME ...] -->  ...  <!-- /gen -->
    <!-- gen:method-results METHOD -->  ...  <!-- /gen -->  (every committed comparison it ran in)
    <!-- gen:suite-delta FOLDER -->  ...  <!-- /gen -->   (the suite's Δ matrix from its suite.json)
    <!-- gen:block NAME -->  ...  <!-- /gen -->  (a table or sentences of the method pages that cite
                                                  committed results: docs/blocks/)
    <!-- gen:keys -->  ...  <!-- /gen -->  (every run-config key, from RunConfig and the methods'
                                           settings models: docs/keys.py)
    <!-- gen:paper CONFIG -->  ...  <!-- /gen -->  (a paper table from benchmarks/papers/CONFIG.toml
                                                  and its committed runs: docs/blocks/papers.py)

`python -m docs.gen results --out DIR` re-renders every results Markdown file and plot (Markdown
and PNG) from the committed JSON into DIR; the suite's per-cell Markdown and plots are not committed,
this command reproduces them.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import json
import re
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from docs import results
from docs.render import markdown_table
from docs.results import compare
from docs.results.suite import delta_table
# the link prefix of README.md: `{prefix}results/<name>.md` is then `benchmarks/results/<name>.md`
from docs.blocks.data import README_PREFIX, touch

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"
RESULTS = REPO / "benchmarks" / "results"
MARKER = re.compile(r"<!-- gen:([\w-]+)((?: (?!-->)[^ \n]+)*) -->\n.*?<!-- /gen -->", re.S)

# --- results ---------------------------------------------------------------------------------------
def renderer(path: Path, data: dict[str, Any]) -> Callable[[], str] | None:
    """The function that renders the results JSON at `path` into its Markdown page, or None for
    results without a page renderer (their committed Markdown is the page): `docs.results`."""
    return results.renderer(path, data)


def render_result(path: Path) -> str | None:
    """The page of the results JSON at `path`: rendered from the JSON, followed by the notes written
    into its committed Markdown by hand (`added_notes`); None when it has no renderer."""
    data = json.loads(path.read_text())
    render = renderer(path, data) if isinstance(data, dict) else None
    if render is None:
        return None
    text = render().rstrip() + "\n"
    committed = path.with_suffix(".md")
    notes = added_notes(text, committed.read_text()) if committed.exists() else []
    if notes:
        text += "\n" + "\n\n".join(notes) + "\n"
    return text


def line_changes(rendered: str, committed: str) -> list[tuple[str, list[str], list[str]]]:
    """(kind, rendered lines, committed lines) of every block where the committed Markdown differs
    from the rendering: `insert` = text added by hand; `replace` / `delete` = the file no longer is
    what its JSON renders to."""
    a, b = rendered.rstrip().splitlines(), committed.rstrip().splitlines()
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    return [(kind, a[i1:i2], b[j1:j2]) for kind, i1, i2, j1, j2 in matcher.get_opcodes()
            if kind != "equal"]


def added_notes(rendered: str, committed: str) -> list[str]:
    """The blocks of the committed Markdown that its JSON does not render (notes added by hand)."""
    return ["\n".join(new).strip() for kind, _, new in line_changes(rendered, committed)
            if kind == "insert" and "\n".join(new).strip()]


def plot_result(path: Path, out: Path) -> bool:
    """Draw the per-round plot of the results JSON at `path` into `out` (PNG), the way its benchmark
    does; False when it has none."""
    return results.plot(path, json.loads(path.read_text()), out)


def result_files(root: Path = RESULTS) -> Iterator[Path]:
    """Every results JSON under `root`, sorted."""
    yield from sorted(root.rglob("*.json"))


def regenerate(out: Path, root: Path = RESULTS, plots: bool = True) -> int:
    """Write every renderable results page (and plot) of `root` into `out`, keeping the folders."""
    count = 0
    for path in result_files(root):
        text = render_result(path)
        if text is None:
            continue
        target = out / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.with_suffix(".md").write_text(text)
        if plots:
            plot_result(path, target.with_suffix(".png"))
        count += 1
    return count


def first_table(markdown: str) -> str:
    """The first Markdown table of a page."""
    lines, table = markdown.splitlines(), []
    for line in lines:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    return "\n".join(table)


def results_table(name: str, link_prefix: str = "") -> str:
    """The table of the committed results `benchmarks/results/<name>.json` under a line linking its
    page: a comparison's per-method table (with its setting), else the first table its benchmark
    renders from the JSON."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"docs: results '{name}' not found: no {path.relative_to(REPO)}")
    touch(path)
    data = json.loads(path.read_text())
    link = f"[`{name}`]({link_prefix}results/{name}.md)"
    if "summaries" not in data:
        text = render_result(path)
        if text is None:
            raise ValueError(f"docs: results '{name}' has no renderer (docs.results.STUDY_PAGES)")
        return f"{link}\n\n{first_table(text)}"
    s = data["settings"]
    lines = [
        f"{link}: {s['dataset']}, `{s['partition']}`, {s['num-clients']} clients, `{s['model']}`, "
        f"{s['num-rounds']} rounds, fraction-train {s['fraction-train']}, seed {s['seed']}",
        "",
        *compare.summary_table(data["summaries"]),
    ]
    return "\n".join(lines)


def method_results(method: str, link_prefix: str = "") -> str:
    """Every committed comparison that ran `method`: its setting, the method's mean / worst 5%
    personalized accuracy, FedAvg's mean and the best method's (regression: MAE, lower is better)."""
    rows = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or method not in data.get("methods", ()) or "summaries" not in data:
            continue
        summaries = {s["method"]: s for s in data["summaries"]}
        s = data["settings"]
        setting = (f"{s['dataset']}, `{s['partition']}`, {s['num-clients']} clients, "
                   f"{s['num-rounds']} rounds, ρ {s['fraction-train']}")
        if compare.is_regression(data["summaries"]):
            def score(summary: dict[str, Any]) -> float | None:
                return (summary["final"].get("regression") or {}).get("mae")
            best = min((m for m in summaries if score(summaries[m]) is not None),
                       key=lambda m: score(summaries[m]))
            own = f"MAE {compare.num(score(summaries[method]), 3)}"
            fedavg = compare.num(score(summaries["fedavg"]), 3) if "fedavg" in summaries else compare.DASH
            shown = f"{best} ({compare.num(score(summaries[best]), 3)})"
        else:
            def score(summary: dict[str, Any]) -> float | None:
                return (summary["final"].get("personalized") or {}).get("mean")
            best = max((m for m in summaries if score(summaries[m]) is not None),
                       key=lambda m: score(summaries[m]))
            pers = summaries[method]["final"].get("personalized") or {}
            own = f"{compare.num(pers.get('mean'))} / {compare.num(pers.get('worst-5%'))}"
            fedavg = compare.num(score(summaries["fedavg"])) if "fedavg" in summaries else compare.DASH
            shown = f"{best} ({compare.num(score(summaries[best]))})"
        rows.append((f"[`{path.stem}`]({link_prefix}results/{path.stem}.md)", setting, own, fedavg, shown))
    if not rows:
        return (f"No committed `benchmarks.compare` comparison ran `{method}`; its results are in the "
                "sections above and in the robustness suite.")
    return "\n".join(markdown_table(["results", "setting", "mean / worst 5%", "FedAvg mean", "best (mean)"],
                                    "llrrl", rows))


def suite_delta(folder: str, link_prefix: str = "") -> str:
    """The robustness suite's Δ matrix, from `benchmarks/results/<folder>/suite.json`."""
    path = RESULTS / folder / "suite.json"
    if not path.exists():
        raise FileNotFoundError(f"docs: no suite results {path.relative_to(REPO)}")
    touch(path)
    table = delta_table(path)
    return f"[`{folder}/suite-delta`]({link_prefix}results/{folder}/suite-delta.md)\n\n{table}"


# --- settings --------------------------------------------------------------------------------------
def field_comments(model: type) -> dict[str, str]:
    """The comment of each field in the model's source: the `#` comment on its line, after any
    comment lines directly above it."""
    lines, _ = inspect.getsourcelines(model)
    tree = ast.parse(inspect.cleandoc("\n".join(line.rstrip("\n") for line in lines))
                     if lines[0].startswith(" ") else "".join(lines))
    source = inspect.cleandoc("".join(lines)).splitlines() if lines[0].startswith(" ") else \
        "".join(lines).splitlines()
    comments: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node in body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        above = []
        row = node.lineno - 2
        while row >= 0 and source[row].strip().startswith("#"):
            above.insert(0, source[row].strip().lstrip("#").strip())
            row -= 1
        end = source[node.end_lineno - 1]
        inline = end.split("#", 1)[1].strip() if "#" in end and not end.strip().startswith("#") else ""
        comments[node.target.id] = " ".join(part for part in (*above, inline) if part)
    return comments


def _allowed(field: Any) -> str:
    """The values a field accepts: a Literal's choices, or its type and bounds."""
    annotation = field.annotation
    if typing.get_origin(annotation) is typing.Literal:
        return ", ".join(f"`{choice}`" for choice in typing.get_args(annotation))
    name = getattr(annotation, "__name__", str(annotation))
    bounds = []
    for meta in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                bounds.append(f"{sign} {value}")
    return name + (f" ({', '.join(bounds)})" if bounds else "")


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    return f"`{value}`"


def settings_table(section: str) -> str:
    """The `<section>.*` run-config keys of a registered method: allowed values, default, meaning."""
    from strategies.shared import registry

    sections = registry.sections()
    if section not in sections:
        return common_settings_table(section, sorted(sections))
    model = sections[section]
    comments: dict[str, str] = {}
    for klass in reversed(model.__mro__):  # inherited fields keep their own comments
        if "model_fields" in vars(klass) or klass is model:
            try:
                comments.update(field_comments(klass))
            except (OSError, TypeError, SyntaxError, IndexError):
                pass
    rows = []
    for name, field in model.model_fields.items():
        key = f"{section}.{field.alias or name}"
        meaning = comments.get(name, "").replace("|", "\\|")
        rows.append((f"`{key}`", _allowed(field), _default(field.default), meaning))
    return "\n".join(markdown_table(["key", "allowed", "default", "meaning (from the source)"], "llll", rows))


def common_settings_table(prefix: str, sections: list[str]) -> str:
    """The common run-config keys named `<prefix>` or `<prefix>-*` (e.g. `safeguard`), as
    `settings_table` shows a method's section."""
    from strategies.shared.run_config import RunConfig

    comments = field_comments(RunConfig)
    fields = [(name, field) for name, field in RunConfig.model_fields.items()
              if (field.alias or name) == prefix or (field.alias or name).startswith(prefix + "-")]
    if not fields:
        raise KeyError(f"docs: no settings section or common keys '{prefix}'; sections: "
                       f"{', '.join(sections)}")
    rows = [(f"`{field.alias or name}`", _allowed(field), _default(field.default),
             comments.get(name, "").replace("|", "\\|")) for name, field in fields]
    return "\n".join(markdown_table(["key", "allowed", "default", "meaning (from the source)"], "llll", rows))


# --- markers ---------------------------------------------------------------------------------------
def link_prefix(page: Path) -> str:
    """The prefix of a results link on `page` (relative to docs/, or README.md's absolute path)."""
    if page == README:
        return README_PREFIX
    return "../" * (len(page.parts) - 1)


def fill(text: str, page: Path) -> str:
    """`text` (the page at `page`, relative to docs/; or README.md) with every marker's content
    regenerated."""
    prefix = link_prefix(page)

    def generated(match: re.Match[str]) -> str:
        kind, args = match.group(1), match.group(2).split()
        if kind == "settings":
            body = "\n\n".join(settings_table(section) for section in args)
        elif kind == "results":
            body = "\n\n".join(results_table(name, prefix) for name in args)
        elif kind == "method-results":
            body = "\n\n".join(method_results(method, prefix) for method in args)
        elif kind == "suite-delta":
            body = "\n\n".join(suite_delta(folder, prefix) for folder in args)
        elif kind == "block":
            from docs import blocks

            body = "\n\n".join(blocks.render(name, prefix) for name in args)
        elif kind == "paper":
            from docs.blocks.papers import paper_table

            body = "\n\n".join(paper_table(name, prefix) for name in args)
        elif kind == "keys" and page != README:
            from docs.keys import keys_tables

            body = keys_tables(DOCS, page)
        else:
            raise ValueError(f"docs/{page}: unknown marker 'gen:{kind}' "
                             "(allowed: settings, results, method-results, suite-delta, block, keys, paper)")
        return f"<!-- gen:{kind}{match.group(2)} -->\n{body}\n<!-- /gen -->"

    return MARKER.sub(generated, text)


def pages() -> Iterator[Path]:
    yield from sorted(p for p in DOCS.rglob("*.md"))


def generated_pages() -> Iterator[Path]:
    """Every page whose markers `python -m docs.gen` fills: the docs pages and README.md."""
    yield from pages()
    yield README


def _relative(path: Path) -> Path:
    return README if path == README else path.relative_to(DOCS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.gen", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 listing the pages whose generated parts are stale")
    pages_ = sub.add_parser("results", help="re-render every results page and plot from its JSON")
    pages_.add_argument("--out", type=Path, required=True, help="folder to write into")
    pages_.add_argument("--from", dest="root", type=Path, default=RESULTS,
                        help="results folder to render (default: benchmarks/results, all of it)")
    pages_.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "results":
        count = regenerate(args.out, root=args.root.resolve(), plots=not args.no_plots)
        print(f"{count} results pages written under {args.out}")
        return 0
    stale = []
    for path in generated_pages():
        text = path.read_text()
        new = fill(text, _relative(path))
        if new != text:
            stale.append(path.relative_to(REPO))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print("stale generated parts (run `python -m docs.gen`): " + ", ".join(map(str, stale)))
        return 1
    print(f"{'checked' if args.check else 'updated'}: {len(stale)} page(s) {'stale' if args.check else 'regenerated'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
