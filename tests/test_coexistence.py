"""Bouquet beside Hugging Face's `datasets` (the same import name): one module serves both packages
(datasets/hf_coexistence.py), whichever of the two folders Python's path search meets first.

The fast tests use a small stand-in for Hugging Face's package, written here with the traits that
matter (an `__init__` that its submodules rely on having run, subpackages, a consumer importing
`from datasets import Dataset`), in fresh interpreters. The e2e test installs the real packages
(`flwr-datasets`, which brings `datasets`) and Bouquet (wheel and editable) into a temporary virtual
environment that reuses this one's packages, and runs federations there.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

RUN = {"method": "fedavg", "dataset": "digits", "model": "mclr", "partition": "iid", "num-clients": 3,
       "num-rounds": 2, "max-samples-per-client": 90, "finetune-epochs": 0, "run-name": "run"}

FAKE_HF = {
    "datasets/__init__.py": """
        __version__ = "0.0.stand-in"
        from .arrow_dataset import Dataset
        from .features import Features
        def load_dataset(name):
            return Dataset.from_dict({"name": [name]})
    """,
    # like Hugging Face's utils/file_utils.py (`from .. import __version__`): needs __init__ to have run
    "datasets/arrow_dataset.py": """
        import sys
        from . import __version__
        from .features import Features
        sys.stand_in_loads = getattr(sys, "stand_in_loads", 0) + 1
        class Dataset:
            def __init__(self, columns):
                self.columns = columns
            @classmethod
            def from_dict(cls, columns):
                return cls(columns)
            @property
            def num_rows(self):
                return len(next(iter(self.columns.values())))
    """,
    "datasets/features/__init__.py": "from .features import Features\n",
    "datasets/features/features.py": "class Features(dict):\n    pass\n",
    # a consumer, as Flower Datasets is
    "consumer/__init__.py": "from datasets import Dataset, load_dataset\nimport datasets\n",
}


def stand_in(root: Path, extra: dict[str, str] | None = None) -> Path:
    """A site folder with the stand-in `datasets` and its consumer (plus `extra` files)."""
    for name, text in {**FAKE_HF, **(extra or {})}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def python(code: str, cwd: Path, executable: str = sys.executable, timeout: float = 300) -> dict:
    """Run `code` in a fresh interpreter (cwd: a folder without Bouquet); it prints one JSON line."""
    done = subprocess.run([executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def hook(repo: Path) -> str:
    """What the wheel's `bouquet_fl_datasets.pth` does at start-up (its `_bouquet_fl_datasets` is a copy
    of datasets/hf_coexistence.py)."""
    return (f"import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('_bouquet_fl_datasets', "
            f"{str(repo / 'datasets' / 'hf_coexistence.py')!r})\n"
            f"hook = importlib.util.module_from_spec(spec); sys.modules['_bouquet_fl_datasets'] = hook\n"
            f"spec.loader.exec_module(hook); hook.install()\n")


# a SuperNode that has only the FAB (Bouquet not installed there): no start-up hook
NO_HOOK = "sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, 'bouquet_datasets', False)]\n"

CHECKS = """
import datasets, datasets.partition, datasets.sources
bouquet = {"init": datasets.__file__, "partition": datasets.partition.__file__}
other_loaded_by_bouquet = "datasets.arrow_dataset" in sys.modules
import consumer
from datasets import Dataset, Features
import datasets.features.features as features_module
print(json.dumps({**bouquet, "other_loaded_by_bouquet": other_loaded_by_bouquet,
                  "version": datasets.__version__, "rows": consumer.load_dataset("x").num_rows,
                  "same_features": Features is features_module.Features is datasets.features.Features,
                  "dataset_from": sys.modules[Dataset.__module__].__file__,
                  "loads": sys.stand_in_loads, "path": list(datasets.__path__)}))
"""


def expect_shared(result: dict, site: Path, repo: Path = REPO) -> None:
    assert result["init"] == str(repo / "datasets" / "__init__.py")
    assert result["partition"] == str(repo / "datasets" / "partition.py")
    assert result["version"] == "0.0.stand-in" and result["rows"] == 1 and result["same_features"]
    assert result["dataset_from"] == str(site / "datasets" / "arrow_dataset.py")
    assert result["loads"] == 1  # the other package's modules ran once each
    assert result["path"] == [str(repo / "datasets"), str(site / "datasets")]


def test_bouquet_first_on_the_path_serves_both_and_loads_the_other_only_when_asked(tmp_path):
    """A FAB unpacked by `flwr run` or a SuperNode, or a command run in the checkout: Bouquet's folder
    is first on sys.path. Bouquet's imports do not run the other package; its users get it whole."""
    site = stand_in(tmp_path / "site")
    result = python(f"import json, sys\nsys.path[:0] = [{str(REPO)!r}, {str(site)!r}]\n" + NO_HOOK + CHECKS,
                    cwd=tmp_path)
    expect_shared(result, site)
    assert result["other_loaded_by_bouquet"] is False


