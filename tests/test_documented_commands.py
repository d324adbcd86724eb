"""Every command README.md and the docs show runs.

Each `flwr run` (and `server_app.harness.outcome`) line's `--run-config`, and each bare
`"key=value ..."` example beside them, is parsed as Flower parses it, fused with pyproject.toml's
defaults as Flower fuses them (an unknown key is Flower's "Invalid run configuration") and validated
by `RunConfig.from_flower`, as the ServerApp does; the ones whose data is on this machine then run in
process at a reduced size (fewer samples per client, one or two rounds). Each `python -m` line names a
module that exists and only flags its parser knows; a whole command line in a code block is parsed
whole by the module's own parser, and the cheap ones run for real.
"""

from __future__ import annotations

import argparse
import logging
import re
import runpy
import shlex
import sys
import warnings
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import pytest
from flwr.common.config import fuse_dicts, parse_config_args

from datasets.sources import SOURCE_NAMES
from strategies.methods.fedcg import settings as fedcg_settings
from strategies.shared.run_config import RunConfig, default_run_config
from tests.conftest import REPO

PAGES = (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")))
FENCE = re.compile(r"^\s*(```|~~~)")
SPAN = re.compile(r"`([^`\n]+)`")
COMMAND = re.compile(r"\b(flwr run|python -m)\b")
BARE_RUN_CONFIG = re.compile(r"""^"\S+?=('[^']*'|\S+)( \S+?=('[^']*'|\S+))*"$""")
SEPARATORS = {"&&", "||", ";", "|"}
# stand-ins for a page's placeholders where a parser needs a typed value
PLACEHOLDERS = {"<n>": "3", "<id>": "1"}
# run size in process: every documented setting kept but the samples per client and the rounds
REDUCED = {"max-samples-per-client": 40, "num-rounds": 1, "traffic-days": 2}


@dataclass(frozen=True)
class Command:
    """One documented command: where it is, its words, and whether it is a whole command line (a
    line of a code block without "...") or a mention in prose."""

    where: str
    words: tuple[str, ...]
    whole: bool

    def __str__(self) -> str:
        return f"{self.where}: " + " ".join(f'"{w}"' if " " in w else w for w in self.words)


def _words(text: str, where: str) -> list[tuple[str, ...]]:
    """The commands in one code line or code span, split at `&&`, `;`, `|`, each from its
    `flwr run` / `python -m` on (a prefix such as `flock FILE` dropped)."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as err:
        raise AssertionError(f"{where}: cannot split the command {text!r} as a shell does: {err}")
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token in SEPARATORS:
            segments.append([])
        else:
            segments[-1].append(token)
    found = []
    for segment in segments:
        for i in range(len(segment) - 1):
            if segment[i:i + 2] in (["flwr", "run"], ["python", "-m"]):
                found.append(tuple(segment[i:]))
                break
    return found


def _page_commands(page: Path) -> list[Command]:
    where_page = page.relative_to(REPO).as_posix()
    lines = page.read_text().splitlines()
    commands: list[Command] = []
    in_block, i = False, 0
    while i < len(lines):
        line, number = lines[i], i + 1
        if FENCE.match(line):
            in_block = not in_block
        elif in_block:
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            if COMMAND.search(line):
                where = f"{where_page}:{number}"
                commands += [Command(where, words, "..." not in words)
                             for words in _words(line, where)]
        else:
            for span in SPAN.finditer(line):
                text, where = span.group(1), f"{where_page}:{number}"
                if COMMAND.search(text):
                    commands += [Command(where, words, False) for words in _words(text, where)]
                elif BARE_RUN_CONFIG.match(text):  # "or e.g. `"method='fedavg' ..."`"
                    commands.append(Command(where, ("flwr", "run", ".", "--run-config",
                                                    text[1:-1]), False))
        i += 1
    return commands


def documented_commands() -> list[Command]:
    return [command for page in PAGES for command in _page_commands(page)]


COMMANDS = documented_commands()


def _run_config_of(command: Command) -> str | None:
    words = command.words
    for i, word in enumerate(words):
        if word == "--run-config" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--run-config="):
            return word.split("=", 1)[1]
    return None


def run_config_overrides(text: str) -> dict:
    """`--run-config` text -> the flat overrides Flower sends (its own parser)."""
    return parse_config_args([text])


def fused_run_config(text: str) -> dict:
    """pyproject's defaults with the overrides, fused as `flwr run` fuses them: a key that is not
    among the defaults is refused (Flower's code 15, "Invalid run configuration")."""
    try:
        return fuse_dicts(default_run_config(), run_config_overrides(text))
    except ValueError as err:
        raise AssertionError(f"Flower refuses this run config: {err}") from None


RUN_CONFIGS = sorted({(rc, str(c)) for c in COMMANDS if (rc := _run_config_of(c)) is not None})
# the default job: `flwr run .` with no run config
DEFAULT_JOB = next(str(c) for c in COMMANDS if c.words[:3] == ("flwr", "run", ".")
                   and _run_config_of(c) is None and "--federation-config" not in c.words)
DISTINCT_RUN_CONFIGS = {**{"": DEFAULT_JOB}, **{rc: where for rc, where in reversed(RUN_CONFIGS)}}


# --- what the pages hold ---------------------------------------------------------------------------
def test_the_extraction_finds_the_pages_commands():
    """The extraction sees the commands of code blocks, of prose and continued lines, so a command
    the tests below skip is one they cannot see, not one they dropped."""
    text = [str(c) for c in COMMANDS]
    assert any("docs/methods/fedcg.md" in t and "method='fedcg'" in t for t in text)
    assert any(t.startswith("README.md") and "flwr run . --stream" in t for t in text)
    continued = [c for c in COMMANDS if c.where.startswith("docs/benchmarks.md")
                 and "benchmarks.compare" in c.words and c.whole]
    assert continued and all("--set" in c.words for c in continued)  # a line ending in "\" joined
    assert len(RUN_CONFIGS) >= 15
    assert any(c.words[:2] == ("python", "-m") and c.whole for c in COMMANDS)


# --- run configs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("run_config", sorted(DISTINCT_RUN_CONFIGS),
                         ids=lambda rc: rc or "default-job")
def test_every_documented_run_config_is_valid(run_config):
    where = DISTINCT_RUN_CONFIGS[run_config]
    try:
        RunConfig.from_flower(fused_run_config(run_config))
    except Exception as err:  # noqa: BLE001 - the message names the page and line
        pytest.fail(f"{where}\n{err}")


def test_every_data_set_a_run_config_names_is_known():
    """A data set a page names exists (its data may still be missing here: then it is validated
    above and not run below)."""
    for run_config, where in DISTINCT_RUN_CONFIGS.items():
        dataset = fused_run_config(run_config)["dataset"]
        assert dataset in SOURCE_NAMES, f"{where}: unknown dataset {dataset!r}"


def test_the_fedcg_examples_run_long_enough_to_use_the_teacher_and_the_graph():
    """FedCG's examples run past its adjacency warm-up and teacher period: otherwise the run ends
    before the student replaces the random teacher or the distance graph replaces A = I."""
    fedcg = {rc: where for rc, where in DISTINCT_RUN_CONFIGS.items()
             if fused_run_config(rc)["method"] == "fedcg"}
    assert len(fedcg) >= 3
    for run_config, where in fedcg.items():
        cfg = RunConfig.from_flower(fused_run_config(run_config))
        section = cfg.section("fedcg")
        assert section.adj_warmup < cfg.num_rounds and section.teacher_period < cfg.num_rounds, where


# --- the FedCG warning -----------------------------------------------------------------------------
def _fedcg(**overrides) -> dict:
    return {**default_run_config(), "method": "fedcg", "model": "cnn", "partition": "domains",
            **overrides}


def test_a_fedcg_warm_up_or_period_of_at_least_num_rounds_is_one_line_naming_the_keys(
        caplog, monkeypatch):
    monkeypatch.setattr(fedcg_settings, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="flwr.bouquet"):
        RunConfig.from_flower(_fedcg(**{"num-rounds": 5}))
        RunConfig.from_flower(_fedcg(**{"num-rounds": 5}))  # a client validates the same config
    lines = [r.getMessage() for r in caplog.records if r.name == "flwr.bouquet"]
    assert len(lines) == 1, lines
    assert "fedcg.adj-warmup = 10" in lines[0] and "fedcg.teacher-period = 10" in lines[0]
    assert "num-rounds = 5" in lines[0] and "\n" not in lines[0]


@pytest.mark.parametrize("overrides, named, not_named", [
    ({"num-rounds": 10, "fedcg.teacher-period": 5}, "fedcg.adj-warmup = 10", "teacher-period"),
    ({"num-rounds": 10, "fedcg.adj-warmup": 3}, "fedcg.teacher-period = 10", "adj-warmup"),
    # the warm-up delays only the distance graph, the period only the teacher/student clustering
    ({"num-rounds": 5, "fedcg.adjacency": "identity", "fedcg.clustering": "kmeans"}, None, None),
    ({"num-rounds": 11}, None, None),
])
def test_the_fedcg_warning_names_only_the_keys_that_end_the_run_early(
        caplog, monkeypatch, overrides, named, not_named):
    monkeypatch.setattr(fedcg_settings, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="flwr.bouquet"):
        RunConfig.from_flower(_fedcg(**overrides))
    lines = [r.getMessage() for r in caplog.records if r.name == "flwr.bouquet"]
    if named is None:
        assert lines == []
    else:
        assert len(lines) == 1 and named in lines[0] and not_named not in lines[0], lines


# --- python -m -------------------------------------------------------------------------------------
class _Parser(Exception):
    def __init__(self, parser: argparse.ArgumentParser, strict: bool) -> None:
        self.parser, self.strict = parser, strict


def module_parser(module: str, monkeypatch) -> tuple[argparse.ArgumentParser, bool]:
    """The argument parser `python -m module` builds, caught when it first parses (nothing after
    that runs), and whether it refuses unknown arguments (`parse_args`) or hands them on to the
    module (`parse_known_args`, e.g. `client_app.export`'s run-config keys)."""

    def strict(self, args=None, namespace=None):
        raise _Parser(self, True)

    def lenient(self, args=None, namespace=None):
        raise _Parser(self, False)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", strict)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", lenient)
    monkeypatch.setattr(sys, "argv", [module])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "found in sys.modules"
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    except _Parser as caught:
        return caught.parser, caught.strict
    finally:
        monkeypatch.undo()
    raise AssertionError(f"`python -m {module}` ran without parsing any argument")


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((action for action in parser._actions
                 if isinstance(action, argparse._SubParsersAction)), None)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _project_module(module: str) -> bool:
    return (REPO / module.split(".")[0]).is_dir()


