"""The documentation site: it builds with warnings as errors (broken internal links and anchors
included), loads no script from outside (Mermaid comes with it, so the diagrams render offline), its
generated parts are up to date, every results page is its committed JSON rendered by the benchmark
that wrote it, every number of a README or docs table row that cites results is in those results'
JSON, the method pages cite results only through generated blocks, no page of the site and not the
README writes a measured number by hand (only settings and definitions), and every section moved out
of the README has its page."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from docs import gen
from tests.conftest import REPO

README = REPO / "README.md"
README_MAX_LINES = 200


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built by `mkdocs build --strict` (mkdocs.yml: missing pages, links and anchors are
    warnings), once for this module: about 20 s on two loaded cores."""
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and not warnings, "\n".join(warnings) or done.stderr[-3000:]
    return out


def test_the_site_builds_strict_with_every_internal_link_resolved(site):
    for page in ("index.html", "methods/sfl/index.html", "results/default-job/index.html",
                 "results/index.html", "api/index.html"):
        assert (site / page).is_file(), page
    sfl = (site / "methods/sfl/index.html").read_text()
    assert "sfl.staleness-decay" in sfl and 'class="mermaid"' in sfl
    api = (site / "api/index.html").read_text()
    assert "sections" in api and "MethodSettings" in api and "TensorBoardLog" in api  # rendered from the docstrings


# --- Mermaid from the site itself: the diagrams render offline --------------------------------------
MERMAID = REPO / "docs" / "assets" / "mermaid"
SCRIPT_SRC = re.compile(r"<script\b[^>]*\bsrc=[\"']([^\"']+)[\"']", re.I)


def test_the_built_site_loads_no_script_from_outside(site):
    """Every `<script src>` of every page is a file of the site (Mermaid included: Material loads it
    from a CDN only when no global `mermaid` exists, and the site brings its own)."""
    outside, mermaid_pages = [], 0
    for page in site.rglob("*.html"):
        text = page.read_text()
        for src in SCRIPT_SRC.findall(text):
            if re.match(r"(?i)^(?:[a-z][a-z0-9+.-]*:|//)", src):
                outside.append(f"{page.relative_to(site)}: {src}")
            else:
                base = site if src.startswith("/") else page.parent  # 404.html: from the site root
                assert (base / src.split("?")[0].lstrip("/")).resolve().is_file(), (page, src)
        if 'class="mermaid"' in text:
            mermaid_pages += 1
            assert "assets/mermaid/mermaid.min.js" in text, page
    assert outside == []
    assert mermaid_pages >= 6
    assert (site / "assets" / "mermaid" / "LICENSE").is_file()  # the MIT license travels with it


def test_the_vendored_mermaid_is_the_recorded_release():
    import hashlib

    recorded = re.search(r"^sha256 ([0-9a-f]{64})$", (MERMAID / "SOURCE.txt").read_text(), re.M)
    from docs.hooks import mermaid_script

    digest = hashlib.sha256(mermaid_script()).hexdigest()
    assert recorded and digest == recorded.group(1)
    assert "MIT License" in (MERMAID / "LICENSE").read_text()


def mermaid_blocks() -> list[tuple[str, str]]:
    return [(p.name, block) for p in gen.pages()
            for block in re.findall(r"```mermaid\n(.*?)```", p.read_text(), re.S)]


def test_no_mermaid_message_holds_a_semicolon():
    """Mermaid ends a statement at `;`, so a message with one stops the whole diagram from
    rendering (the page then shows its source)."""
    blocks = mermaid_blocks()
    assert len(blocks) >= 6
    assert [name for name, block in blocks if ";" in block] == []


CHROMIUM = next((c for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium on this machine")
def test_every_diagram_renders_in_a_browser_with_no_network(site):
    """Headless Chromium with every host unresolvable: Material replaces each `<pre class=mermaid>`
    by the drawn diagram (`<div class=mermaid>`); a diagram that fails keeps its source."""
    for page in sorted(p for p in site.rglob("index.html") if 'class="mermaid"' in p.read_text()):
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=15000", "--dump-dom",
             page.as_uri()], capture_output=True, text=True, timeout=180).stdout
        drawn, failed = dom.count('<div class="mermaid">'), dom.count('<pre class="mermaid">')
        assert drawn >= 1 and failed == 0, f"{page.relative_to(site)}: {drawn} drawn, {failed} not"


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
    summaries = {s["method"]: s for s in json.loads(cited[0].read_text())["summaries"]}
    sfl, fedavg = (summaries[m]["final"]["personalized"]["mean"] for m in ("sfl", "fedavg"))
    shown = f"| sfl {sfl:.2f} | fedavg {fedavg:.1f} |"
    assert shown_numbers_missing([(README, shown, cited)]) == []
    wrong = f"| sfl {sfl - 0.06:.2f} | fedavg {fedavg:.1f} |"  # in no cited number's rounding
    assert shown_numbers_missing([(README, wrong, cited)]) == [
        f"README.md: {sfl - 0.06:.2f} in {wrong[:60]}…"]


