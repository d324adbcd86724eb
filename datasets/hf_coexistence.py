"""Bouquet's `datasets` package and Hugging Face's `datasets` in one environment.

Both use the import name `datasets` (Hugging Face's is a dependency of Flower Datasets and of most Flower
examples). Bouquet keeps its folder `datasets/`; where another regular package named `datasets` is
installed too, the one module `datasets` serves both:

- `datasets.<name>` for a module in Bouquet's folder (`partition`, `sources`, ...) is Bouquet's module;
  every other `datasets.<name>` comes from the other package's folder (`__path__` lists both folders);
- the other package's `__init__.py` runs, in full and in this module's namespace, the first time something
  asks for it: one of its names (`from datasets import Dataset`, `datasets.load_dataset`,
  `datasets.__version__`) or one of its submodules (`import datasets.features`). Bouquet's own imports
  never do, so a Bouquet process does not pay Hugging Face's import (about 1.5 s) unless something in it
  uses Hugging Face's package;
- a module name in both folders, or a name the other `__init__.py` defines that is also one of Bouquet's
  modules, is an ImportError naming both files and the fix: never silently one or the other.

Whichever `datasets` folder Python's path search meets first, the result is the same:

- Bouquet's folder first on `sys.path` (a FAB that `flwr run` or a SuperNode unpacked, a command run from
  the checkout): Bouquet's `__init__.py` runs and calls `share`.
- Bouquet installed (`pip install .` or `pip install -e .`): the wheel's `bouquet_fl_datasets.pth` calls
  `install()` of a copy of this file (`_bouquet_fl_datasets`) when the interpreter starts. Its finder
  resolves `import datasets` to Bouquet's folder (the first on `sys.path`, else the copy the wheel installs
  as `bouquet-fl/datasets/`, a path with no import name, so the two wheels own no file in common) before
  the path search could meet Hugging Face's in site-packages.

Standard library only: a copy of this file is imported at interpreter start-up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from types import ModuleType

NAME = "datasets"
MARKER = "hf_coexistence.py"  # the file that tells Bouquet's `datasets` folder from any other
BUNDLED = os.path.join("bouquet-fl", NAME)  # the wheel's copy of the folder, beside `_bouquet_fl_datasets`
STATE = "__bouquet_sharing__"  # the sharing's state, in the shared module's namespace


def is_bouquet_folder(folder: str) -> bool:
    """Bouquet's `datasets` folder, this version's (MARKER) or an earlier one's (an older FAB or checkout,
    whose `datasets` must still go with its own `server_app`): no other package has these files."""
    def has(name: str) -> bool:
        return os.path.isfile(os.path.join(folder, name))
    return has("__init__.py") and (has(MARKER) or (has("partition.py") and has("sources.py")))


def bouquet_folder() -> str | None:
    """Bouquet's `datasets` folder: the first on `sys.path` (the one `server_app` and the others are
    imported beside), else the one the wheel installed beside this file."""
    for entry in sys.path:
        if isinstance(entry, str):
            folder = os.path.join(entry or os.getcwd(), NAME)
            if is_bouquet_folder(folder):
                return folder
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), BUNDLED)
    return bundled if is_bouquet_folder(bundled) else None


class BouquetDatasetsFinder(importlib.abc.MetaPathFinder):
    """`import datasets` → Bouquet's folder; the rest of the sharing is `share`'s (run by its `__init__`)."""

    bouquet_datasets = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != NAME:
            return None
        folder = bouquet_folder()
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            NAME, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])


def install() -> None:
    """Put the finder first on `sys.meta_path` (once): what the wheel's `.pth` file runs at start-up."""
    if not any(getattr(finder, "bouquet_datasets", False) for finder in sys.meta_path):
        sys.meta_path.insert(0, BouquetDatasetsFinder())


def module_names(folder: str) -> set[str]:
    """The submodule names a folder provides: `x.py`, packages `x/` (namespace ones too)."""
    names = set()
    for entry in os.listdir(folder):
        stem, ext = os.path.splitext(entry)
        if ext == ".py" or (ext == "" and os.path.isdir(os.path.join(folder, entry))):
            names.add(stem)
    return {name for name in names if name.isidentifier() and not name.startswith("__")}


def other_package(own: str) -> importlib.machinery.ModuleSpec | None:
    """The first regular package `datasets` on `sys.path` that is not Bouquet's (nor a copy of it)."""
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        spec = importlib.machinery.PathFinder.find_spec(NAME, [entry])
        if spec is None or spec.origin is None or not spec.submodule_search_locations:
            continue  # nothing here, a namespace portion (a data folder called `datasets`), or a module
        folder = os.path.dirname(os.path.abspath(spec.origin))
        if not is_bouquet_folder(folder) and os.path.abspath(folder) != os.path.abspath(own):
            return spec
    return None


