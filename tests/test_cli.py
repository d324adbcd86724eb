"""`bouquet check` / `bouquet run` (server_app/cli.py), and the ServerApp's one-line user errors.

The unit tests run `bouquet run` against a stand-in `flwr` executable that records its arguments, so
they show what would be submitted (and that nothing is when the config is bad); the e2e tests run it
against a simulation SuperLink started here (tests/simulation_superlink.py).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from strategies.shared.known_warnings import KNOWN_FLOWER_MESSAGES, is_known_noise
from flwr.app import Context, RecordDict

from server_app import cli
from server_app.app import main as server_main
from server_app.app import quiet_user_errors
from strategies.shared.run_config import default_run_config
from strategies.shared.settings import ConfigError
from tests.conftest import REPO


# --- bouquet check ----------------------------------------------------------------------------------
@pytest.mark.parametrize("override, nearest", [
    ("num-round=3", "; did you mean 'num-rounds'?"),
    ("sfl.hop=2", "; did you mean 'sfl.hops'?"),
    ("flt.treshold=0.5", "; did you mean 'flt.threshold'?"),
    ("fedsk.k=3", ": there is no settings section 'fedsk'; did you mean 'fedska.k'?"),
])
def test_an_unknown_key_is_named_with_the_nearest_valid_keys(override, nearest, capsys):
    assert cli.main(["check", str(REPO), "--run-config", override]) == cli.INVALID
    key = override.partition("=")[0]
    assert capsys.readouterr().err == f"bouquet: run config: unknown key '{key}'{nearest}\n"


def test_an_unknown_key_far_from_any_lists_the_keys_of_its_section():
    with pytest.raises(cli.CheckFailed, match=r"unknown key 'sfl\.zzzz'; the keys of section 'sfl' "
                                              r"are graph, graph-file, hops"):
        cli.check({"sfl.zzzz": 1})


@pytest.mark.parametrize("override, message", [
    ("lr=-1", "run config: key 'lr' = -1 is invalid: Input should be greater than 0"),
    ("model='vgg'", "run config: key 'model' = 'vgg' is invalid: allowed values are 'mclr', 'mlp'"),
    ("keep-checkpoints=0", "run config: key 'keep-checkpoints' = 0 is invalid: Input should be "
                           "greater than or equal to 1"),
])
def test_a_wrong_value_is_one_line_naming_the_key_and_what_is_allowed(override, message, capsys):
    assert cli.main(["check", str(REPO), "--no-data", "-c", override]) == cli.INVALID
    err = capsys.readouterr().err
    assert err.startswith(f"bouquet: {message}") and err.count("\n") == 1


def test_a_valid_config_passes_and_says_what_will_run(capsys):
    assert cli.main(["check", str(REPO), "-c", "method='flt' num-rounds=3 dataset='digits'"]) == 0
    assert capsys.readouterr().out.strip() == ("bouquet: run config is valid: method=flt "
                                               "dataset=digits partition=label-clusters clients=10 "
                                               "rounds=3")


def test_missing_data_names_the_data_set_its_layout_and_data_root(tmp_path):
    with pytest.raises(cli.CheckFailed) as err:
        cli.check({"dataset": "cifar10", "model": "cnn"}, data=True)
    message = str(err.value)
    assert "\n" not in message
    assert "dataset 'cifar10'" in message and "cifar-10-batches-py" in message
    assert "data-root" in message and "data_root" not in message
    with pytest.raises(cli.CheckFailed, match=str(tmp_path / "cifar-10-batches-py")):
        cli.check({"dataset": "cifar10", "model": "cnn", "data-root": str(tmp_path)}, data=True)
    cli.check({"dataset": "cifar10", "model": "cnn"}, data=False)  # --no-data: the nodes hold it


def test_overrides_are_read_as_flwr_run_reads_them(tmp_path):
    assert cli.parse_overrides(["num-rounds=3 run-name='a b'", "sfl.hops=2"]) == {
        "num-rounds": 3, "run-name": "a b", "sfl.hops": 2}
    toml = tmp_path / "over.toml"
    toml.write_text('num-rounds = 4\n[sfl]\nhops = 1\n')
    assert cli.parse_overrides([str(toml)]) == {"num-rounds": 4, "sfl.hops": 1}
    with pytest.raises(cli.CheckFailed, match="run config: .*invalid format"):
        cli.parse_overrides(["num-rounds=[1,"])


def test_the_defaults_are_those_of_the_app_folder(tmp_path):
    assert cli.app_defaults(REPO) == default_run_config()
    (tmp_path / "pyproject.toml").write_text('[tool.flwr.app.config]\nnum-rounds = 7\n[tool.flwr.app'
                                              '.config.sfl]\nhops = 3\n')
    assert cli.app_defaults(tmp_path) == {"num-rounds": 7, "sfl.hops": 3}
    assert cli.app_defaults(tmp_path / "missing") == default_run_config()


def test_bouquet_is_a_console_script():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["bouquet"] == "server_app.cli:main"


# --- bouquet run ------------------------------------------------------------------------------------
@pytest.fixture
def fake_flwr(tmp_path, monkeypatch):
    """A stand-in `flwr`: `run` records its arguments and prints the line `flwr run` prints; `list`
    reports the run completed."""
    calls = tmp_path / "calls.jsonl"
    script = tmp_path / "flwr"
    script.write_text(f"#!{sys.executable}\nimport json, sys\nNOISE = {KNOWN_FLOWER_MESSAGES[0]!r}\n"
                      "if sys.argv[1] == 'list':\n"
                      "    print(json.dumps({'runs': [{'status': 'finished:completed'}]}))\n"
                      "    sys.exit()\n"
                      f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                      "print('\\x1b[93mWARNING \\x1b[0m:   ' + NOISE)\n"
                      "print('Successfully started run 42')\n")
    script.chmod(0o755)
    monkeypatch.setattr(cli, "flwr_executable", lambda: str(script))
    monkeypatch.setattr(cli, "superlink_is_local", lambda connection: True)

    def recorded() -> list[list[str]]:
        return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return recorded


def test_bouquet_run_relays_the_stream_without_flowers_known_warnings(fake_flwr, capsys):
    assert cli.main(["run", str(REPO), "--run-config", "num-rounds=1"]) == 0
    out = capsys.readouterr().out
    assert "Successfully started run 42" in out and KNOWN_FLOWER_MESSAGES[0] not in out
    assert is_known_noise(f"\x1b[93mWARNING \x1b[0m:   {KNOWN_FLOWER_MESSAGES[0]}")  # what was dropped


def test_a_bad_config_submits_nothing(fake_flwr, capsys):
    assert cli.main(["run", str(REPO), "--stream", "--run-config", "num-round=3"]) == cli.INVALID
    assert fake_flwr() == []  # flwr run was never started: no SuperLink, no client contacted
    err = capsys.readouterr().err
    assert "unknown key 'num-round'; did you mean 'num-rounds'?" in err
    assert "nothing was submitted" in err


def test_a_relative_output_dir_becomes_the_callers_folder(fake_flwr, tmp_path, monkeypatch, capsys):
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    args = [str(REPO), "local", "--stream", "--federation-config", "num-supernodes=2",
            "-c", "num-rounds=1 dataset='digits'"]
    assert cli.main(["run", *args]) == 0
    assert fake_flwr()[-1] == ["run", *args[:2], "--stream", "--federation-config",
                               "num-supernodes=2", "--run-config", "num-rounds=1 dataset='digits'",
                               "--run-config", f"output-dir='{caller / 'outputs'}'"]
    assert f"results go to {caller / 'outputs'}/<run-name>" in capsys.readouterr().out
    assert cli.main(["run", str(REPO), "-c", "output-dir='res/x' dataset='digits'"]) == 0
    assert fake_flwr()[-1][-1] == f"output-dir='{caller / 'res' / 'x'}'"
    assert cli.main(["run", str(REPO), "-c", f"output-dir='{tmp_path}' dataset='digits'"]) == 0
    assert fake_flwr()[-1] == ["run", str(REPO), "--run-config",
                               f"output-dir='{tmp_path}' dataset='digits'"]  # absolute: unchanged


def test_a_toml_run_config_gets_the_absolute_output_dir_in_a_merged_file(fake_flwr, tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "over.toml").write_text("dataset = 'digits'\nrun-name = 'r'\n")
    seen = {}
    real = cli._flwr_run

    def capture(command, connection, stream):
        seen["file"] = Path(command[command.index("--run-config") + 1]).read_text()
        return real(command, connection, stream)
    monkeypatch.setattr(cli, "_flwr_run", capture)
    assert cli.main(["run", ".", "-c", "over.toml"]) == 0
    assert tomllib.loads(seen["file"]) == {"dataset": "digits", "run-name": "r",
                                           "output-dir": str(tmp_path / "outputs")}


def test_a_remote_superlink_keeps_the_output_dir_as_given(fake_flwr, monkeypatch, capsys):
    monkeypatch.setattr(cli, "superlink_is_local", lambda connection: False)
    assert cli.main(["run", str(REPO), "lab", "-c", "dataset='cifar10' model='cnn'"]) == 0  # no data
    assert fake_flwr()[-1] == ["run", str(REPO), "lab", "--run-config", "dataset='cifar10' model='cnn'"]
    assert "resolved on the server" in capsys.readouterr().out


def test_a_streamed_run_that_failed_exits_non_zero(fake_flwr, monkeypatch, capsys):
    monkeypatch.setattr(cli, "run_status", lambda connection, run_id: {
        "status": "finished:failed", "status-details": f"run {run_id} broke"})
    assert cli.main(["run", str(REPO), "--stream", "-c", "dataset='digits'"]) == 1
    assert "bouquet: run 42 failed: run 42 broke" in capsys.readouterr().err
    assert cli.main(["run", str(REPO), "-c", "dataset='digits'"]) == 0  # not streamed: still running
    monkeypatch.setattr(cli, "run_status", lambda connection, run_id: {"status": "finished:completed"})
    assert cli.main(["run", str(REPO), "--stream", "-c", "dataset='digits'"]) == 0


def test_local_superlinks_are_recognised(tmp_path, monkeypatch):
    (tmp_path / "config.toml").write_text(
        '[superlink]\ndefault = "local"\n[superlink.local]\naddress = ":local:"\n'
        '[superlink.loop]\naddress = "127.0.0.1:9093"\ninsecure = true\n'
        '[superlink.lab]\naddress = "lab.example.org:9093"\ninsecure = true\n')
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert cli.superlink_is_local(None) and cli.superlink_is_local("loop")
    assert not cli.superlink_is_local("lab") and not cli.superlink_is_local("nowhere")


def test_run_arguments_are_split_like_flwr_run_reads_them():
    assert cli.split_run_args([".", "lab", "--stream", "--format", "json", "-c", "a=1",
                               "--run-config=b=2", "--federation-config", "x=1"]) == (
        [".", "lab"], ["a=1", "b=2"], ["--stream", "--format", "json", "--federation-config", "x=1"])


# --- the ServerApp's one line -----------------------------------------------------------------------
def test_a_config_error_in_the_serverapp_is_one_error_line_and_is_raised(caplog):
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={**default_run_config(), "num-rounds": 0})
    with caplog.at_level(logging.INFO, logger="flwr"), pytest.raises(ConfigError) as err:
        server_main(None, context)  # fails before the grid is used
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        "run config: key 'num-rounds' = 0 is invalid: Input should be greater than or equal to 1"]
    assert getattr(err.value, "_bouquet_reported") is True  # Flower still sees it: the run fails


def _flower_like_log(error: BaseException) -> list[logging.LogRecord]:
    """What Flower's runtime logs after a ServerApp exception, through a logger with the filter."""
    logger = logging.getLogger("test-flwr-runtime")
    logger.propagate = False
    logger.filters.clear()
    quiet_user_errors(logger)
    assert quiet_user_errors(logger) is logger.filters[0] and len(logger.filters) == 1  # once
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.handlers = [handler]
    logger.setLevel(logging.DEBUG)
    try:
        raise error
    except Exception as caught:
        logger.error("Simulation raised an exception", exc_info=caught)
    logger.error("Exit Code: 700\n\nAn unhandled exception occurred when running the simulation."
                 "\n\nFor more information, visit: <https://flower.ai>")
    return records


