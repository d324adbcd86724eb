"""The robustness suite's machinery (benchmarks/suite.py) on a tiny grid, and its Δ arithmetic."""

import json

import pytest

from benchmarks.suite import (
    SETTINGS, CellResult, delta_matrix, delta_vs_baselines, final_share, main, merge, run_suite,
)


def _cell(label, seed, mean, share=None, setting="domains", rho=0.2):
    return CellResult(setting, rho, seed, label, label.split(" ")[0], mean, mean - 10, [(1, mean)],
                      [(1e6, mean)], share or [], "true-clusters" if share else "", 1.0)


def test_delta_is_the_seed_mean_of_the_margin_over_the_better_baseline():
    results = [_cell("fedavg", 0, 60.0), _cell("local", 0, 70.0), _cell("sfl", 0, 75.0),
               _cell("fedavg", 1, 80.0), _cell("local", 1, 50.0), _cell("sfl", 1, 78.0),
               _cell("sfl-star", 0, 71.0, share=[0.3, 0.9]), _cell("sfl-star", 1, 70.0,
                                                                   share=[0.5, 0.7])]
    assert delta_vs_baselines(results, "domains", 0.2, "sfl") == pytest.approx((5.0 - 2.0) / 2)
    assert delta_vs_baselines(results, "domains", 0.2, "sfl-star") == pytest.approx((1 - 10) / 2)
    assert delta_vs_baselines(results, "domains", 1.0, "sfl") is None
    share, kind = final_share([r for r in results if r.label == "sfl-star"])
    assert share == pytest.approx(0.8) and kind == "true-clusters"
    matrix = delta_matrix(results, [SETTINGS["domains"]], [0.2], ["# x"])
    assert "| sfl | +1.50 |" in matrix and "| fedavg |" not in matrix


def test_the_conv_model_runs_are_measured_against_the_conv_model_baselines():
    results = [_cell("fedavg", 0, 80.0), _cell("local", 0, 70.0), _cell("fedavg (cnn)", 0, 50.0),
               _cell("local (cnn)", 0, 55.0), _cell("fedcg (cnn)", 0, 58.0)]
    assert delta_vs_baselines(results, "domains", 0.2, "fedcg (cnn)") == pytest.approx(3.0)
    matrix = delta_matrix(results, [SETTINGS["domains"]], [0.2], ["# x"])
    assert "| fedcg (cnn) | +3.00 |" in matrix and "| local (cnn) |" not in matrix


def test_fedavg_plus_fine_tuning_is_a_baseline_of_every_delta():
    def cell(label, mean):
        result = _cell(label, 0, mean)
        result.method = label.removesuffix("+FT")
        return result

    results = [cell("fedavg", 60.0), cell("fedavg+FT", 80.0), cell("local", 70.0),
               cell("sfl", 79.0), cell("sfl+FT", 83.0)]
    assert delta_vs_baselines(results, "domains", 0.2, "sfl") == pytest.approx(-1.0)
    assert delta_vs_baselines(results, "domains", 0.2, "sfl+FT") == pytest.approx(3.0)
    matrix = delta_matrix(results, [SETTINGS["domains"]], [0.2], ["# x"])
    assert "| fedavg+FT |" not in matrix and "| sfl+FT | +3.00 |" in matrix
    assert "max(FedAvg, FedAvg+FT, Local)" in matrix


def test_a_part_merged_with_a_suffix_keeps_its_graph_rows_beside_the_new_ones(tmp_path):
    _part(tmp_path / "old", [_cell("fedavg", 0, 60.0), _cell("local", 0, 70.0),
                             _cell("sfl", 0, 50.0), _cell("ditto", 0, 65.0)])
    _part(tmp_path / "new", [_cell("fedavg", 0, 60.0), _cell("local", 0, 70.0),
                             _cell("sfl", 0, 71.0)])
    merged = merge([f"{tmp_path / 'old'}:: (off)", tmp_path / "new"], tmp_path / "merged", "merge")
    assert sorted((r.label, r.mean) for r in merged) == [
        ("ditto", 65.0), ("fedavg", 60.0), ("local", 70.0), ("sfl", 71.0), ("sfl (off)", 50.0)]
    delta = (tmp_path / "merged" / "suite-delta.md").read_text()
    assert "| sfl (off) | -20.00 |" in delta and "| sfl | +1.00 |" in delta


