"""`server_app.harness.outcome` without a federation: a scripted `flwr` answers `flwr list` as a
SuperLink would (unreachable, running, finished), so each exit code is reached and checked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from server_app.harness import outcome
from server_app.harness.outcome import (EXIT_CODES, RunNotStartedError, RunStillRunningError,
                                        SuperLinkUnreachableError, parse_run_id, wait_for_final)

UNREACHABLE = {"success": False, "error-message": "Using SuperLink: x\n\nConnection to the SuperLink "
               "is unavailable. Please check your network connection and 'address' in the SuperLink "
               "connection configuration."}


def _listing(status: str, details: str = "N/A") -> dict:
    return {"success": True, "runs": [{"run-id": "7", "status": status, "status-details": details}]}


@pytest.fixture
def scripted_flwr(tmp_path, monkeypatch):
    """`flwr` replaced by a script: `flwr list` prints the next of the given answers (the last one
    repeats), `flwr run` prints `run_output` and exits `run_exit`."""
    def install(answers: list[dict], run_output: str = "Successfully started run 7\n",
                run_exit: int = 1) -> Path:
        (tmp_path / "answers.json").write_text(json.dumps(answers))
        (tmp_path / "count").write_text("0")
        script = tmp_path / "flwr"
        script.write_text(f"""#!{sys.executable}
import json, sys
from pathlib import Path
root = Path({str(tmp_path)!r})
if sys.argv[1] == "run":
    print({run_output!r}, end=""); sys.exit({run_exit})
answers = json.loads((root / "answers.json").read_text())
n = int((root / "count").read_text()); (root / "count").write_text(str(n + 1))
print(json.dumps(answers[min(n, len(answers) - 1)]))
""")
        script.chmod(0o755)
        monkeypatch.setattr(outcome, "_flwr", lambda: str(script))
        return tmp_path / "count"
    return install


def test_the_wait_rides_out_an_unreachable_superlink_until_the_run_finishes(scripted_flwr):
    calls = scripted_flwr([UNREACHABLE, UNREACHABLE, _listing("running"), _listing("finished:completed")])
    assert wait_for_final("c", 7, timeout=30, poll=0.05) == ("finished:completed", "N/A")
    assert calls.read_text() == "4"


def test_an_unreachable_superlink_is_told_apart_from_a_run_still_running(scripted_flwr):
    scripted_flwr([UNREACHABLE])
    with pytest.raises(SuperLinkUnreachableError, match="could not be reached .* outcome is unknown"):
        wait_for_final("c", 7, timeout=0.5, poll=0.05)
    scripted_flwr([_listing("running")])
    with pytest.raises(RunStillRunningError, match="run 7 is still running after 0 s"):
        wait_for_final("c", 7, timeout=0.5, poll=0.05)


def test_flwr_runs_exit_code_is_not_the_verdict(scripted_flwr):
    """`flwr run --stream` exiting 1 (stream cut by a SuperLink restart) on a run that completed:
    completed; exiting 0 on a run the SuperLink failed: failed."""
    scripted_flwr([_listing("finished:completed")], run_exit=1)
    done = outcome.run_job("app", "c", {"num-rounds": 1}, timeout=10)
    assert (done.completed, done.cli_exit) == (True, 1)
    scripted_flwr([_listing("finished:failed", "No heartbeat received from the run.")], run_exit=0)
    failed = outcome.run_job("app", "c", timeout=10)
    assert (failed.completed, failed.finished, failed.cli_exit) == (False, True, 0)
    assert failed.details == "No heartbeat received from the run."


@pytest.mark.parametrize("answers, run_output, code", [
    ([_listing("finished:completed")], "Successfully started run 7\n", 0),
    ([_listing("finished:stopped")], "Successfully started run 7\n", 1),
    ([_listing("running")], "Successfully started run 7\n", 4),
    ([UNREACHABLE], "Successfully started run 7\n", 3),
    ([], "Connection to the SuperLink is unavailable. Please check", 3),
    ([], "Error: the app's pyproject.toml has no [tool.flwr.app]", 2),
])
def test_the_cli_exit_codes(scripted_flwr, capsys, answers, run_output, code):
    scripted_flwr(answers, run_output=run_output)
    assert outcome.main(["app", "c", "--timeout", "0.3"]) == code
    if code:
        assert capsys.readouterr().err.startswith(EXIT_CODES[code])


def test_the_cli_follows_a_submitted_run(scripted_flwr):
    scripted_flwr([UNREACHABLE, _listing("finished:completed")])
    assert outcome.main(["c", "--run-id", "7", "--timeout", "20"]) == 0
    with pytest.raises(SystemExit):  # an app and a run id together are refused
        outcome.main(["app", "c", "--run-id", "7"])


def test_no_run_id_in_the_output_is_not_started_not_unreachable():
    with pytest.raises(RunNotStartedError):
        parse_run_id("Error: invalid run config key 'num-round'")
    with pytest.raises(SuperLinkUnreachableError):
        parse_run_id("Connection to the SuperLink is unavailable. Please check ...")
