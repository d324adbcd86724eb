"""The deploy kit's closed control port: the SuperLink's Control + Runtime API on 127.0.0.1 by
default, and Flower's SuperExec shared secret on every side of the bare-metal commands."""

import shlex

import pytest

from server_app.harness import deploy
from tests.test_deploy import assert_accepted, flag

TLS = deploy.Tls.in_dir("/c")


def test_the_superlink_api_listens_on_loopback_unless_opened():
    link = deploy.superlink(TLS, "/s/state.db")
    assert flag(link, "--host") == "127.0.0.1" == deploy.CONTROL_HOST
    assert flag(link, "--fleet-api-address") == f"0.0.0.0:{deploy.FLEET_PORT}"  # SuperNodes dial in
    assert "--superexec-auth-secret-file" not in link  # only when a secret is given


@pytest.mark.parametrize("command", [
    deploy.superlink(TLS, "/s/state.db", secret_file="/s/superexec.secret"),
    deploy.serverapp_executor(TLS, secret_file="/s/superexec.secret"),
    deploy.supernode(deploy.Tls("/c/ca.crt"), "link:9092", "/k/sn", 0, 2, secret_file="/s/superexec.secret"),
    deploy.clientapp_executor(secret_file="/s/superexec.secret"),
], ids=["superlink", "serverapp-executor", "supernode", "clientapp-executor"])
def test_the_superexec_secret_flag_is_one_this_flower_accepts(command):
    assert_accepted(command)
    assert flag(command, "--superexec-auth-secret-file") == "/s/superexec.secret"


def test_bare_metal_machines_each_make_a_secret_and_share_it_with_their_executor():
    text = deploy.bare_metal("10.0.0.1", 2, "/c", "/k", "")
    machines = text.split("# SuperNode machine ")
    assert len(machines) == 3
    for block in machines:
        commands = [shlex.split(line) for line in block.splitlines()
                    if "flower-" in line and not line.startswith("#")]
        assert len(commands) == 2  # the server (SuperLink or SuperNode) and its executor
        assert deploy.MAKE_SECRET in block
        for command in commands:
            start = next(i for i, arg in enumerate(command) if arg.startswith("flower-"))
            assert flag(command[start:], "--superexec-auth-secret-file") == deploy.SECRET_FILE
    link = shlex.split(next(line for line in machines[0].splitlines()
                            if line.startswith("flower-superlink")))
    assert flag(link, "--host") == "127.0.0.1"
    assert "ssh -N -L 8000:127.0.0.1:8000 10.0.0.1" in machines[0]