def test_wrong_cluster_counts_are_true_minus_two_and_plus_three():
    assert SETTINGS["label-clusters"].cluster_counts() == [3, 8]
    assert SETTINGS["domains"].cluster_counts() == [2, 7]
    assert SETTINGS["shards"].cluster_counts() == []


def test_a_tiny_grid_writes_tables_the_delta_matrix_and_byte_curves(tiny_run, tmp_path):
    extra = {k: v for k, v in tiny_run.items() if k not in ("output-dir", "run-name", "method")}
    extra.update({"num-clients": 8, "num-rounds": 1, "max-samples-per-client": 60})
    results = run_suite([SETTINGS["label-clusters"]], [1.0], [0], ["fedavg", "local", "ifca"],
                        extra, tmp_path / "results", tmp_path / "runs", "test", fedcg=False)
    labels = [r.label for r in results]
    assert labels == ["fedavg", "local", "ifca", "ifca (C=3)", "ifca (C=8)"]
    out = tmp_path / "results"
    for name in ("suite-label-clusters.md", "suite-delta.md", "suite.json",
                 "suite-bytes-label-clusters-rho1.png", "label-clusters-rho1-seed0.png",
                 "label-clusters-rho1-seed0-clusters3.md"):
        assert (out / name).exists(), name
    by = {r.label: r for r in results}
    ifca, fedavg, local = by["ifca"], by["fedavg"], by["local"]
    expected = ifca.mean - max(fedavg.mean, local.mean)
    assert f"| ifca | {expected:+.2f} |" in (out / "suite-delta.md").read_text()
    assert len(ifca.curve) == 2 and ifca.cumulative_bytes[-1][0] > ifca.cumulative_bytes[0][0]
    stored = json.loads((out / "suite.json").read_text())
    assert len(stored["results"]) == 5 and stored["settings"] == ["label-clusters"]
    merged = merge([out], tmp_path / "merged", "test merge")  # parts run apart, joined
    assert [r.label for r in merged] == labels
    assert f"| ifca | {expected:+.2f} |" in (tmp_path / "merged" / "suite-delta.md").read_text()
    assert (tmp_path / "merged" / "label-clusters-rho1-seed0.md").exists()


def _part(directory, results):
    directory.mkdir(parents=True)
    (directory / "suite.json").write_text(json.dumps(
        {"command": f"run {directory.name}", "results": [r.__dict__ for r in results]}))
    (directory / "domains-rho0.2-seed0.md").write_text(directory.name)


def test_a_later_part_replaces_the_rows_it_re_ran_and_keeps_the_first_cell_files(tmp_path):
    _part(tmp_path / "all", [_cell("fedavg", 0, 60.0), _cell("local", 0, 70.0),
                             _cell("flt", 0, 50.0)])
    _part(tmp_path / "flt-again", [_cell("fedavg", 0, 60.0), _cell("local", 0, 70.0),
                                   _cell("flt", 0, 72.0)])
    merged = merge([tmp_path / "all", tmp_path / "flt-again"], tmp_path / "merged", "merge")
    assert [(r.label, r.mean) for r in merged] == [("fedavg", 60.0), ("local", 70.0), ("flt", 72.0)]
    assert "| flt | +2.00 |" in (tmp_path / "merged" / "suite-delta.md").read_text()
    assert (tmp_path / "merged" / "domains-rho0.2-seed0.md").read_text() == "all"


def test_the_command_line_rejects_an_unknown_setting(capsys):
    with pytest.raises(SystemExit):
        main(["--settings", "spirals"])
    assert "unknown setting" in capsys.readouterr().err


