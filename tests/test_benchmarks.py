"""The benchmark harness: `--set` parsing, the shared Markdown table and a real (tiny) `compare` run
into a temporary folder."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.common import markdown_table, parse_set
from benchmarks.compare import COLUMNS, DASH, compare, format_command, main
from server_app.run_values import parse_value
from benchmarks.studies.flower_speed import speed_table


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20", 20),
        ("-3", -3),
        ("0.05", 0.05),
        ("1e-3", 1e-3),
        (".5", 0.5),
        ("true", True),
        ("false", False),
        ("shards", "shards"),
        ('"shards"', "shards"),
        ("'cnn'", "cnn"),
        ("0,90,180,270", "0,90,180,270"),
        ('"20"', "20"),  # quoted digits stay a string, as in Flower
    ],
)
def test_parse_value_types(text, expected):
    value = parse_value(text)
    assert value == expected
    assert type(value) is type(expected)


def test_parse_set_keeps_dotted_keys_and_rejects_missing_equals():
    assert parse_set(["num-rounds=20", "fedprox.mu=0.1", "power-law=true", "model=mclr"]) == {
        "num-rounds": 20, "fedprox.mu": 0.1, "power-law": True, "model": "mclr",
    }
    assert parse_set(["data-root="]) == {"data-root": ""}
    with pytest.raises(ValueError, match="key=value"):
        parse_set(["num-rounds"])


def test_markdown_table_aligns_columns_and_tells_a_blank_cell_from_an_empty_value():
    lines = markdown_table(["name", "n", "mark", "note"], "lrcl",
                           [("a", 1, "✔", ""), ("b", 2.5, "", None)])
    assert lines == ["| name | n | mark | note |", "|---|---:|:---:|---|",
                     "| a | 1 | ✔ |  |", "| b | 2.5 |  | |"]
    assert markdown_table(["x"], "r", []) == ["| x |", "|---:|"]


@pytest.mark.parametrize(("align", "rows"), [("l", [("a", "b")]), ("lx", [("a", "b")]),
                                             ("ll", [("a",)]), ("ll", [("a", "b", "c")])])
def test_markdown_table_rejects_a_row_or_alignment_that_does_not_fit_the_header(align, rows):
    with pytest.raises(ValueError, match="markdown_table"):
        markdown_table(["x", "y"], align, rows)


def test_format_command_round_trips_through_the_parser():
    overrides = {"num-rounds": 2, "lr": 0.05, "power-law": False, "model": "mclr", "tag": "20"}
    command = format_command(["fedavg", "local"], overrides, "x", nodes=2)
    assert command.startswith("python -m benchmarks.compare --methods fedavg,local")
    import shlex

    args = shlex.split(command)
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert parse_set(sets) == overrides


TINY = {
    "dataset": "synthetic",
    "partition": "shards",
    "num-clients": 4,
    "num-rounds": 2,
    "model": "mclr",
    "max-samples-per-client": 40,
    "finetune-epochs": 1,
}


def _rows(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    header = "| " + " | ".join(COLUMNS) + " |"
    start = lines.index(header)
    rows = []
    for line in lines[start + 1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(COLUMNS):
            break
        rows.append(cells)
    return rows


def test_compare_writes_one_row_per_method_with_numbers(tmp_path):
    summaries = compare(["fedavg", "local"], TINY, "tiny", results_dir=tmp_path / "results",
                        runs_dir=tmp_path / "runs")
    assert [s["method"] for s in summaries] == ["fedavg", "local"]

    md = (tmp_path / "results" / "tiny.md").read_text()
    assert "python -m benchmarks.compare --methods fedavg,local" in md
    assert "cores" in md and "torch" in md
    rows = _rows(md)
    assert [r[0] for r in rows] == ["fedavg", "local"]
    by_method = {r[0]: dict(zip(COLUMNS, r)) for r in rows}
    # Every cell is a number, except the global model of `local`, which does not exist.
    for method, row in by_method.items():
        for column, cell in row.items():
            if column == "method" or (method == "local" and column in ("global acc.",
                                                                         "global+FT mean")):
                continue
            assert math.isfinite(float(cell)), (method, column, cell)
    assert by_method["local"]["global acc."] == DASH
    assert by_method["local"]["global+FT mean"] == DASH
    for row in by_method.values():
        assert 0.0 <= float(row["mean"]) <= 100.0
        assert float(row["worst 5%"]) <= float(row["mean"]) <= float(row["best 5%"])
        assert float(row["MB/round"]) > 0 and float(row["s/round"]) > 0
    # fedavg's clients use the global model: the table's mean is the summary's number.
    fedavg = summaries[0]
    assert float(by_method["fedavg"]["mean"]) == pytest.approx(
        fedavg["final"]["personalized"]["mean"], abs=0.005)

    raw = json.loads((tmp_path / "results" / "tiny.json").read_text())
    assert [s["method"] for s in raw["summaries"]] == ["fedavg", "local"]
    assert raw["settings"]["num-clients"] == 4 and "method" not in raw["settings"]
    # The curve comes from rounds.jsonl: round 0 (initial model) and the two rounds.
    assert [p["round"] for p in raw["summaries"][0]["curve"]] == [0, 1, 2]
    assert (tmp_path / "results" / "tiny.png").stat().st_size > 0
    assert (tmp_path / "runs" / "local" / "rounds.jsonl").exists()


def test_compare_rejects_unknown_method_and_reserved_keys_before_running(tmp_path):
    with pytest.raises(ValueError, match="registered"):
        compare(["fedavg", "nope"], TINY, "x", results_dir=tmp_path)
    with pytest.raises(ValueError, match="per method"):
        compare(["fedavg"], {**TINY, "method": "local"}, "x", results_dir=tmp_path)
    with pytest.raises(ValueError, match="num-rounds"):
        compare(["fedavg"], {**TINY, "num-rounds": 0}, "x", results_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_cli_reports_a_bad_set_as_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--methods", "fedavg", "--set", "num-rounds", "--name", "x",
              "--results-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "key=value" in capsys.readouterr().err


def test_speed_table_reports_medians_and_ratio():
    timings = {20: {"bouquet": [0.2, 0.3, 0.22], "flower": [0.2, 0.21, 0.19]}}
    table = speed_table(timings)
    assert "| 20 | 0.220 | 0.200 | 1.10 | 1.05 |" in table


def test_minimal_flower_app_does_the_same_work_as_bouquet_fedavg(tmp_path):
    """Same seeds, data, model and batch order: both sides end at the same global accuracy, and
    each reports one time per round."""
    from benchmarks.studies.flower_speed import run_bouquet, run_config, run_flower

    base = {"dataset": "digits", "partition": "iid", "model": "mclr",
            "max-samples-per-client": 150, "finetune-epochs": 0, "eval-every": 1}
    config = run_config(3, 3, base)
    bouquet = run_bouquet(config, tmp_path, "speed")
    flower = run_flower(config)
    assert len(bouquet["seconds"]) == len(flower["seconds"]) == 3
    assert all(s > 0 for s in bouquet["seconds"] + flower["seconds"])
    assert bouquet["final-accuracy"] > 30.0  # it learned (10 classes: chance is 10%)
    assert bouquet["final-accuracy"] == pytest.approx(flower["final-accuracy"], abs=1e-6)


def test_deploy_methods_table_averages_each_run_and_divides_by_fedavg():
    """Seconds per round are the mean over the whole run (a round with extra exchanges counts as
    it comes), the ratio is to the mean of the fedavg runs, phases are rounds 1..R's."""
    from benchmarks.studies.deploy_speed import methods_table
    from server_app.harness import deploy

    poll = deploy.EXECUTOR_ENV["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"]
    rows = [{"side": "bouquet fedavg", "poll": poll, "seconds": [10.0, 10.0, 10.0, 14.0],
             "phases": [0, 1, 1, 1, 2]},
            {"side": "minimal flower fedavg", "poll": poll, "seconds": [30.0], "phases": [2]},
            {"side": "bouquet fedavg", "poll": poll, "seconds": [12.0, 12.0, 12.0, 12.0],
             "phases": [0, 1, 1, 1, 2]},
            {"side": "bouquet fedcg", "poll": poll, "seconds": [20.0, 10.0, 20.0, 16.0],
             "phases": [0, 2, 1, 2, 3]}]
    table = methods_table(rows)
    assert "| fedavg | 11.50 | 1.00 | 1, 1, 1, 2 | 1 |" in table
    assert "| fedcg | 16.50 | 1.43 | 2, 1, 2, 3 | 2 |" in table
    assert not any("minimal" in line for line in table)


