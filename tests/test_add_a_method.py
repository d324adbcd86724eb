"""The "Add a method" walkthrough (`docs/add-a-method.md`), done as a newcomer would: in a copy of the
repository, write the four files the page shows (the `proxpull` package and its client module), run
the generator, and nothing else. The method then runs with its own settings, its settings are
validated like any other, `pyproject.toml` and the methods table list it, and no other file changed.

`proxpull`: FedProx-like — a global model averaged as FedAvg does; clients add (μ/2)·||θ − w||².
"""

import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "add-a-method.md"
COPIED = ("server_app", "client_app", "strategies", "models", "datasets", "docs", "pyproject.toml")
NEW_FILES = {"strategies/methods/proxpull/settings.py", "strategies/methods/proxpull/server.py",
             "strategies/methods/proxpull/__init__.py", "client_app/methods/proxpull.py"}
GENERATED = {"pyproject.toml", "docs/methods.md"}


def walkthrough_files() -> dict[str, str]:
    """path → source of every code block of the page that names its file (`title="<path>"`)."""
    blocks = re.findall(r'```python title="([^"]+)"\n(.*?)```', PAGE.read_text(), flags=re.S)
    return dict(blocks)


def _run(copy: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _changed(copy: Path) -> set[str]:
    """Files of the copy that are new or differ from the repository's."""
    changed = set()
    for path in copy.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            relative = path.relative_to(copy)
            original = REPO / relative
            if not original.is_file() or not filecmp.cmp(path, original, shallow=False):
                changed.add(relative.as_posix())
    return changed


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """A copy of the repository with the walkthrough done: its files written, the generator run."""
    root = tmp_path_factory.mktemp("repo")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=ignore)
        else:
            shutil.copy2(source, root / name)
    for path, source in walkthrough_files().items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(source)
    done = _run(root, "-m", "strategies.shared.generate")
    assert set(done.stdout.split()) >= {"wrote:", *GENERATED}, done.stdout
    return root


def test_the_page_shows_exactly_the_method_package_and_its_client_module():
    assert set(walkthrough_files()) == NEW_FILES


def test_the_walkthrough_edits_no_other_file(copy):
    assert _changed(copy) == NEW_FILES | GENERATED
    _run(copy, "-m", "strategies.shared.generate", "--check")  # and leaves them current


def test_the_generated_config_and_table_list_the_new_method(copy):
    config = tomllib.loads((copy / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert config["proxpull"] == {"mu": 0.01}
    table = (copy / "docs" / "methods.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| `proxpull` |"))
    assert "`strategies/methods/proxpull/settings.py`" in row
    assert "`strategies/methods/proxpull/server.py`" in row and "`client_app/methods/proxpull.py`" in row


@pytest.mark.federation
def test_the_new_method_runs_with_its_own_settings(copy, tiny_run, tmp_path):
    run = {**tiny_run, "method": "proxpull", "proxpull.mu": 0.5, "num-rounds": 3}
    code = ("import json, sys\nfrom server_app.harness.simulate import simulate\n"
            f"print(json.dumps(simulate({run!r})))")
    summary = json.loads(_run(copy, "-c", code).stdout.strip().splitlines()[-1])
    assert summary["method"] == "proxpull"
    assert summary["final"]["global-accuracy"] > summary["round-0"]["global-accuracy"] + 20
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["proxpull.mu"] == 0.5


def test_its_settings_and_messages_are_validated_like_any_other(copy):
    code = r"""
import pytest
from strategies.methods.proxpull.settings import ProxPullTrain
from strategies.shared.messages import TrainInstructions
from strategies.shared.run_config import RunConfig
from strategies.shared.settings import ConfigError

assert RunConfig(method="proxpull").proxpull.mu == 0.01  # the settings model's default
with pytest.raises(ConfigError, match=r"proxpull\.mu.*-1.*greater than or equal to 0"):
    RunConfig.from_flower({"method": "proxpull", "proxpull.mu": -1.0})
with pytest.raises(ConfigError, match=r"unknown key 'proxpull\.nu'; did you mean 'proxpull\.mu'\?"):
    RunConfig.from_flower({"method": "proxpull", "proxpull.nu": 1.0})
common = dict(server_round=1, lr=0.1, momentum=0.0, local_epochs=1, batch_size=8, seed=0)
with pytest.raises(ValueError, match="mu"):  # a train message without its required field
    ProxPullTrain.read(TrainInstructions(**common).config())
assert ProxPullTrain.read(ProxPullTrain(**common, mu=0.2).config()).mu == 0.2
print("ok")
"""
    assert _run(copy, "-c", code).stdout.strip() == "ok"


def test_without_the_package_the_method_and_its_section_are_unknown():
    from strategies.shared.registry import METHODS
    from strategies.shared.run_config import RunConfig
    from strategies.shared.settings import ConfigError

    assert "proxpull" not in METHODS
    with pytest.raises(ConfigError, match="key 'method' = 'proxpull' is invalid: allowed values"):
        RunConfig.from_flower({"method": "proxpull"})
    with pytest.raises(ConfigError, match=r"unknown key 'proxpull\.mu': there is no settings section"):
        RunConfig.from_flower({"proxpull.mu": 0.1})


def test_the_methods_table_is_current_and_names_files_that_exist():
    """docs/methods.md is what the registry generates; every path it names exists."""
    from strategies.shared.generate import METHODS_PAGE, methods_page
    from strategies.shared.registry import method_names

    text = METHODS_PAGE.read_text()
    assert text == methods_page(), "docs/methods.md is stale: run python -m strategies.shared.generate"
    rows = {re.match(r"\| `([^`]+)` \|", line).group(1): line
            for line in text.splitlines() if re.match(r"\| `", line)}
    assert sorted(rows) == sorted(method_names())
    for method, line in rows.items():
        paths = re.findall(r"`((?:strategies|client_app)/[\w/]+\.py)`", line)
        assert len(paths) >= 2, method
        assert all((REPO / path).is_file() for path in paths), (method, paths)