def test_the_committed_grid_is_the_suites_default(tmp_path):
    """benchmarks/experiments/suite.toml is the grid `python -m benchmarks.suite` runs."""
    from benchmarks.suite import COMMON, GRID, METHODS, PARTICIPATION, load_grid

    grid = load_grid(GRID)
    assert list(grid.settings) == ["shards", "label-clusters", "domains", "dirichlet"] == list(SETTINGS)
    assert grid.methods == METHODS and "fedu" in METHODS and grid.participation == PARTICIPATION == (1.0, 0.2)
    assert grid.common == COMMON and COMMON["num-rounds"] == 20
    assert SETTINGS["domains"].fedcg and SETTINGS["domains"].overrides["fedcg.domains"] == 4
    assert SETTINGS["label-clusters"].true_clusters == 5 and not SETTINGS["dirichlet"].fedcg


@pytest.mark.parametrize(("text", "message"), [
    ('methods = ["fedavg"]\nparticipation = [1.0]\nrounds = 3\n[common]\n[[settings]]\nname = "a"\n'
     'title = "A"\n', "unknown keys \\['rounds'\\]"),
    ('methods = []\nparticipation = [1.0]\n[common]\n[[settings]]\nname = "a"\ntitle = "A"\n',
     "methods must be a non-empty list"),
    ('methods = ["fedavg"]\nparticipation = [0]\n[common]\n[[settings]]\nname = "a"\ntitle = "A"\n',
     "participation must be a list of fractions"),
    ('methods = ["fedavg"]\nparticipation = [1.0]\n[common]\n[[settings]]\nname = "a"\ntitle = "A"\n'
     'clusters = 3\n', "a \\[\\[settings\\]\\] entry has keys \\['clusters'\\]"),
    ("methods = [", "not a readable TOML file"),
])
def test_a_grid_file_is_checked_naming_the_file_and_the_key(tmp_path, text, message):
    from benchmarks.suite import load_grid

    path = tmp_path / "grid.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        load_grid(path)
    assert str(path) in str(err.value)


def test_the_command_line_takes_another_grid_file(tmp_path, capsys):
    path = tmp_path / "mine.toml"
    path.write_text('methods = ["fedavg"]\nparticipation = [1.0]\n[common]\nnum-rounds = 1\n'
                    '[[settings]]\nname = "spirals"\ntitle = "Spirals"\nset = { partition = "iid" }\n')
    with pytest.raises(SystemExit):
        main(["--config", str(path), "--settings", "shards"])  # not in this grid
    assert "unknown setting(s) ['shards']; allowed: spirals" in capsys.readouterr().err


def test_the_committed_suite_has_every_method_of_the_grid_in_every_cell_and_seed():
    """benchmarks/results/suite/suite.json (the tables of docs/robustness-suite.md) holds a row of each
    method the grid lists (scaffold and fedatt included) on every setting × ρ × seed it ran."""
    from benchmarks.suite import METHODS, SUITE_DIR, delta_table, load_results

    stored = json.loads((SUITE_DIR / "suite.json").read_text())
    results = load_results(SUITE_DIR / "suite.json")
    assert {"scaffold", "fedatt"} <= set(METHODS)
    ran = {(r.setting, r.rho, r.seed, r.method) for r in results if r.mean is not None}
    missing = [(s, rho, seed, m) for s in stored["settings"] for rho in stored["rhos"]
               for seed in stored["seeds"] for m in METHODS if (s, rho, seed, m) not in ran]
    assert missing == []
    assert set(stored["settings"]) == set(SETTINGS) and stored["seeds"] == [0, 1, 2]
    matrix = delta_table(SUITE_DIR / "suite.json").splitlines()
    for method in ("scaffold", "fedatt"):  # a row of the Δ matrix, a Δ in every cell
        row = next(line for line in matrix if line.startswith(f"| {method} |"))
        assert "—" not in row
