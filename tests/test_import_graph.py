"""Imports point downward only: server_app → strategies → models / datasets, client_app → strategies
→ models / datasets, the harness on top; no circle among modules (lazy imports included)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from import_graph import PACKAGES, REPO, cycles, group, module_imports, package_edges

ALLOWED = {
    "server_app.harness": {"server_app", "client_app", "strategies", "models", "datasets"},
    "server_app": {"strategies", "models", "datasets"},
    "client_app": {"strategies", "models", "datasets"},
    "strategies": {"models", "datasets"},
    "models": set(),
    "datasets": set(),
}


def test_every_edge_between_packages_points_downward():
    upward = {edge: examples for edge, examples in package_edges(module_imports()).items()
              if edge[1] not in ALLOWED[edge[0]]}
    assert upward == {}


def test_no_module_imports_itself_through_others():
    assert cycles(module_imports()) == []


def test_the_checker_sees_lazy_imports_and_circles():
    edges = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "b.w": set()}
    assert cycles(edges) == [["a.x", "a.y", "a.z"]]
    graph = module_imports()
    # a lazy (in-function) import: the registry wraps a strategy for client-level DP only when asked
    assert "strategies.shared.private_aggregation" in graph["strategies.shared.registry"]
    assert group("server_app.harness.simulate") == "server_app.harness"


@pytest.mark.parametrize("package", ["datasets", "models", "strategies", "client_app"])
def test_importing_a_package_loads_nothing_above_it(package):
    """Every module of `package`, imported in a fresh interpreter, loads no module of a package that
    may not be imported from it."""
    modules = sorted(m for m in module_imports() if group(m) == package)
    code = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted({{n.split('.')[0] for n in sys.modules}} & {set(PACKAGES)!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=300)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1])) - {package}
    assert loaded <= ALLOWED[package]


# Every method's name as code and prose spell it: registered names (`sfl-star`), package names
# (`lg_fedavg`) and their joined spelling (`LGFedAvg`), matched case-insensitively where no other
# letter of the same case continues the word (`SFLTrain` and `cfg.fedcg` name a method; `fedup` would
# not). `local` is also an ordinary word and is not searched. `FedAvg`, spelt exactly so, names the
# weighted-mean rule (McMahan et al.'s, which Flower's `FedAvg` implements) and may appear; the id
# `fedavg` (the method) may not.
GENERIC_WORDS = {"local"}
RULE_NAMES = {"FedAvg"}


def method_spellings() -> set[str]:
    from strategies.shared.registry import method_names

    packages = {p.name for p in (REPO / "strategies" / "methods").iterdir() if (p / "__init__.py").is_file()}
    names = {*method_names(), *packages}
    spellings = {spelling for name in names
                 for spelling in (name, name.replace("_", "-"), name.replace("_", "").replace("-", ""))}
    return {s for s in spellings if s not in GENERIC_WORDS and not s.endswith("-star")}


def shared_modules() -> list[Path]:
    """Every module of `strategies/` outside the method packages."""
    return sorted([REPO / "strategies" / "__init__.py", REPO / "strategies" / "methods" / "__init__.py",
                   *(REPO / "strategies" / "shared").rglob("*.py")])


def methods_named(text: str, spellings: set[str]) -> list[tuple[int, str, str]]:
    """(line, method, as written) of every place `text` names a method (the longest spelling that
    matches there: `LG-FedAvg` is lg-fedavg, not fedavg)."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        taken: list[tuple[int, int, str, str]] = []
        for name in sorted(spellings, key=len, reverse=True):
            for match in re.finditer(rf"(?<![a-z])(?i:{re.escape(name)})(?![a-z])", line):
                if any(start < match.end() and match.start() < end for start, end, _, _ in taken):
                    continue
                taken.append((match.start(), match.end(), name, match.group(0)))
        for _, end, name, written in sorted(taken):
            if written in RULE_NAMES and not line[end:end + 1].isupper():
                continue
            found.append((number, name, written))
    return found


def test_the_checker_finds_method_names_in_code_and_prose():
    spellings = method_spellings()
    assert {"sfl", "fedcg", "lg-fedavg", "lgfedavg", "fedavg"} <= spellings
    text = ("import strategies.methods.sfl\nclass X(SFLTrain): pass\ncfg.fedcg\nLG-FedAvg and LGFedAvg\n"
            "the FedAvg rule; fedup; local training\nmethod = 'fedavg'\nFedAvgStrategy\n")
    assert methods_named(text, spellings) == [
        (1, "sfl", "sfl"), (2, "sfl", "SFL"), (3, "fedcg", "fedcg"), (4, "lg-fedavg", "LG-FedAvg"),
        (4, "lgfedavg", "LGFedAvg"), (6, "fedavg", "fedavg"), (7, "fedavg", "FedAvg")]
    assert methods_named("`fedper` and `lg-fedavg`", spellings) == [(1, "fedper", "fedper"),
                                                                   (1, "lg-fedavg", "lg-fedavg")]


def test_no_module_outside_the_method_packages_names_a_method():
    """A shared module's piece that belongs to one method moves into that method's package; a shared
    piece is described generically ("a graph method", "a method's second matrix")."""
    spellings = method_spellings()
    found = [f"{path.relative_to(REPO)}:{line}: {name} ({written})"
             for path in shared_modules()
             for line, name, written in methods_named(path.read_text(), spellings)]
    assert found == [], "modules outside strategies/methods/<method>/ naming a method:\n" + "\n".join(found)
