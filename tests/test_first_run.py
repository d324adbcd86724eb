"""A newcomer's first run, as the README describes it: the quick start fits one screen, CI runs its
install and test commands, and its main command (run verbatim in a copy of the repository with a
private FLWR_HOME and its own local-SuperLink port) streams the run, ends with the summary table and
the results path, and leaves a report.html whose every picture is there."""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from benchmarks.compare import compare
from benchmarks.studies.first_run import quick_start, stop_local_superlink
from strategies.shared.run_config import RunConfig
from benchmarks.common import RESULTS_DIR
from benchmarks.reference import package_reference
from server_app.reporting import REFERENCE, REFERENCE_FILE, matching_comparison, comparison_hint
from strategies.shared.run_config import default_run_config
from tests.conftest import REPO
from tests.simulation_superlink import free_port

README = REPO / "README.md"
QUICK_START_MAX_LINES = 40
BIN = Path(sys.executable).parent


def test_quick_start_fits_one_screen_before_the_first_table():
    lines = README.read_text().splitlines()
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert first_table <= QUICK_START_MAX_LINES, (
        f"{first_table} lines of README before its first table (at most {QUICK_START_MAX_LINES})")
    assert "## Quick start" in lines[:first_table]


def test_ci_runs_exactly_the_readme_install_and_test_commands():
    commands = quick_start()
    steps = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith(("#", "set ", "cd ", "export "))]
    assert steps == [commands["venv"], commands["install"], commands["test"]]
    assert "-c constraints.txt" in commands["install"]
    assert commands["main"] == "flwr run . --stream"


def test_no_per_run_dependency_install():
    """Flower's local SuperLink `uv sync`s an app's dependencies for every run; Bouquet excludes them
    all (it runs in the environment it was installed into), or a first run downloads them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    names = {re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower()
             for dep in project["project"]["dependencies"]}
    assert names <= set(project["tool"]["uv"]["exclude-dependencies"])


def test_the_committed_default_job_comparison_has_the_default_settings():
    """The default job's summary quotes benchmarks/results/default-job.json only while that
    comparison ran today's defaults; a changed default needs the comparison run again."""
    config = RunConfig.from_flower(default_run_config()).flat()
    assert matching_comparison(config, RESULTS_DIR / f"{REFERENCE}.json") is not None, (
        "defaults changed: run `python -m benchmarks.compare --methods sfl,fedavg,local,flt,ifca "
        "--name default-job` and update the README's tables")


def test_the_packaged_reference_numbers_are_those_of_the_committed_comparison():
    """The summary's reference line reads server_app/reference.json (package data, shipped in the
    FAB), never benchmarks/: it must say what results/default-job.json says."""
    committed = package_reference(json.loads((RESULTS_DIR / f"{REFERENCE}.json").read_text()))
    assert json.loads(REFERENCE_FILE.read_text()) == committed, (
        "server_app/reference.json is stale: run `python -m benchmarks.reference`")


def test_a_comparison_writes_a_report_linking_each_run_report_and_the_hint_uses_it(tmp_path):
    settings = {"dataset": "synthetic", "partition": "label-clusters", "num-clusters": 2,
                "num-clients": 4, "num-rounds": 1, "model": "mclr", "max-samples-per-client": 40}
    results, runs = tmp_path / "results", tmp_path / "runs"
    summaries = compare(["sfl", "fedavg"], settings, REFERENCE, results_dir=results, runs_dir=runs)

    embedded, linked, names = referenced_images(runs / "report.html")
    assert len(embedded) == 1 and names == [f"{REFERENCE}.png"]
    assert sorted(linked) == [runs / "fedavg" / "report.html", runs / "sfl" / "report.html"]
    assert all(path.is_file() for path in linked)
    sfl_embedded, _, sfl_names = referenced_images(runs / "sfl" / "report.html")
    assert sorted(sfl_names) == ["accuracy.png", "graph.png"] and len(sfl_embedded) == 2

    config = json.loads((runs / "sfl" / "config.json").read_text())
    fedavg = summaries[1]["final"]["personalized"]["mean"]
    reference = results / f"{REFERENCE}.json"
    hint = comparison_hint(summaries[0], config, reference)
    assert f"fedavg {fedavg:.2f}" in hint and "sfl " not in hint.split("\n")[1]
    # the run's own committed number beside the others, and whether the run reproduced it
    assert f"this job's committed result: sfl {summaries[0]['final']['personalized']['mean']:.2f}" in hint
    assert hint.endswith("(the same)")
    moved = {**summaries[0], "final": {**summaries[0]["final"], "personalized": {"mean": 1.0}}}
    assert "(differs: personalized " in comparison_hint(moved, config, reference)
    changed = comparison_hint(summaries[0], {**config, "num-rounds": 3}, reference)
    assert "python -m benchmarks.compare --methods sfl,fedavg,local" in changed
    assert "--set num-rounds=3" in changed and "--set num-clients=4" in changed