PYTHON_M = [c for c in COMMANDS if c.words[:2] == ("python", "-m") and len(c.words) > 2]
MODULES = sorted({c.words[2] for c in PYTHON_M})


@pytest.mark.parametrize("module", MODULES)
def test_every_documented_module_exists(module):
    where = [c.where for c in PYTHON_M if c.words[2] == module]
    assert find_spec(module) is not None, f"no module {module} ({', '.join(where)})"


@pytest.mark.parametrize("command", [c for c in PYTHON_M if _project_module(c.words[2])], ids=str)
def test_every_documented_python_m_line_parses(command, monkeypatch, capsys):
    """Every flag (and subcommand) a page writes is one the module's parser knows; a whole line
    parses as given (its required arguments there, its values of the right type)."""
    parser, strict = module_parser(command.words[2], monkeypatch)
    args = [PLACEHOLDERS.get(word, word) for word in command.words[3:]]
    known = _options(parser)
    subcommands = _subcommands(parser)
    given = next((word for word in args if not word.startswith("-")), None)
    if subcommands and (given is not None or subcommands.required):
        assert given in subcommands.choices, (f"{command}\n`{given}` is not a subcommand; the "
                                              f"module's are {', '.join(subcommands.choices)}")
        known |= _options(subcommands.choices[given])
    unknown = [word.split("=", 1)[0] for word in args
               if word.startswith("--") and word.split("=", 1)[0] not in known]
    assert not unknown or not strict, (f"{command}\nunknown flag(s) {unknown}; the parser knows "
                                       f"{sorted(known)}")
    if command.whole:
        try:
            parsed = parser.parse_args(args) if strict else parser.parse_known_args(args)[0]
        except SystemExit as exit_:
            pytest.fail(f"{command}\nthe module's parser refuses it (exit {exit_.code}): "
                        f"{capsys.readouterr().err.strip()}")
        if command.words[2] == "benchmarks.compare":  # its run configs, as compare checks them
            from benchmarks.common import parse_set
            from benchmarks.compare import _check

            try:
                if getattr(parsed, "config", None):  # a paper table: every cell it runs
                    from benchmarks.compare import grid_runs, load_grid

                    cells = [c.strip() for c in parsed.cells.split(",") if c.strip()]
                    for _, methods, settings in grid_runs(load_grid(parsed.config), "doc",
                                                          parse_set(parsed.set), cells):
                        _check(methods, settings)
                else:
                    _check([m.strip() for m in parsed.methods.split(",") if m.strip()],
                           parse_set(parsed.set))
            except Exception as err:  # noqa: BLE001 - the message names the page and line
                pytest.fail(f"{command}\n{err}")