def test_a_curve_point_keeps_the_safeguards_choices_where_a_round_has_them():
    from benchmarks.compare import _curve_point

    record = {"round": 3, "seconds": 1.5, "personalized": {"mean": 90.0, "worst-5%": 80.0},
              "safeguard-own": 0.25, "safeguard-finetuned": 4, "safeguard-weight": 0.75,
              "safeguard-start": 0.0, "safeguard-finetune-evidence": -1.5}
    point = _curve_point(record)
    assert point["safeguard-own"] == 0.25 and point["safeguard-weight"] == 0.75
    assert point["safeguard-finetuned"] == 4 and point["safeguard-start"] == 0.0
    assert point["safeguard-finetune-evidence"] == -1.5
    assert point["personalized-mean"] == 90.0
    plain = _curve_point({"round": 1, "personalized": {"mean": 50.0}})
    assert not {"safeguard-own", "safeguard-finetuned", "safeguard-weight",
                "safeguard-start", "safeguard-finetune-evidence"} & set(plain)


def test_the_untuned_study_keeps_flts_fine_tuned_mean_and_its_last_pooled_evidence():
    from benchmarks.studies.untuned import flt_decision

    summary = {"flt": {"edges": 0, "complete-graph": True, "other": 1},
               "final": {"finetuned": {"mean": 41.5}},
               "curve": [{"round": 1}, {"round": 2, "safeguard-finetune-evidence": 2.0},
                         {"round": 3, "safeguard-finetune-evidence": 0.5}, {"round": 4}]}
    assert flt_decision(summary) == {"edges": 0, "complete-graph": True, "finetuned": 41.5,
                                     "finetune-evidence": 0.5}
    assert flt_decision({"flt": {"edges": 3}}) == {"edges": 3}  # a graph, no fine-tuning


