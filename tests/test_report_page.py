"""report.html: accuracies in percent everywhere (clients.csv's fractions ×100), only the settings
that apply to the run's method, and the line that puts the run beside the committed reference
comparison when the run has its settings."""

import csv
import html
import json
import re

import numpy as np
import pytest

from server_app.report_page import write_run_report
from benchmarks.common import RESULTS_DIR
from server_app.reporting import REFERENCE, comparison_hint


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
    assert {k for k in keys if "." in k} == {k for k in config if k.startswith("sfl.")}
    assert {k for k in keys if "." not in k} < {k for k in config if "." not in k}
    assert not any(k.startswith(("flt.", "fedcg.", "fedska.", "ifca.")) for k in keys)
    assert len(keys) < len(config)


def test_the_reference_comparison_line_is_shown_when_the_run_has_its_settings(sfl_run):
    directory, config = sfl_run
    page = report(directory)
    line = re.search(r'<pre class="comparison">(.*?)</pre>', page, re.S).group(1)
    reference = json.loads((RESULTS_DIR / f"{REFERENCE}.json").read_text())
    fedavg = next(s for s in reference["summaries"] if s["method"] == "fedavg")
    assert f"benchmarks/results/{REFERENCE}.md" in line
    assert f"fedavg {fedavg['final']['personalized']['mean']:.2f}" in line
    config["num-rounds"] = 2  # not the reference's settings: the command that measures them instead
    (directory / "config.json").write_text(json.dumps(config))
    page = report(directory)
    line = re.search(r'<pre class="comparison">(.*?)</pre>', page, re.S).group(1)
    assert "python -m benchmarks.compare --methods sfl,fedavg,local" in html.unescape(line)


def rerun(directory, config, **changes):
    """The run folder as if the run had had `changes` in its config (and its method in its summary)."""
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    summary = json.loads((directory / "summary.json").read_text())
    summary.update(method=config["method"], partition=config["partition"])
    (directory / "summary.json").write_text(json.dumps(summary))


def figure_caption(page: str, file: str) -> str:
    """The caption text under the embedded picture `file`."""
    part = page[page.index(f'data-file="{file}"'):]
    caption = part[part.index("<figcaption>") + len("<figcaption>"):part.index("</figcaption>")]
    return html.unescape(re.sub(r"<[^>]+>", "", caption))


def flt_report(directory, complete: bool) -> dict:
    """FLT's own report of 4 placed clients whose thresholded graph Ã has no edge (self-loops only),
    with the structure check's fallback to the complete graph or without it (`no-structure=keep`)."""
    from strategies.methods.flt.relatedness import Relatedness
    from strategies.methods.flt.server import FLT
    from strategies.methods.flt.settings import FLTSection

    flt = FLT(4, 1.0, FLTSection(), input_shape=(1, 28, 28))
    rng = np.random.default_rng(0)
    points = {c: rng.normal(size=(2, 2)) for c in range(4)}
    distance = np.full((4, 4), 3.0)
    np.fill_diagonal(distance, 0.0)
    flt.relatedness = Relatedness(4, 0.5, "matching", 0, {c: rng.normal(size=(2, 4)) for c in range(4)},
                                  points, None, distance, np.eye(4, dtype=np.float32), None,
                                  contrast=None, complete=complete)
    return flt.report(directory, None)


def test_flts_complete_graph_fallback_is_drawn_and_captioned_as_such(sfl_run):
    directory, config = sfl_run
    rerun(directory, config, method="flt", partition="iid")
    summary = json.loads((directory / "summary.json").read_text())
    summary.update(flt_report(directory, complete=True))
    (directory / "summary.json").write_text(json.dumps(summary))
    # graph.npy is the graph the models were averaged over: every client with every client
    assert (np.load(directory / "graph.npy") == 1.0).all()
    assert (np.load(directory / "thresholded-graph.npy") == np.eye(4)).all()  # Ã, kept apart
    page = report(directory)
    caption = figure_caption(page, "graph.png")
    assert caption.startswith("Client graph the method used: Complete graph: no client structure "
                              "found") and "every client averaged over every placed client" in caption
    assert "not the graph the models were averaged over" in figure_caption(page, "thresholded-graph.png")
    # without the fallback (no-structure=keep), Ã itself is the graph used, captioned as Ã
    for name in ("graph", "thresholded-graph"):
        for suffix in (".npy", ".png"):
            (directory / f"{name}{suffix}").unlink()
    flt_report(directory, complete=False)
    assert (np.load(directory / "graph.npy") == np.eye(4)).all()
    assert not (directory / "thresholded-graph.png").exists()
    assert "each client averaged over its neighbours in Ã" in figure_caption(report(directory), "graph.png")