def referenced_images(report: Path) -> tuple[list[bytes], list[Path], list[str]]:
    """(embedded PNGs, relatively linked files, data-file names of the embedded PNGs) of a page."""
    page = report.read_text()
    embedded, linked = [], []
    for src in re.findall(r'<img src="([^"]+)"', page):
        if src.startswith("data:image/png;base64,"):
            embedded.append(base64.b64decode(src.split(",", 1)[1], validate=True))
        else:
            linked.append(report.parent / src)
    linked += [report.parent / href for href in re.findall(r'<a href="([^"]+\.(?:png|html))"', page)]
    assert not re.search(r'(src|href)="(https?:)?//', page), "the page must not need the network"
    return embedded, linked, re.findall(r'data-file="([^"]+)"', page)


@pytest.mark.e2e
def test_readme_main_command_streams_the_run_and_writes_a_report(tmp_path):
    main = quick_start()["main"]
    checkout = tmp_path / "bouquet"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(
        ".git", ".venv", "venv", "outputs", "__pycache__", ".pytest_cache", "*.egg-info", "certs", "keys"))
    flwr_home = tmp_path / "flwr-home"
    env = {**os.environ, "FLWR_HOME": str(flwr_home), "PYTHONPATH": str(checkout),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
           "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    try:
        result = subprocess.run(["bash", "-c", main], cwd=checkout, env=env, capture_output=True,
                                text=True, timeout=600)
        output = result.stdout + result.stderr
        listing = subprocess.run([str(BIN / "flwr"), "list", "--format", "json"], cwd=checkout,
                                 env=env, capture_output=True, text=True, timeout=60)
    finally:
        stop_local_superlink(flwr_home)
    assert result.returncode == 0, output[-3000:]
    assert [run["status"] for run in json.loads(listing.stdout)["runs"]] == ["finished:completed"]

    assert "Bouquet run summary" in output
    assert re.search(r"personalized mean \(%\)\s+\d+\.\d\d", output)
    assert re.search(r"other methods, same data and settings .*\n\s+fedavg \d+\.\d\d", output)
    # flwr run computes the committed comparison's numbers, to the last digit
    assert re.search(r"this job's committed result: sfl \d+\.\d\d.*\(the same\)", output), output[-3000:]
    found = re.search(r"results written to (\S+)", output)
    assert found, output[-3000:]
    results = Path(found.group(1))
    assert results.parent == checkout / "outputs"
    summary = json.loads((results / "summary.json").read_text())
    assert summary["method"] == "sfl" and summary["final"]["round"] == summary["rounds"]

    report = results / "report.html"
    embedded, linked, names = referenced_images(report)
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in embedded)
    assert all(path.is_file() for path in linked), [p for p in linked if not p.is_file()]
    assert sorted(names) == sorted(p.name for p in results.glob("*.png"))  # every picture shown
    assert {"accuracy.png", "graph.png"} <= set(names)
    page = report.read_text()
    assert f"{summary['final']['personalized']['mean']:.2f}" in page
    assert page.count("<tr>") >= summary["num-clients"] + summary["rounds"] + 1


def test_the_fab_ships_the_app_packages_only():
    """Every deployed message carries the FAB: the five app packages (with the default job's
    reference numbers, server_app/reference.json), nothing from tests or benchmarks."""
    import io
    import zipfile

    from flwr.cli.build import build_fab_from_disk

    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(REPO))).namelist()
    top = {name.split("/")[0] for name in names if "/" in name and not name.startswith(".info/")}
    assert top == {"server_app", "client_app", "strategies", "models", "datasets"}
    assert "server_app/reference.json" in names
    assert "server_app/app.py" in names and "client_app/app.py" in names