def test_a_readme_row_refuses_to_cite_a_run_that_supplies_none_of_its_numbers():
    from docs.blocks.readme import _values

    answer = "method-safeguard/flt-label-clusters-m50-answer"  # FLT and FedAvg
    assert set(_values((answer, "flt-label-clusters-m50"))) == {"flt", "fedavg", "ifca", "fedsem"}
    with pytest.raises(ValueError, match="flt-label-clusters-m50-keep"):  # FLT only: shadowed
        _values((answer, "method-safeguard/flt-label-clusters-m50-keep"))


def test_the_readme_is_short_and_links_a_page_for_every_moved_section():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\((docs/[\w/.-]+\.md)(?:#[\w-]+)?\)", text)
    assert all((REPO / link).is_file() for link in links), links
    moved = {"getting-started", "datasets", "results-of-a-run", "reliability", "deploy",
             "robustness-suite", "benchmarks", "api", "methods/overview", "methods/flt", "methods/sfl",
             "methods/fedska", "methods/fedu", "methods/fedcg", "methods/baselines"}
    assert {f"docs/{name}.md" for name in moved} <= set(links)


# --- the method pages: every number cited from results is generated -------------------------------
METHOD_PAGES = sorted((gen.DOCS / "methods").glob("*.md"))
# tables a method page may hold outside a generated block: settings and link tables, no results
NON_RESULTS_TABLES = {
    "| key | default | meaning |",
    "| key | default | paper / spec | why (measured in the results below) |",
    "| `sfl.graph` | prior A |",
    "| method | page |",
}
# what only a measurement writes: a percentage (not the "best 5%" / "worst 5%" of a column name), a
# ratio (3.9×, not 3×3), a ± or an arrow between decimals (91.5 → 97.3, not k = 5 → 3)
RESULT_LIKE = re.compile(r"(?<!best )(?<!worst )\b\d+(?:\.\d+)?\s?(?:%|×(?!\d))|±|\d\.\d+\s?→\s?\d")


def hand_written(text: str) -> str:
    """A page without its generated blocks, code blocks, inline code and HTML comments."""
    text = gen.MARKER.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def tables_outside_blocks(text: str) -> list[str]:
    """The header row of every Markdown table outside the generated blocks."""
    lines = gen.MARKER.sub("", text).splitlines()
    return [line.strip() for i, line in enumerate(lines)
            if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))]


def test_the_method_pages_have_no_results_table_outside_a_generated_block():
    assert len(METHOD_PAGES) >= 13
    found = {f"{p.name}: {h}" for p in METHOD_PAGES for h in tables_outside_blocks(p.read_text())
             if h not in NON_RESULTS_TABLES}
    assert found == set(), "a results table must be generated (docs/blocks/, gen:block)"


def test_the_method_pages_write_no_measured_number_by_hand():
    """Outside the generated blocks no percentage, ratio, ± or before → after of numbers: prose that
    cites a result has its sentence generated (docs/blocks/)."""
    found = [f"{p.name}: …{m.string[max(0, m.start() - 40):m.end() + 20]}…".replace("\n", " ")
             for p in METHOD_PAGES for m in RESULT_LIKE.finditer(hand_written(p.read_text()))]
    assert found == []


def test_the_checks_catch_a_hand_written_result():
    page = "| q | sfl |\n|---|---:|\n| 2 | 97.31 |\n\nSFL is 8.7 points above, 3.9× the mean (91.5 → 97.3).\n"
    assert tables_outside_blocks(page) == ["| q | sfl |"]
    assert len(RESULT_LIKE.findall(hand_written(page))) == 2
    generated = "<!-- gen:block sfl-scale -->\n| q | sfl |\n3.9× and 91.5 → 97.3\n<!-- /gen -->\n"
    assert tables_outside_blocks(generated) == [] and RESULT_LIKE.findall(hand_written(generated)) == []
    assert RESULT_LIKE.findall("Conv3×3, 28×28 images, 2×2 pooling, k = 5 → 3, worst 5%") == []


# --- every page and the README: measured numbers come from generated blocks -------------------------
ALL_PAGES = [README, *gen.pages()]
# what a measurement writes besides RESULT_LIKE: a signed number (a Δ: +4.6, −1.2), a decimal of at
# least 10 (an accuracy or a time: 97.7, 31.67) and a quantity with a unit of time, size or points
MEASURED = re.compile(
    RESULT_LIKE.pattern
    + r"|(?<![\w.])[+−]\d+(?:\.\d+)?(?![\w.])"
    + r"|(?<![\w.,])\d{2,}\.\d+(?![\w.])"
    + r"|(?<![\w.])\d+(?:[.,]\d+)*\s?(?:s|min|minutes|ms|MB|GB|GiB|MiB|points?)\b")