def test_flower_logs_no_traceback_after_a_reported_error():
    error = ConfigError("run config: key 'lr' = -1 is invalid")
    setattr(error, "_bouquet_reported", True)
    records = _flower_like_log(error)
    assert [(r.levelname, r.getMessage()) for r in records] == [
        ("INFO", "run failed (Flower exit code 700): see the error above")]


def test_other_exceptions_keep_their_traceback():
    records = _flower_like_log(RuntimeError("a bug"))
    assert records[0].exc_info is not None and records[0].getMessage() == "Simulation raised an exception"
    assert records[1].levelname == "ERROR" and records[1].getMessage().startswith("Exit Code: 700\n")


# --- end to end: bouquet run against a simulation SuperLink ------------------------------------------
@pytest.mark.e2e
def test_bouquet_run_writes_results_where_it_was_run_and_refuses_bad_configs(tmp_path):
    from tests.simulation_superlink import flwr, simulation_superlink

    home, caller = tmp_path / "home", tmp_path / "caller"
    home.mkdir()
    caller.mkdir()
    with simulation_superlink(home) as env:  # the SuperLink's working directory is `home`
        env = {**env, "PYTHONPATH": str(REPO)}

        def bouquet(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "server_app.cli", *args], env=env,
                                  cwd=caller, capture_output=True, text=True, timeout=600)

        bad = bouquet("run", str(REPO), "e2e", "--stream", "--run-config", "num-round=1")
        assert bad.returncode == cli.INVALID, bad.stdout + bad.stderr
        assert "unknown key 'num-round'; did you mean 'num-rounds'?" in bad.stderr
        listing = json.loads(flwr(env, "list", "e2e", "--format", "json", timeout=60).stdout)
        assert listing["runs"] == []  # nothing was submitted

        good = bouquet("run", str(REPO), "e2e", "--stream", "--federation-config",
                       "num-supernodes=2", "--run-config",
                       "num-clients=4 num-rounds=1 dataset='digits' model='mclr' partition='iid' "
                       "max-samples-per-client=100 run-name='here'")
        assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
        assert (caller / "outputs" / "here" / "summary.json").is_file()
        assert not (home / "outputs").exists()

        failed = bouquet("run", str(REPO), "e2e", "--stream", "--run-config",
                         "dataset='digits' run-name='here'")  # valid, but the results exist
        assert failed.returncode == 1, failed.stdout[-3000:]
        assert "already holds the results of a run" in failed.stdout
        assert "Traceback" not in failed.stdout + failed.stderr