def _whole(module: str, page: str = "README.md") -> Command:
    return next(c for c in PYTHON_M if c.words[2] == module and c.whole and c.where.startswith(page))


def _run_module(command: Command, extra: list[str], monkeypatch) -> None:
    """`python -m` the command (with `extra` arguments) in this process; it must not fail."""
    monkeypatch.setattr(sys, "argv", [command.words[2], *command.words[3:], *extra])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "found in sys.modules"
            runpy.run_module(command.words[2], run_name="__main__", alter_sys=False)
    except SystemExit as exit_:
        assert exit_.code in (0, None), f"{command}: exit {exit_.code}"


def test_the_readmes_deploy_command_prints_every_machines_commands(monkeypatch, capsys):
    command = _whole("server_app.harness.deploy")
    _run_module(command, [], monkeypatch)
    out = capsys.readouterr().out
    supernodes = int(command.words[command.words.index("--supernodes") + 1])
    assert out.count("flower-supernode") == supernodes and "flower-superlink" in out, out
    host = command.words[command.words.index("--superlink-host") + 1]
    assert f"{host}:" in out


@pytest.mark.federation
def test_the_quick_starts_comparison_runs_at_a_reduced_size(monkeypatch, tmp_path, capsys):
    command = _whole("benchmarks.compare")
    size = [f"--set={key}={value}" for key, value in REDUCED.items() if key != "traffic-days"]
    _run_module(command, [*size, "--results-dir", str(tmp_path), "--runs-dir", str(tmp_path / "runs")],
                monkeypatch)
    name = command.words[command.words.index("--name") + 1]
    assert (tmp_path / f"{name}.md").is_file() and (tmp_path / "runs" / "report.html").is_file()


