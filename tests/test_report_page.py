"""report.html: accuracies in percent everywhere (clients.csv's fractions ×100), only the settings
that apply to the run's method, and the line that puts the run beside the committed reference
comparison when the run has its settings."""

import csv
import html
import json
import re

import pytest

from server_app.report_page import write_run_report
from server_app.reporting import REFERENCE, RESULTS_DIR, comparison_hint


def table_after(page: str, heading_start: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the first table after the <h2> starting with `heading_start`."""
    part = page[page.index(f"<h2>{html.escape(heading_start)}"):]
    table = part[:part.index("</table>")]
    header = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", table)]
    rows = [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1])]
    return header, rows


def report(directory) -> str:
    """The page as a run writes it: with the comparison line of its summary and settings."""
    summary = json.loads((directory / "summary.json").read_text())
    config = json.loads((directory / "config.json").read_text())
    return write_run_report(directory, comparison_hint(summary, config)).read_text()


@pytest.fixture
def sfl_run(tmp_path):
    """A run folder as the recorder writes it, for SFL with the default job's settings."""
    reference = json.loads((RESULTS_DIR / f"{REFERENCE}.json").read_text())
    sfl = next(s for s in reference["summaries"] if s["method"] == "sfl")
    config = {**reference["settings"], "method": "sfl", "run-name": "x", "output-dir": str(tmp_path)}
    directory = tmp_path / "x"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    summary = {k: v for k, v in sfl.items() if k not in ("curve", "wall-seconds")}
    (directory / "summary.json").write_text(json.dumps(summary))
    (directory / "rounds.jsonl").write_text(json.dumps({"round": 5, "seconds": 0.1, **sfl["final"]}))
    with (directory / "clients.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerows([["client-id", "accuracy", "bytes-down", "global-accuracy", "loss"],
                          [0, 0.9166666666666666, 1000, 0.5, 0.3], [1, 1.0, 1000, 0.25, 0.2]])
    return directory, config


def test_accuracies_are_percent_and_only_the_methods_settings_are_listed(sfl_run):
    directory, config = sfl_run
    page = report(directory)
    header, rows = table_after(page, "Per client")
    assert header == ["client-id", "accuracy (%)", "bytes-down", "global-accuracy (%)", "loss"]
    assert [float(v) for row in rows for v in row] == pytest.approx(
        [0, 91.67, 1000, 50.0, 0.3, 1, 100.0, 1000, 25.0, 0.2], abs=0.01)
    _, settings = table_after(page, "Settings of this run")
    keys = {row[0] for row in settings}
    assert keys == {k for k in config if "." not in k or k.startswith("sfl.")}
    assert not any(k.startswith(("flt.", "fedcg.", "fedska.", "ifca.")) for k in keys)
    assert len(keys) < len(config)


def test_the_reference_comparison_line_is_shown_when_the_run_has_its_settings(sfl_run):
    directory, config = sfl_run
    page = report(directory)
    line = re.search(r'<pre class="comparison">(.*?)</pre>', page, re.S).group(1)
    assert f"benchmarks/results/{REFERENCE}.md" in line and "fedavg 75.00" in line
    config["num-rounds"] = 2  # not the reference's settings: the command that measures them instead
    (directory / "config.json").write_text(json.dumps(config))
    page = report(directory)
    line = re.search(r'<pre class="comparison">(.*?)</pre>', page, re.S).group(1)
    assert "python -m benchmarks.compare --methods sfl,fedavg,local" in html.unescape(line)