# settings and definitions a page writes by hand, removed before the check
DEFINITIONS = tuple(re.compile(p) for p in (
    # Flower's and Bouquet's poll, pull, heartbeat, grace and restart intervals (seconds)
    r"(?<![\w.–])(?:0–3|60–90|0|0\.1|0\.15|0\.5|1(?:\.0)?|3|5|10|30|60) ?s\b",
    r"\d × heartbeat",
    # data splits, the safeguard's held-out share, the best / worst 5 % of clients
    r"\d+ ?% (?:train|validation|test)\b", r"(?:\(|held-out )10 %\)?|10 % × 5",
    r"⌈5 ?%·K⌉", r"(?:best|worst)[- ]5 ?%",
    # the traffic forecast horizon, a setting's default size, a size bound, a cluster id
    r"\d+ (?:to \d+ )?minutes(?: ahead|,)", r"default \d+ GiB", r"16\.7 M", r"−1 =",
))


def measured_by_hand(text: str) -> list[str]:
    """The measured-looking numbers of a page outside its generated blocks, code and comments,
    each with its context, once the settings and definitions (`DEFINITIONS`) are removed."""
    text = hand_written(text)
    for pattern in DEFINITIONS:
        text = pattern.sub("", text)
    return [text[max(0, m.start() - 40):m.end() + 20].replace("\n", " ") for m in MEASURED.finditer(text)]


def test_no_page_and_not_the_readme_writes_a_measured_number_by_hand():
    """Every docs page and README.md: an accuracy, Δ, time, ratio, size or share is generated from
    committed results (docs/blocks/, `gen:block`), or the page says that no committed result
    records it."""
    assert len(ALL_PAGES) >= 30
    found = [f"{p.relative_to(REPO)}: …{snippet}…" for p in ALL_PAGES
             for snippet in measured_by_hand(p.read_text())]
    assert found == []


def test_the_check_catches_a_measured_number_and_keeps_a_setting():
    page = ("Local is at 97.7 and SFL +0.6; the suite took 58 min, the image is 6.7 GB, 0.52 of it.\n"
            "A SuperNode pulls every 3 s; 70% train; `lr=0.05`; Flower 1.39; default 4 GiB.\n")
    shown = {m.group(0) for m in MEASURED.finditer(hand_written(page))}
    assert {"97.7", "+0.6", "58 min", "6.7 GB"} <= shown
    assert len(measured_by_hand(page)) == 4
    generated = "<!-- gen:block x -->\nLocal is at 97.7, +0.6, 58 min\n<!-- /gen -->\n"
    assert measured_by_hand(generated) == []


def test_every_generated_block_reads_only_committed_results():
    """Each block of docs/blocks/ is used on a page (or README.md) and reads files tracked by git
    under benchmarks/results/ (never outputs/ or a local run)."""
    from docs import blocks

    used = {name for p in gen.generated_pages() for kind, args in re.findall(
        r"<!-- gen:([\w-]+)((?: (?!-->)[^ \n]+)*) -->", p.read_text()) if kind == "block"
        for name in args.split()}
    assert used == set(blocks.names())
    tracked = set(subprocess.run(["git", "ls-files", "benchmarks/results"], cwd=REPO, text=True,
                                 capture_output=True, check=True).stdout.split())
    for name in blocks.names():
        _, paths = blocks.generate(name)
        assert paths, name
        assert {p.relative_to(REPO).as_posix() for p in paths} <= tracked, name


def test_a_run_table_is_read_from_markdown_only_when_its_json_was_never_committed():
    from docs.blocks import data

    run = data.markdown_run("suite/diagnosis/d1")
    assert run.get("sfl", "mean") == 36.17 and run.get("fedavg", "global+FT mean") is None
    with pytest.raises(ValueError, match="is committed"):
        data.markdown_run("default-job")
    with pytest.raises(ValueError, match="not under benchmarks/results"):
        data.raw("../../pyproject")


def test_a_block_refuses_a_suite_folder_that_ran_another_setting_than_it_says():
    from docs.blocks import data

    data.expect_setting(["suite/fedska-k3-seed0"], "fedska.k", [3])
    with pytest.raises(ValueError, match="fedska.k = 3, not 5"):
        data.expect_setting(["suite/fedska-k3-seed0"], "fedska.k", [5])
    data.expect_setting(["suite/label-clusters-seed0"], "fedu.untrained", [data.MISSING, "initial"])
