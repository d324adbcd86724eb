"""The documentation site: it builds with warnings as errors (broken internal links and anchors
included), its generated parts are up to date, every results page is its committed JSON rendered by
the benchmark that wrote it, every number of a README or docs table row that cites results is in
those results' JSON, and every section moved out of the README has its page."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from docs import gen
from tests.conftest import REPO

README = REPO / "README.md"
README_MAX_LINES = 200


def test_the_site_builds_strict_with_every_internal_link_resolved(tmp_path):
    """`mkdocs build --strict` (mkdocs.yml: missing pages, links and anchors are warnings): about
    20 s on two loaded cores."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and not warnings, "\n".join(warnings) or done.stderr[-3000:]
    site = tmp_path / "site"
    for page in ("index.html", "methods/sfl/index.html", "results/default-job/index.html",
                 "results/index.html", "api/index.html"):
        assert (site / page).is_file(), page
    sfl = (site / "methods/sfl/index.html").read_text()
    assert "sfl.staleness-decay" in sfl and 'class="mermaid"' in sfl
    api = (site / "api/index.html").read_text()
    assert "sections" in api and "MethodSettings" in api and "TensorBoardLog" in api  # rendered from the docstrings


def test_the_committed_generated_parts_are_up_to_date():
    assert gen.main(["--check"]) == 0, "run `python -m docs.gen`"


def renderable_results() -> list[Path]:
    return [p for p in gen.result_files() if gen.render_result(p) is not None]


def test_every_renderable_results_page_is_its_json_rendered():
    """The committed Markdown of every results JSON with a renderer is what its benchmark renders
    from that JSON, plus notes added by hand (which the site shows after the rendering); a block
    that differs (not only added) may change words, never a number."""
    paths = renderable_results()
    assert len(paths) > 100
    differ = []
    for path in paths:
        committed = path.with_suffix(".md")
        if not committed.exists():
            continue  # not committed: reproduced by `python -m docs.gen results --out DIR`
        rendered = gen.renderer(path, json.loads(path.read_text()))()
        for kind, old, new in gen.line_changes(rendered, committed.read_text()):
            if kind != "insert" and _numbers("\n".join(old)) != _numbers("\n".join(new)):
                differ.append(f"{path.relative_to(REPO)}: {old[:1]} → {new[:1]}")
    assert differ == []


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", text)


def json_numbers(obj) -> list[float]:
    if isinstance(obj, dict):
        return [v for value in obj.values() for v in json_numbers(value)]
    if isinstance(obj, list):
        return [v for value in obj for v in json_numbers(value)]
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return [float(obj)]
    return []


def cited_rows() -> list[tuple[Path, str, list[Path]]]:
    """Table rows of the README and the docs pages that link committed results."""
    rows = []
    for page in [README, *gen.pages()]:
        for line in page.read_text().splitlines():
            if not line.startswith("|"):
                continue
            names = re.findall(r"\((?:[./]*benchmarks/results/|(?:\.\./)*results/)([\w./-]+)\.md\)", line)
            files = [gen.RESULTS / f"{name}.json" for name in names]
            if files and all(f.exists() for f in files):
                rows.append((page, line, files))
    return rows


def cited_values(path: Path) -> list[float]:
    """The numbers a results JSON shows: those of its page as its benchmark renders it (final
    metrics, seed means), else every number in the JSON."""
    rendered = gen.render_result(path)
    if rendered is None:
        return json_numbers(json.loads(path.read_text()))
    return [float(n) for n in re.findall(r"\d+\.\d+", rendered)]


def shown_numbers_missing(rows: list[tuple[Path, str, list[Path]]]) -> list[str]:
    """Each decimal number of each row (outside links and code) that no number shown by the row's
    cited results rounds to at its shown precision (a rendered value is itself rounded: + 0.005)."""
    wrong = []
    for page, line, files in rows:
        values = [v for f in files for v in cited_values(f)]
        text = re.sub(r"\[[^\]]*\]\([^)]*\)|`[^`]*`", "", line)
        for match in re.finditer(r"(?<![\w.=])(\d+\.\d+)(?![\w.])", text):
            shown = match.group(1)
            half = 0.5 * 10 ** -len(shown.split(".")[1]) + 0.005 + 1e-9
            if not any(abs(v - float(shown)) <= half for v in values):
                wrong.append(f"{page.name}: {shown} in {line[:60]}…")
    return wrong


def test_every_number_of_a_table_row_citing_results_is_in_their_json():
    rows = cited_rows()
    assert len(rows) >= 8
    assert shown_numbers_missing(rows) == []


def test_the_check_catches_a_number_that_is_not_in_the_cited_json():
    cited = [gen.RESULTS / "default-job.json"]
    assert shown_numbers_missing([(README, "| sfl 97.67 | fedavg 75.0 |", cited)]) == []
    assert shown_numbers_missing([(README, "| sfl 97.61 | fedavg 75.0 |", cited)]) == [
        "README.md: 97.61 in | sfl 97.61 | fedavg 75.0 |…"]


def test_the_readme_is_short_and_links_a_page_for_every_moved_section():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\((docs/[\w/.-]+\.md)(?:#[\w-]+)?\)", text)
    assert all((REPO / link).is_file() for link in links), links
    moved = {"getting-started", "datasets", "results-of-a-run", "reliability", "deploy",
             "robustness-suite", "benchmarks", "api", "methods/overview", "methods/flt", "methods/sfl",
             "methods/fedska", "methods/fedu", "methods/fedcg", "methods/baselines"}
    assert {f"docs/{name}.md" for name in moved} <= set(links)
