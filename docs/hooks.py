"""MkDocs hooks: the site's generated parts, made at build time from the code and the committed JSON.

- every committed results JSON with a renderer becomes the page `results/<path>.md` (rendered by the
  benchmark module that wrote it, `docs.gen.render_result`); results without one (deploy speed,
  Flower speed, FedCG client cost, the suite's summary tables) are shown as committed, with their
  plots; `results/index.md` lists them all;
- the `<!-- gen:... -->` markers of every page are filled again (`docs.gen.fill`), so a build never
  shows a stale settings or results table.
"""

from __future__ import annotations

import lzma
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from docs.gen import RESULTS, fill, render_result  # noqa: E402

# the results folders the site shows (docs.blocks.data.SITE_FOLDERS); the suite's per-cell folders
# are summarised in its tables
from docs.blocks.data import SITE_FOLDERS as FOLDERS  # noqa: E402


def _results_pages() -> dict[str, str | Path]:
    """Site path (under results/) -> page text, or the committed file to show as is."""
    out: dict[str, str | Path] = {}
    for path in [p for folder in FOLDERS for p in sorted(folder.glob("*.json"))]:
        text = render_result(path)
        key = path.relative_to(RESULTS).with_suffix(".md").as_posix()
        if text is not None:
            out[key] = text
        elif path.with_suffix(".md").exists():
            out[key] = path.with_suffix(".md")
    for path in [p for folder in FOLDERS for p in sorted(folder.glob("*.md"))]:
        out.setdefault(path.relative_to(RESULTS).as_posix(), path)
    return out


def _committed(path: Path) -> str:
    """A committed results page as is, except for pictures that were never committed (named in
    the text, not beside it): those links become a note."""
    return _pictures(path.read_text(), path.parent)


def _pictures(text: str, folder: Path) -> str:
    """`text` with each picture that `folder` does not hold replaced by a note."""
    def picture(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or (folder / target).exists():
            return match.group(0)
        return f"*(plot `{target}` not committed)*"
    return re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", picture, text)


def _index(pages: dict[str, str | Path]) -> str:
    lines = ["# All committed results", "",
             "Every page below is generated from a committed JSON file in `benchmarks/results/` by "
             "the benchmark that wrote it (each page starts with the command that produced it), or "
             "shown as committed where its benchmark writes Markdown only.", ""]
    for key in sorted(pages):
        lines.append(f"- [{key.removesuffix('.md')}]({key.removeprefix('results/')})")
    return "\n".join(lines) + "\n"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    pages = _results_pages()
    for key, value in pages.items():
        content = (_pictures(value, (RESULTS / key).parent) if isinstance(value, str)
                   else _committed(value))
        files.append(File.generated(config, f"results/{key}", content=content))
    for png in [p for folder in FOLDERS for p in sorted(folder.glob("*.png"))]:
        files.append(File.generated(config, f"results/{png.relative_to(RESULTS).as_posix()}",
                                    abs_src_path=str(png)))
    files.append(File.generated(config, "results/index.md", content=_index(pages)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri.startswith("results/"):  # generated above
        return markdown
    return fill(markdown, Path(page.file.src_uri))


MERMAID = Path(__file__).parent / "assets" / "mermaid" / "mermaid.min.js.xz"


def mermaid_script() -> bytes:
    """The vendored Mermaid (`assets/mermaid/SOURCE.txt`), kept xz-compressed in the repository."""
    return lzma.decompress(MERMAID.read_bytes())


def on_post_build(config: Any) -> None:
    """Write the vendored Mermaid where mkdocs.yml's extra_javascript points the pages."""
    target = Path(config["site_dir"]) / "assets" / "mermaid" / "mermaid.min.js"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(mermaid_script())
