"""A method package declares itself in one place: `METHODS = (Method(...), ...)` beside its settings
(`settings.py`), the builder named as "module:function"; the package's `__init__` is a docstring
and the one import of that declaration. Importing the registry imports no server step; every named
builder resolves; a wrong name is refused naming the method and the string."""

import ast
import json
import subprocess
import sys

import pytest

from strategies.shared.method import Method, builder
from strategies.shared.registry import METHODS
from tests.conftest import REPO

PACKAGES = sorted(p for p in (REPO / "strategies" / "methods").iterdir() if (p / "__init__.py").is_file())


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_a_package_init_is_its_docstring_and_the_import_of_its_declaration(package):
    tree = ast.parse((package / "__init__.py").read_text())
    assert ast.get_docstring(tree), f"{package.name}/__init__.py has no docstring"
    body = tree.body[1:]
    module = f"strategies.methods.{package.name}.settings"
    assert [(type(n).__name__, getattr(n, "module", None), [a.name for a in getattr(n, "names", [])])
            for n in body] == [("ImportFrom", module, ["METHODS"])]
    declared = ast.parse((package / "settings.py").read_text())
    assert any(isinstance(n, ast.Assign) and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["METHODS"]
               for n in declared.body), f"{package.name}/settings.py declares no METHODS"


def test_every_registered_builder_is_named_and_resolves_to_its_package():
    for name, method in METHODS.items():
        assert isinstance(method.build, str), f"{name}: builder not named as 'module:function'"
        assert method.build.startswith(method.package + "."), (name, method.build)
        assert callable(builder(name, method.build))


def test_importing_the_registry_imports_no_server_step():
    code = ("import json, sys\nimport strategies.shared.registry\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('strategies.methods.') "
            "and m.endswith('.server'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=300)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_builder_that_does_not_resolve_is_refused_naming_the_method_and_the_string():
    with pytest.raises(ImportError, match=r"method 'x': build='strategies.shared.graph:nothing': "
                                          r"strategies.shared.graph has no function 'nothing'"):
        builder("x", "strategies.shared.graph:nothing")
    with pytest.raises(ImportError, match=r"method 'x': build='no-colon' must be a callable or 'module:function'"):
        builder("x", "no-colon")
    method = Method("x", lambda cfg, storage: (cfg, storage))
    assert method.strategy("cfg", "storage") == ("cfg", "storage")  # a callable builder as before
    assert method.package == __name__