# --- running them ----------------------------------------------------------------------------------
def reduced(run_config: str, output_dir: Path) -> dict:
    """The documented overrides at a reduced size (fewer samples, fewer rounds), writing into
    output_dir; the method, data set, partition, model, clients and method settings as written."""
    overrides = run_config_overrides(run_config)
    fused = fused_run_config(run_config)
    size = {key: min(value, fused[key]) if fused[key] else value for key, value in REDUCED.items()}
    return {**overrides, **size, "output-dir": str(output_dir),
            "run-name": overrides.get("run-name") or "run"}


BUILT_IN = ("mnist", "digits", "synthetic", "traffic-synthetic")  # data every machine has


def data_here(run_config: str) -> bool:
    """Whether the data a run config names is on this machine (a `data-root` or `data-dir` that
    exists, or a data set that needs none)."""
    from datasets.sources import IMAGE_SOURCES, DataNotFoundError, load_source

    try:
        fused = fused_run_config(run_config)
    except AssertionError:
        return True  # an unknown key: it fails the validation above, and the run names it
    dataset, root = fused["dataset"], fused["data-root"] or None
    if root and not Path(root).expanduser().is_dir():
        return False
    if fused.get("data-dir") and not Path(fused["data-dir"]).expanduser().is_dir():
        return False  # one's own federated data (docs/own-data.md): validated only
    if dataset in IMAGE_SOURCES:
        try:
            load_source(dataset, root)
        except DataNotFoundError:
            return False
    return True


RUNNABLE = {rc: where for rc, where in DISTINCT_RUN_CONFIGS.items() if data_here(rc)}


def test_only_run_configs_with_data_the_user_brings_are_not_run():
    """Those are validated above; everything else runs below."""
    for run_config in DISTINCT_RUN_CONFIGS.keys() - RUNNABLE.keys():
        fused = fused_run_config(run_config)
        assert fused["dataset"] not in BUILT_IN or fused.get("data-dir"), run_config
    assert len(RUNNABLE) >= len(DISTINCT_RUN_CONFIGS) - 5


@pytest.mark.federation
@pytest.mark.parametrize("run_config", sorted(RUNNABLE), ids=lambda rc: rc or "default-job")
def test_every_documented_run_config_runs_at_a_reduced_size(run_config, tmp_path):
    from server_app.harness.simulate import simulate

    where = RUNNABLE[run_config]
    overrides = reduced(run_config, tmp_path)
    if overrides.get("resume"):  # "same settings as the first run": run it first, then continue
        simulate({**overrides, "resume": False})
        overrides["num-rounds"] += 1
    summary = simulate(overrides)
    assert summary["rounds"] == overrides["num-rounds"], where
    assert (tmp_path / overrides["run-name"] / "summary.json").is_file(), where
