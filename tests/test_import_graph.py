"""Imports point downward only: server_app → strategies → models / datasets, client_app → strategies
→ models / datasets, the harness on top; no circle among modules (lazy imports included)."""

import json
import subprocess
import sys

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
    # a lazy (in-function) import: a method package builds its strategy only when asked
    assert "strategies.methods.sfl.server" in graph["strategies.methods.sfl"]
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


# Methods whose fields and names have left the shared package (its message contract, validation's
# model records): a shared module that names one of them again fails here.
NAMED_ONLY_IN_THEIR_PACKAGE = ("fedprox", "ditto", "ifca", "fedsem", "flt", "fedska", "fedu")


def test_the_shared_package_names_none_of_these_methods():
    import re

    found = {}
    for path in sorted((REPO / "strategies" / "shared").glob("*.py")):
        text = path.read_text().lower()
        names = [m for m in NAMED_ONLY_IN_THEIR_PACKAGE if re.search(rf"\b{m}\b", text)]
        if names:
            found[path.name] = names
    assert found == {}, f"shared modules naming a method (move the piece into its package): {found}"