class Sharing:
    """One `datasets` module for Bouquet's folder and another package's: see the module docstring."""

    def __init__(self, namespace: dict, own: str, other: importlib.machinery.ModuleSpec):
        self.namespace = namespace
        self.own = own
        self.other_init = os.path.abspath(other.origin)
        self.other = os.path.dirname(self.other_init)
        self.own_names = module_names(own)
        self.clashes = sorted(self.own_names & module_names(self.other))
        self.lock = threading.RLock()
        self.state = "waiting"  # → "running" (its __init__ executes) → "done"

    def clash_error(self, names: list[str]) -> ImportError:
        listed = ", ".join(f"`{NAME}.{name}`" for name in names)
        return ImportError(
            f"{listed}: Bouquet's data package ({self.own}) and another package named `{NAME}` "
            f"({self.other}, Hugging Face's where `pip show {NAME}` says so) both define "
            f"{'this module' if len(names) == 1 else 'these modules'}, and one import name cannot mean "
            f"two modules. Fix: rename Bouquet's module (and its imports), or uninstall the other package "
            f"(`pip uninstall {NAME}`) if nothing in this environment uses it.")

    def load_other(self) -> None:
        """Run the other package's `__init__.py` in the shared namespace, once (again after a failure)."""
        with self.lock:
            if self.state != "waiting":
                return
            if self.clashes:
                raise self.clash_error(self.clashes)
            self.state = "running"
            try:
                with open(self.other_init, "rb") as file:
                    code = compile(file.read(), self.other_init, "exec")
                exec(code, self.namespace)
            except BaseException:
                self.state = "waiting"
                raise
            self.state = "done"
            shadowing = sorted(
                name for name in self.own_names if name in self.namespace
                and getattr(self.namespace[name], "__name__", None) != f"{NAME}.{name}")
            if shadowing:
                raise self.clash_error(shadowing)

    def module_getattr(self, name: str):
        """The module's `__getattr__`: a name it lacks may be one the other package defines."""
        if name in self.own_names or (name.startswith("__") and name != "__version__"):
            # Bouquet's submodules are imported, not looked up (`from datasets import partition` asks
            # first); probes for dunders (`__wrapped__`, `__all__`, ...) do not load the other package.
            raise AttributeError(f"module {NAME!r} has no attribute {name!r}")
        self.load_other()
        try:
            return self.namespace[name]
        except KeyError:
            raise AttributeError(f"module {NAME!r} has no attribute {name!r}") from None


class _AlreadyLoaded(importlib.abc.Loader):
    """Hands the import system a module that the other package's `__init__.py` has just imported."""

    def __init__(self, module: ModuleType):
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        module.__spec__ = self.spec


class OtherInitFirst(importlib.abc.MetaPathFinder):
    """Before the first of the other package's submodules is imported, its `__init__.py` runs (as in
    that package alone); a name both folders define is an error, for Bouquet's imports too."""

    def __init__(self, sharing: Sharing):
        self.sharing = sharing

    def find_spec(self, fullname, path=None, target=None):
        sharing = self.sharing
        if not fullname.startswith(NAME + "."):
            return None
        shared = sys.modules.get(NAME)
        if shared is None or vars(shared) is not sharing.namespace:
            return None
        top = fullname.split(".")[1]
        if top in sharing.clashes:
            raise sharing.clash_error([top])
        if top in sharing.own_names or sharing.state != "waiting":
            return None
        sharing.load_other()
        module = sys.modules.get(fullname)
        if module is None:
            return None  # the path search finds it in the other folder
        # Imported by that __init__: the import system, seeing the name in sys.modules, would load the
        # module's own spec again (a second copy); this spec hands back the module itself.
        spec = importlib.util.spec_from_loader(fullname, _AlreadyLoaded(module))
        module.__spec__ = spec
        return spec


def share(namespace: dict) -> None:
    """Called by Bouquet's `datasets/__init__.py` with its globals: where another package `datasets` is
    on `sys.path`, make this module serve both; otherwise change nothing."""
    if namespace.get(STATE) is not None:
        return  # a reload
    own = os.path.dirname(os.path.abspath(namespace["__file__"]))
    other = other_package(own)
    if other is None:
        return
    sharing = Sharing(namespace, own, other)
    namespace[STATE] = sharing
    namespace["__path__"].append(sharing.other)
    namespace["__getattr__"] = sharing.module_getattr
    sys.meta_path.insert(0, OtherInitFirst(sharing))