def test_other_first_on_the_path_with_the_installed_hook(tmp_path):
    """Installed Bouquet (its `.pth` hook) and the other package earlier on sys.path, as site-packages
    is before an editable checkout: `import datasets` still gives the shared module, even when a
    consumer of the other package imports it before Bouquet does."""
    site = stand_in(tmp_path / "site")
    code = (f"import json, sys\nsys.path.insert(0, {str(site)!r}); sys.path.append({str(REPO)!r})\n"
            + hook(REPO) + "import consumer\n" + CHECKS)
    expect_shared(python(code, cwd=tmp_path), site)


def test_the_hook_gives_an_earlier_bouquets_folder_first_on_the_path_to_its_own_app(tmp_path):
    """An older FAB (its `datasets/` from before the sharing) unpacked first on sys.path where this
    Bouquet is installed: `datasets` is that FAB's, beside the `server_app` it is imported with."""
    site = stand_in(tmp_path / "site")
    old = tmp_path / "old-fab" / "datasets"
    old.mkdir(parents=True)
    for name in ("__init__.py", "partition.py", "sources.py"):
        (old / name).write_text("")
    code = (f"import json, sys\nsys.path[:0] = [{str(old.parent)!r}, {str(site)!r}]\n"
            f"sys.path.append({str(REPO)!r})\n" + hook(REPO)
            + "import datasets\nprint(json.dumps(datasets.__file__))\n")
    result = python(code, cwd=tmp_path)
    assert result == str(old / "__init__.py")


def test_a_submodule_of_the_other_package_imported_first_runs_its_init_first(tmp_path):
    """`import datasets.arrow_dataset` before any name: the other package's `__init__` runs first (as it
    would alone), and the module is imported once, not twice."""
    site = stand_in(tmp_path / "site")
    result = python(f"""
        import json, sys
        sys.path[:0] = [{str(REPO)!r}, {str(site)!r}]
        import datasets.arrow_dataset as arrow
        import datasets
        print(json.dumps({{"loads": sys.stand_in_loads, "version": datasets.__version__,
                          "same": arrow.Dataset is datasets.Dataset, "spec": arrow.__spec__.origin,
                          "loader": type(arrow.__spec__.loader).__name__}}))
    """, cwd=tmp_path)
    assert result == {"loads": 1, "version": "0.0.stand-in", "same": True,
                      "spec": str(site / "datasets" / "arrow_dataset.py"),
                      "loader": "SourceFileLoader"}


def test_a_module_name_in_both_packages_is_an_error_naming_both_and_the_fix(tmp_path):
    site = stand_in(tmp_path / "site", {"datasets/sources.py": "ROWS = 1\n"})
    result = python(f"""
        import json, sys
        sys.path[:0] = [{str(REPO)!r}, {str(site)!r}]
        errors = []
        for statement in ("import datasets.sources", "from datasets import Dataset"):
            try:
                exec(statement)
                errors.append(None)
            except ImportError as error:
                errors.append(str(error))
        print(json.dumps(errors))
    """, cwd=tmp_path)
    for message in result:
        assert message is not None
        assert "`datasets.sources`" in message
        assert str(REPO / "datasets") in message and str(site / "datasets") in message
        assert "pip uninstall datasets" in message and "rename Bouquet's module" in message


