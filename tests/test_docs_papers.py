"""docs/papers.md: each paper table rendered from its config (benchmarks/papers/*.toml) and the
committed results (docs/blocks/papers.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from docs import gen
from docs.blocks import papers
from docs.blocks.data import num

PAGE = gen.DOCS / "papers.md"
CONFIGS = sorted(papers.PAPERS.glob("*.toml"))
FEDSKA = papers.PAPERS / "fedska-table1.toml"


def test_the_page_shows_every_paper_table_and_each_cells_numbers_from_its_config():
    text = PAGE.read_text()
    shown = set(re.findall(r"<!-- gen:paper (\S+) -->", text))
    assert shown == {p.stem for p in CONFIGS}
    for path in CONFIGS:
        grid = papers.load(path.stem)
        block = papers.paper_table(path.stem)
        assert block in text
        for cell in grid["cells"]:
            row = next(line for line in block.splitlines() if line.startswith(f"| {cell['label']} |"))
            for entry in cell["reported"].values():
                for value in (entry.values() if isinstance(entry, dict) else [entry]):
                    assert num(value) in row, (path.name, cell["name"], value)
        for difference in grid["differences"]:
            assert f"- {difference}" in block


def test_a_cell_without_a_committed_run_says_what_it_needs(monkeypatch):
    # as if no cell had a committed run (every MNIST cell of the table has one)
    monkeypatch.setattr(papers, "committed", lambda grid, name, cell: [])
    block = papers.paper_table("fedska-table1")
    assert "| CIFAR-10 q=2 (`cifar10-q2`) | CIFAR-10 |" in block
    assert "not run here: needs CIFAR-10 at `data-root`" in block
    assert "not run here yet (MNIST needs no `data-root`)" in block
    assert ("python -m benchmarks.compare --config benchmarks/papers/fedska-table1.toml "
            "--cells cifar10-q2,cifar10-q5,cifar10-q10,shakespeare --set data-root=/data") in block


# the settings the committed comparisons flt-label-clusters-m50-r100{,-e5}-seed{0,1} ran with (their
# `overrides`), as a paper-table config writes them
RAN = ('dataset = "mnist"\npartition = "label-clusters"\nnum-clusters = 5\nlabels-per-cluster = 2\n'
       'num-clients = 50\nmax-samples-per-client = 300\nmodel = "mlp"\nnum-rounds = 100\n'
       'batch-size = 10\nlr = 0.01\nmomentum = 0.5\nfraction-train = 0.2\nfinetune-epochs = 0\n'
       'client-threads = 1\n')


def _grid_of_committed_runs(tmp_path, monkeypatch, methods='["fedavg", "flt", "ifca", "fedsem"]',
                            common=RAN, e5='local-epochs = 5'):
    """A config `flt-label-clusters` whose cells are named after committed comparisons."""
    head = FEDSKA.read_text().split("[common]")[0]
    head = head.replace('methods = ["local", "fedavg", "fedprox", "ditto", "ifca", "fedu", "sfl", "fedska"]',
                        f"methods = {methods}").replace("seeds = [0]", "seeds = [0, 1, 7]")
    cells = "".join(f'[[cells]]\nname = "{n}"\nlabel = "{n}"\nset = {{ {e} }}\n'
                    f"reported = {{ fedavg = 1.5 }}\n"
                    for n, e in (("m50-r100", "local-epochs = 2"), ("m50-r100-e5", e5)))
    (tmp_path / "flt-label-clusters.toml").write_text(head + "[common]\n" + common + cells)
    monkeypatch.setattr(papers, "PAPERS", tmp_path)


def test_a_committed_run_of_a_cell_is_shown_with_its_numbers_and_linked(tmp_path, monkeypatch):
    """A config whose cell's runs are committed (here: named after committed comparisons, with the
    settings they ran) gets a Bouquet table read from their JSON, each row linking its results page,
    its numbers those the page shows (the docs' check of cited rows), and each run's command."""
    from tests.test_docs import shown_numbers_missing

    _grid_of_committed_runs(tmp_path, monkeypatch)
    block = papers.paper_table("flt-label-clusters")
    rows = [line for line in block.splitlines() if line.startswith("|") and "](results/" in line]
    stems = [f"flt-label-clusters-{c}-seed{s}" for c in ("m50-r100", "m50-r100-e5") for s in (0, 1)]
    assert [re.search(r"\[`([^`]+)`\]", row).group(1) for row in rows] == stems  # seed 7: none
    for stem, row in zip(stems, rows):
        data = json.loads((gen.RESULTS / f"{stem}.json").read_text())
        for summary in data["summaries"]:
            if summary["method"] in ("fedavg", "flt", "ifca"):
                assert num(summary["final"]["personalized"]["mean"]) in row
        assert f"- `{stem}`: `{data['command']}`" in block
    assert ("| m50-r100 (`m50-r100`) | MNIST | `local-epochs=2` | committed: seed 0, seed 1 |"
            in block)
    cited = [(PAGE, row, [gen.RESULTS / f"{stem}.json"]) for stem, row in zip(stems, rows)]
    assert shown_numbers_missing(cited) == []
    assert f"[`{stems[0]}.json`](results/{stems[0]}.md)" in block  # the sources line
    assert "Not yet run here" not in block


def test_a_cell_committed_with_part_of_its_methods_names_those_it_did_not_run(tmp_path, monkeypatch):
    _grid_of_committed_runs(tmp_path, monkeypatch, methods='["fedavg", "flt", "ifca", "fedsem", "local"]')
    block = papers.paper_table("flt-label-clusters")
    assert "| committed: seed 0, seed 1; not run yet: `local` |" in block
    assert ("- m50-r100 (`m50-r100`): committed without `local` (— in Bouquet's table); `python -m "
            "benchmarks.compare --config") in block
    row = next(line for line in block.splitlines() if line.startswith("| m50-r100: "))
    assert row.endswith("| — |")


def test_a_committed_run_made_with_other_settings_than_its_cell_is_refused(tmp_path, monkeypatch):
    """The page shows a run's numbers as the config's only when it ran exactly the cell's settings and
    the config's methods."""
    _grid_of_committed_runs(tmp_path, monkeypatch, e5="local-epochs = 4")
    with pytest.raises(ValueError, match=r"flt-label-clusters-m50-r100-e5-seed0\.json did not run "
                                         r".*cell 'm50-r100-e5' as configured: local-epochs = 5 "
                                         r"\(config: 4\)"):
        papers.paper_table("flt-label-clusters")
    _grid_of_committed_runs(tmp_path, monkeypatch, common=RAN.replace("client-threads = 1\n", ""))
    with pytest.raises(ValueError, match=r"client-threads = 1 \(config: 'unset'\)"):
        papers.paper_table("flt-label-clusters")
    _grid_of_committed_runs(tmp_path, monkeypatch, methods='["fedavg", "flt", "ifca"]')
    with pytest.raises(ValueError, match=r"ran \['fedsem'\], which .* does not list"):
        papers.paper_table("flt-label-clusters")


def test_a_config_without_its_paper_data_is_refused_naming_the_file_and_key(tmp_path, monkeypatch):
    source = (papers.PAPERS / "flt-table2.toml").read_text()
    monkeypatch.setattr(papers, "PAPERS", tmp_path)
    (tmp_path / "a.toml").write_text(source.replace("[reported]", "[reported-x]"))
    with pytest.raises(ValueError, match=r"a\.toml needs a \[reported\] table"):
        papers.load("a")
    (tmp_path / "b.toml").write_text(source.replace("reported = { fedavg", "reported = { scaffold"))
    with pytest.raises(ValueError, match=r"cell 'structured' reports \['scaffold'\], which it does not run"):
        papers.load("b")
    (tmp_path / "c.toml").write_text(source.replace('format = "{acc}±{se} / {var}"',
                                                    'format = "{acc} / {sd}"'))
    with pytest.raises(KeyError, match=r"cell 'structured' fedavg has no 'sd'"):
        papers.paper_table("c")
    with pytest.raises(FileNotFoundError, match="no paper table"):
        papers.load("missing")


def test_fedska_table1s_committed_mnist_run_is_its_cell_and_shown_beside_the_paper():
    """The MNIST q=2 cell of FedSKA Table 1 is committed as the config runs it (checked_run), and the
    page shows its numbers, its command and the methods it has not run."""
    grid = papers.load("fedska-table1")
    cell = next(c for c in grid["cells"] if c["name"] == "mnist-q2")
    run = papers.checked_run(grid, cell, "fedska-table1-mnist-q2-seed0")
    assert run.settings["num-rounds"] == 200 and run.settings["num-clients"] == 100
    block = papers.paper_table("fedska-table1")
    row = next(line for line in block.splitlines() if line.startswith("| MNIST q=2: "))
    assert all(num(run.pers(m)) in row for m in run.methods)
    assert f"- `fedska-table1-mnist-q2-seed0`: `{run.data['command']}`" in block
    left = [m for m in grid["methods"] if m not in run.methods]
    assert papers.not_run(grid, "fedska-table1", cell) == left
    if left:
        assert "not run yet: " + ", ".join(f"`{m}`" for m in left) in block
