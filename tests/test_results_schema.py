"""Result files have one schema that the docs render without benchmark code, and the one-off studies
stand apart from the runners: every committed result file fits `docs.results`' schema; no module of
docs/ imports from `benchmarks`; every study in benchmarks/studies/ says on its first line the
question it answered and is listed in benchmarks/README.md."""

import ast
import json
import subprocess
from pathlib import Path

import pytest

from docs import results
from tests.conftest import REPO

STUDIES = REPO / "benchmarks" / "studies"


def _tracked_results() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "benchmarks/results"], cwd=REPO, text=True,
                         capture_output=True, check=True).stdout
    return sorted(REPO / p for p in out.split("\0") if p.endswith(".json"))


def test_every_committed_result_file_fits_the_schema():
    paths = _tracked_results()
    assert len(paths) > 100
    kinds = {}
    problems = []
    for path in paths:
        data = json.loads(path.read_text())
        problems += results.problems(path.relative_to(REPO), data)
        kinds[results.kind_of(path, data)] = kinds.get(results.kind_of(path, data), 0) + 1
    assert problems == []
    assert set(kinds) == {"comparison", "suite", "study"}


def test_the_schema_check_names_the_file_and_the_missing_key():
    comparison = {"name": "x", "command": "c", "summaries": []}
    found = results.problems(Path("benchmarks/results/x.json"), comparison)
    assert any("x.json" in p and "'machine'" in p for p in found)
    found = results.problems(Path("benchmarks/results/sfl-scale.json"),
                             {"command": "c", "machine": {}, "code": {}})
    assert found == ["benchmarks/results/sfl-scale.json: sfl_scale result without 'rows', which its "
                     "renderer docs.results.studies.sfl_scale reads"]
    assert results.problems(Path("a.json"), [1]) == ["a.json: a result file is one JSON object, not list"]


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", ""))
              == "import_module" and node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr))):
            first = node.args[0]
            text = first.value if isinstance(first, ast.Constant) else "".join(
                v.value for v in first.values if isinstance(v, ast.Constant))
            names.append(str(text))
    return names


def test_no_docs_module_imports_benchmark_code():
    modules = sorted((REPO / "docs").rglob("*.py"))
    assert len(modules) > 10
    found = [f"{p.relative_to(REPO)}: {name}" for p in modules for name in _imports(p)
             if name == "benchmarks" or name.startswith("benchmarks.")]
    assert found == []


def test_the_import_check_sees_a_lazy_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import importlib\ndef f():\n    from benchmarks.compare import markdown\n"
                      "    return importlib.import_module(f'benchmarks.{x}')\n")
    assert _imports(module) == ["importlib", "benchmarks.compare", "benchmarks."]


@pytest.mark.parametrize("study", sorted(p.stem for p in STUDIES.glob("*.py") if p.stem != "__init__"))
def test_every_study_says_the_question_it_answered_and_is_listed(study):
    doc = ast.get_docstring(ast.parse((STUDIES / f"{study}.py").read_text()))
    first = (doc or "").splitlines()[0]
    assert first.endswith("?"), f"benchmarks/studies/{study}.py: first docstring line is not a question"
    assert f"| `{study}` | {first} |" in (REPO / "benchmarks" / "README.md").read_text()
    assert f"- `{study}`: {first}" in (STUDIES / "__init__.py").read_text()