def test_a_name_the_other_init_defines_over_a_bouquet_module_is_an_error(tmp_path):
    init = FAKE_HF["datasets/__init__.py"].rstrip() + "\n        partition = 'not a module'\n"
    site = stand_in(tmp_path / "site", {"datasets/__init__.py": init})
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.path[:0] = [{str(REPO)!r}, "
                           f"{str(site)!r}]\nfrom datasets import Dataset"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "ImportError: `datasets.partition`: Bouquet's data package" in done.stderr


def test_without_another_package_nothing_changes(tmp_path):
    """No other `datasets` (a data folder named `datasets` beside it is a namespace portion, not one)."""
    (tmp_path / "data" / "datasets").mkdir(parents=True)
    (tmp_path / "data" / "datasets" / "mnist.csv").write_text("x\n")
    result = python(f"""
        import json, sys
        sys.path[:0] = [{str(tmp_path / 'data')!r}, {str(REPO)!r}]
        import datasets, datasets.partition
        print(json.dumps({{"path": list(datasets.__path__), "getattr": hasattr(datasets, "__getattr__"),
                          "finders": [type(f).__name__ for f in sys.meta_path]}}))
    """, cwd=tmp_path)
    assert result["path"] == [str(REPO / "datasets")] and result["getattr"] is False
    assert "OtherInitFirst" not in result["finders"]


FEDERATION = """
import json, sys, os
from server_app.harness.simulate import simulate
summary = simulate({run!r})
import datasets
print(json.dumps({{"final": summary["final"], "init": datasets.__file__,
                  "rows": datasets.Dataset.from_dict({{"a": [1, 2, 3]}}).num_rows}}))
"""


@pytest.mark.federation
def test_a_federation_runs_beside_the_other_package_with_the_same_numbers(tmp_path):
    """The other package's consumer imported first, Bouquet installed after it on the path: an
    in-process federation gives the numbers it gives without the other package, which still works."""
    from server_app.harness.simulate import simulate

    site = stand_in(tmp_path / "site")
    run = {**RUN, "output-dir": str(tmp_path / "alone")}
    alone = simulate(run)
    code = (f"import sys\nsys.path.insert(0, {str(site)!r}); sys.path.append({str(REPO)!r})\n"
            + hook(REPO) + "import consumer\n"
            + FEDERATION.format(run={**run, "output-dir": str(tmp_path / "beside")}))
    beside = python(code, cwd=tmp_path)
    assert beside["final"] == alone["final"]
    assert beside["init"] == str(REPO / "datasets" / "__init__.py") and beside["rows"] == 3


# ---- the real packages, installed ----------------------------------------------------------------

HF = ["flwr-datasets==0.6.1", "datasets==4.8.5"]  # the versions this was tested with


def pip(venv: Path, *args: str, timeout: float = 600) -> None:
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check",
                           "-q", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.mark.e2e
def test_installed_beside_hugging_face_datasets(tmp_path):
    """A virtual environment that reuses this one's packages (torch, Flower, ...): Hugging Face's
    `datasets` and Flower Datasets installed by pip, then Bouquet as a wheel (each package's files stay
    its own: uninstalling either leaves the other working) and as the README installs it (editable),
    where an in-process federation, and one from the unpacked FAB, run beside Flower Datasets."""
    from flwr.cli.build import build_fab_from_disk

    from server_app.harness.simulate import simulate

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    venv_site = Path(subprocess.check_output(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    # this environment's site folders, after the venv's own packages (not the checkout: Bouquet is
    # installed into the venv below)
    reused = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (venv_site / "zz_reuse.pth").write_text("".join(f"{p}\n" for p in reused))
    pip(venv, "install", *HF)
    neutral = tmp_path / "neutral"
    neutral.mkdir()
    python_ = str(venv / "bin" / "python")

    # the wheel: Bouquet's folder as bouquet-fl/datasets, the start-up hook, no site-packages/datasets file
    pip(venv, "install", "--no-deps", str(REPO))
    record = (venv_site / "bouquet_fl-0.1.0.dist-info" / "RECORD").read_text()
    assert not [line for line in record.splitlines() if line.startswith("datasets/")]
    wheel = python("""
        import json, sys, datasets.partition, datasets
        before = "pyarrow" in sys.modules
        from datasets import Dataset
        import flwr_datasets
        print(json.dumps({"partition": datasets.partition.__file__, "before": before,
                          "version": datasets.__version__, "rows": Dataset.from_dict({"a": [1]}).num_rows}))
    """, cwd=neutral, executable=python_)
    assert wheel["partition"] == str(venv_site / "bouquet-fl" / "datasets" / "partition.py")
    assert wheel["before"] is False and wheel["version"] == "4.8.5" and wheel["rows"] == 1
    pip(venv, "uninstall", "-y", "bouquet-fl")
    alone = python("import json, datasets; print(json.dumps([datasets.__file__, datasets.__version__]))",
                   cwd=neutral, executable=python_)
    assert alone == [str(venv_site / "datasets" / "__init__.py"), "4.8.5"]

    # editable, as the README installs it: a federation from a folder outside the checkout
    pip(venv, "install", "--no-deps", "-e", str(REPO))
    run = {**RUN, "output-dir": str(tmp_path / "alone")}
    reference = simulate(run)
    code = ("import flwr_datasets\nfrom flwr_datasets.partitioner import IidPartitioner\n"
            + FEDERATION.format(run={**run, "output-dir": str(tmp_path / "editable")}))
    editable = python(code, cwd=neutral, executable=python_)
    assert editable["final"] == reference["final"] and editable["rows"] == 3
    assert editable["init"] == str(REPO / "datasets" / "__init__.py")

    # the FAB, unpacked with its folder first on sys.path (as `flwr run` and SuperNodes load it)
    fab = tmp_path / "fab"
    zipfile.ZipFile(io.BytesIO(build_fab_from_disk(REPO))).extractall(fab)
    code = (f"import sys\nsys.path.insert(0, {str(fab)!r})\n"
            + FEDERATION.format(run={**run, "output-dir": str(tmp_path / "fab-run")}))
    from_fab = python(code, cwd=neutral, executable=python_)
    assert from_fab["final"] == reference["final"] and from_fab["rows"] == 3
    assert from_fab["init"] == str(fab / "datasets" / "__init__.py")

    # and Hugging Face's uninstalled: Bouquet is unchanged
    pip(venv, "uninstall", "-y", "datasets", "flwr-datasets")
    left = python("import json, datasets, datasets.partition; print(json.dumps([datasets.__file__, "
                  "hasattr(datasets, '__getattr__')]))", cwd=neutral, executable=python_)
    assert left == [str(REPO / "datasets" / "__init__.py"), False]