def test_a_constant_matrix_heatmap_is_coloured_by_its_value(tmp_path):
    """A complete graph (all ones) is drawn in the top colour of its scale, an empty one (all zeros)
    in the bottom colour, each titled with its value: not one arbitrary flat colour for both."""
    from PIL import Image

    from strategies.shared.reporter import colour_range, save_matrix

    assert colour_range(np.ones((3, 3))) == (0.0, 1.0) and colour_range(np.zeros((3, 3))) == (0.0, 1.0)
    assert colour_range(np.full((2, 2), -2.0)) == (-2.0, 0.0)
    assert colour_range(np.array([[0.2, 0.5], [0.5, 0.2]])) == (0.2, 0.5)  # its own range otherwise
    colours = {}
    for name, value in (("ones", 1.0), ("zeros", 0.0)):
        save_matrix(tmp_path, name, np.full((4, 4), value), title=name)
        image = np.asarray(Image.open(tmp_path / f"{name}.png").convert("RGB"))
        height, width, _ = image.shape
        colours[name] = tuple(image[int(height * 0.45), int(width * 0.4)])  # inside the heatmap
    viridis_top, viridis_bottom = (253, 231, 37), (68, 1, 84)
    assert np.abs(np.subtract(colours["ones"], viridis_top)).max() <= 3
    assert np.abs(np.subtract(colours["zeros"], viridis_bottom)).max() <= 3


def test_only_settings_that_apply_to_the_run_are_listed(sfl_run):
    directory, config = sfl_run
    assert config["partition"] == "label-clusters" and config["method"] == "sfl"
    page = report(directory)
    _, settings = table_after(page, "Settings of this run")
    keys = {row[0] for row in settings}
    assert {"num-clusters", "labels-per-cluster", "safeguard", "safeguard-margin"} <= keys
    assert not any(k.startswith(("domain", "shards", "dirichlet", "traffic", "aggregation",
                                 "trim-fraction")) for k in keys)
    # FLT on domains: the domain keys of its family apply; a robust method's aggregation does
    rerun(directory, config, method="flt", partition="domains", **{"domain-family": "styles"})
    _, settings = table_after(report(directory), "Settings of this run")
    keys = {row[0] for row in settings}
    assert {"domain-styles", "domain-test-clients", "domains-per-client", "safeguard"} <= keys
    assert not keys & {"domain-rotations", "num-clusters", "aggregation"}
    assert not any(k.startswith("sfl.") for k in keys)
    rerun(directory, config, method="fedavg", partition="iid", aggregation="trimmed-mean")
    _, settings = table_after(report(directory), "Settings of this run")
    keys = {row[0] for row in settings}
    assert {"aggregation", "trim-fraction"} <= keys and not any(k.startswith("safeguard") for k in keys)


def test_every_conditional_key_is_a_run_config_key():
    """CONDITIONAL_KEYS names keys (or key prefixes) of the run config: a renamed key fails here."""
    from server_app.report_page import CONDITIONAL_KEYS
    from strategies.shared.run_config import default_run_config

    common = [k for k in default_run_config() if "." not in k]
    for key in CONDITIONAL_KEYS:
        assert any(k == key or (key.endswith("-") and k.startswith(key)) for k in common), key


def test_the_per_client_table_scrolls_inside_the_page(sfl_run):
    directory, _ = sfl_run
    page = report(directory)
    part = page[page.index("<h2>Per client"):]
    assert part.index('<div class="scroll"><table>') < part.index("</table></div>")
    assert re.search(r"\.scroll \{[^}]*overflow: auto", page)
