"""Which committed result files the documentation cites: the rule that keeps `benchmarks/results/`
to what a reader can reach.

A file under `benchmarks/results/` is cited when

- a docs page or README.md links it or its page (`results/<name>.md` on the site,
  `benchmarks/results/<name>.<ext>` in README.md), with the markers' generated parts filled in
  (`docs.gen.fill`): the page's JSON, its committed Markdown, the pictures that page shows and the
  result pages it links in turn;
- a generated part reads it (`docs.blocks.data.TOUCHED`: every block's sources, the files its checks
  read, such as a suite folder's per-cell runs, and the JSON of a `gen:results` or `gen:suite-delta`
  marker);
- a tracked file outside `benchmarks/results/` (code, a test, a config) names it by its path
  `benchmarks/results/<name>.<ext>` or, for a `.md` named so, its JSON beside it.

The site renders every JSON of `docs.blocks.data.SITE_FOLDERS` into a page and lists them all in
`results/index.md`; that listing cites nothing (a page nobody links is not a reason to keep a file).
`tests/test_benchmarks.py` fails when a tracked result file is not cited.

    python -m docs.cited              # the tracked result files nobody cites (exit 1 when any)
    python -m docs.cited --cited      # the cited ones
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PREFIX = "benchmarks/results/"
# a link to a results page: `results/<name>.md` on the site (after any `../`), or the committed
# file `benchmarks/results/<name>.<ext>` (README.md, code)
SITE_LINK = re.compile(r"\]\((?:\.\./)*results/([\w./-]+?\.md)(?:#[\w-]*)?\)")
PATH_NAME = re.compile(r"benchmarks/results/([\w./-]*[\w-]\.(?:json|md|png|csv|txt))")
PICTURE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
PAGE_LINK = re.compile(r"\]\(([^)\s#]+\.md)(?:#[\w-]*)?\)")


def tracked() -> list[Path]:
    """Every file under benchmarks/results/ that git tracks."""
    out = subprocess.run(["git", "ls-files", "-z", "benchmarks/results"], cwd=REPO, text=True,
                         capture_output=True, check=True).stdout
    return [REPO / name for name in out.split("\0") if name]


def _inside(path: Path) -> Path | None:
    path = path.resolve()
    return path if RESULTS.resolve() in path.parents else None


def _page_text(page: Path) -> str:
    """What the site shows at `page` (a results .md): rendered from its JSON, else as committed."""
    from docs.gen import render_result

    json_path = page.with_suffix(".json")
    if json_path.is_file():
        text = render_result(json_path)
        if text is not None:
            return text
    return page.read_text() if page.is_file() else ""


def _cite_page(page: Path, cited: set[Path], seen: set[Path]) -> None:
    """`page` (a results .md, committed or rendered from its JSON) and what it shows and links."""
    if page in seen:
        return
    seen.add(page)
    for path in (page, page.with_suffix(".json")):
        if path.is_file():
            cited.add(path)
    text = _page_text(page)
    for target in PICTURE.findall(text):
        picture = _inside(page.parent / target) if "://" not in target else None
        if picture is not None and picture.is_file():
            cited.add(picture)
    for target in PAGE_LINK.findall(text):
        if "://" in target:
            continue
        linked = _inside(page.parent / target)
        if linked is not None:
            _cite_page(linked, cited, seen)


def _named_in_code() -> set[Path]:
    """Result files named by path in tracked files outside benchmarks/results/."""
    out = subprocess.run(["git", "grep", "-I", "-o", "-h", "-E", r"benchmarks/results/[A-Za-z0-9_./-]+",
                          "--", ".", ":!benchmarks/results"], cwd=REPO, text=True,
                         capture_output=True).stdout
    named = set()
    for match in PATH_NAME.findall(out):
        path = _inside(RESULTS / match)
        if path is None:
            continue
        named.update(p for p in (path, path.with_suffix(".json")) if p.is_file())
    return named


def cited_files() -> set[Path]:
    """Every result file the docs, README.md, their generated parts or the code cite."""
    from docs import gen
    from docs.blocks import data

    cited: set[Path] = set()
    seen: set[Path] = set()
    for page in gen.generated_pages():
        text = gen.fill(page.read_text(), gen._relative(page))
        for name in SITE_LINK.findall(text):
            target = _inside(RESULTS / name)
            if target is not None:
                _cite_page(target, cited, seen)
        for name in PATH_NAME.findall(text):
            target = _inside(RESULTS / name)
            if target is not None:
                if target.suffix in (".md", ".json"):
                    _cite_page(target.with_suffix(".md"), cited, seen)
                else:
                    cited.add(target)
    cited.update(p for p in data.TOUCHED if p.is_file())
    for path in sorted(data.TOUCHED):
        # a source with a site page is linked under its block: the page is cited with what it shows
        if path.suffix == ".md" or (path.is_file() and data.site_page(path) is not None):
            _cite_page(path.with_suffix(".md"), cited, seen)
    cited.update(_named_in_code())
    return {p.resolve() for p in cited if p.is_file()}


def uncited() -> list[Path]:
    """The tracked result files nobody cites, sorted."""
    cited = cited_files()
    return sorted(p for p in tracked() if p.resolve() not in cited)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.cited", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cited", action="store_true", help="list the cited files instead")
    args = parser.parse_args(argv)
    if args.cited:
        for path in sorted(cited_files()):
            print(path.relative_to(REPO).as_posix())
        return 0
    left = uncited()
    for path in left:
        print(path.relative_to(REPO).as_posix())
    print(f"{len(left)} of {len(tracked())} tracked result files cited by no page", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