def test_the_untuned_study_adds_a_settings_next_seeds_under_the_names_the_lists_use():
    from benchmarks.studies.untuned import load, more_seeds

    _, settings = load()
    u07 = [s for s in settings if s["name"] == "u07-shards"]
    grown = more_seeds(u07, 2)
    assert [(s["name"], s["seed"]) for s in grown] == [
        ("u07-shards", 1750), ("u07-shards-s1751", 1751), ("u07-shards-s1752", 1752)]
    # the hand-added seeds of the committed list are these, to the key
    listed = {s["name"]: s for s in settings}
    assert all(listed[s["name"]] == s for s in grown)
    assert more_seeds(u07, 0) == u07


def test_the_untuned_studys_page_gives_other_methods_their_delta_against_the_same_baselines():
    from docs.results.studies import untuned

    from benchmarks.common import RESULTS_DIR

    stored = json.loads((RESULTS_DIR / "untuned-fresh.json").read_text())
    meta = {k: v for k, v in stored.items() if k != "rows"}
    row = {"name": "u01", "structure": "groups", "seed": 3,
           "set": {"partition": "iid", "num-clients": 10, "max-samples-per-client": 50,
                   "fraction-train": 1.0},
           "means": {"sfl-star": 80.0, "fedska": 70.5, "fedavg": 72.0, "fedavg+FT": 75.0,
                     "local": 60.0}}
    page = untuned(meta, [row])
    assert page.startswith("# untuned-fresh: sfl-star, fedska on settings no rule was tuned on")
    header = next(line for line in page.splitlines() if line.startswith("| setting"))
    assert header.endswith("| sfl-star | Δ sfl-star | fedska | Δ fedska |")
    cells = next(line for line in page.splitlines() if line.startswith("| u01")).split(" | ")
    assert cells[-4:] == ["80.00", "+5.00", "70.50", "-4.50 |"]
    plain = untuned(meta, [{**row, "means": {"flt": 1.0, "fedavg": 2.0, "fedavg+FT": 3.0,
                                              "local": 4.0}}])
    assert "Beside FLT" not in plain


def test_every_committed_results_page_is_what_its_json_renders_today():
    """A committed `.md` beside a `.json` is the renderer's page for that JSON (`python -m docs.gen
    results --out DIR` writes them; notes written by hand live in the JSON and are rendered too)."""
    import subprocess

    from docs.gen import RESULTS, render_result, result_files

    tracked = set(subprocess.run(["git", "ls-files", "benchmarks/results"], capture_output=True,
                                 text=True, check=True, cwd=RESULTS.parent.parent).stdout.split())
    stale = []
    for path in result_files(RESULTS):
        page = path.with_suffix(".md")
        if page.relative_to(RESULTS.parent.parent).as_posix() not in tracked:
            continue
        text = render_result(path)
        committed = page.read_text()
        if text is not None and committed != text:
            stale.append(page.relative_to(RESULTS).as_posix())
    assert stale == [], f"{len(stale)} results pages differ from their JSON's rendering: {stale[:5]}"


# --- benchmarks/results/ holds what the documentation cites (docs/cited.py) -------------------------
def test_every_committed_result_file_is_cited_by_the_docs():
    """A tracked file under benchmarks/results/ is linked by a docs page or README.md (with what its
    page shows and links), read by a generated part, or named by path in the code; a run nobody
    cites is not committed (`python -m docs.cited` lists them)."""
    from docs import cited

    files = cited.cited_files()
    assert cited.RESULTS / "default-job.json" in files  # README's quick-start comparison
    assert cited.RESULTS / "suite" / "suite.json" in files  # the robustness suite's Δ matrix
    left = [p.relative_to(cited.REPO).as_posix() for p in cited.tracked() if p.resolve() not in files]
    assert left == [], f"{len(left)} committed result files cited by no page: {left[:10]}"


def test_a_result_page_cites_its_json_its_pictures_and_the_pages_it_links(tmp_path, monkeypatch):
    from docs import cited

    monkeypatch.setattr(cited, "RESULTS", tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.md").write_text("# a\n\n![curve](a.png)\n\nsee [b](sub/b.md), [web](https://x.org/c.md)\n")
    for name in ("a.json", "a.png", "sub/b.md", "sub/b.json", "lone.json"):
        (tmp_path / name).write_text("{}")
    found: set = set()
    monkeypatch.setattr(cited, "_page_text", lambda page: page.read_text() if page.suffix == ".md" else "")
    cited._cite_page(tmp_path / "a.md", found, set())
    assert {p.relative_to(tmp_path).as_posix() for p in found} == {"a.md", "a.json", "a.png", "sub/b.md",
                                                                   "sub/b.json"}
