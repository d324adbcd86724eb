"""A quiet log: Flower's and Ray's known warnings are filtered (a real `ray.init`, Flower's own
logger, a relayed stream line), nothing else is, and long server steps say when they start and end."""

import logging
import os
import subprocess
import sys
import warnings

import pytest
from flwr.common.logger import log as flower_log

from strategies.shared.known_warnings import (
    KNOWN_FLOWER_MESSAGES,
    is_known_noise,
    quiet_known_warnings,
)
from tests.conftest import REPO

RAY_INIT = ("import ray; ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False); "
            "ray.shutdown()")


def python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS",
                                                           "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=300)


@pytest.mark.slow
def test_rays_accelerator_warning_is_gone_once_the_client_app_is_imported():
    """Flower's simulation imports the ClientApp before it starts Ray: `ray.init` then prints no
    FutureWarning. Without Bouquet imported, the same call prints it (the test can fail)."""
    bare = python(RAY_INIT)
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert "FutureWarning: Tip: In future versions of Ray" in bare.stderr
    quiet = python("import client_app; " + RAY_INIT)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "FutureWarning" not in quiet.stderr


def test_the_warning_filter_drops_only_the_known_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_known_warnings()
        warnings.warn("Tip: In future versions of Ray, Ray will no longer override accelerator "
                      "visible devices env var if num_gpus=0", FutureWarning)
        warnings.warn("Tip: something else", FutureWarning)
    assert [str(w.message) for w in caught] == ["Tip: something else"]


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_flowers_known_messages_are_dropped_from_its_logger():
    quiet_known_warnings()
    quiet_known_warnings()  # idempotent: one filter
    flower = logging.getLogger("flwr")
    assert sum(type(f).__name__ == "_KnownFlowerMessages" for f in flower.filters) == 1
    handler = Collect()
    flower.addHandler(handler)
    try:
        for message in KNOWN_FLOWER_MESSAGES:
            flower_log(logging.WARNING, message)
        flower_log(logging.WARNING, "Since flwr 9, something a user must know")
        logging.getLogger("flwr.bouquet").warning("fedcg: no client sent teacher logit sums")
    finally:
        flower.removeHandler(handler)
    assert handler.messages == ["Since flwr 9, something a user must know",
                                "fedcg: no client sent teacher logit sums"]


def test_relayed_stream_lines_of_the_known_warnings_are_recognised():
    """The lines as `flwr run --stream` prints them (Flower's coloured level prefix)."""
    assert is_known_noise("\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes "
                          "changed from 10 to 2.\n")
    assert is_known_noise("\x1b[93mWARNING \x1b[0m:   Skipping `flwr` dependency from app "
                          "requirements to avoid replacing the running Flower installation.")
    assert is_known_noise("/x/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of "
                          "Ray, Ray will no longer override accelerator visible devices env var")
    assert is_known_noise("\x1b[36m(ClientAppActor pid=665)\x1b[0m \x1b[93mWARNING \x1b[0m:   Manually "
                          "terminating ClientAppActor")
    assert not is_known_noise("\x1b[92mINFO \x1b[0m:      Federation `@none/default` (2 simulated "
                              "SuperNodes)")
    assert not is_known_noise("\x1b[93mWARNING \x1b[0m:   FLT: no client answered autoencoder round 1")


def test_long_server_steps_log_their_start_and_end(tiny_run, caplog):
    """FedCG says which teacher a round trains with and when the labelling took how long; the
    round's end line follows."""
    from server_app.harness.simulate import simulate

    caplog.set_level(logging.INFO, logger="flwr")
    logging.getLogger("flwr").addHandler(caplog.handler)  # Flower's logger may not propagate
    try:
        simulate({**tiny_run, "method": "fedcg", "model": "cnn", "partition": "domains",
                  "domain-family": "styles", "num-clients": 4, "num-rounds": 2,
                  "max-samples-per-client": 40, "batch-size": 10, "fedcg.domains": 2,
                  "fedcg.teacher-period": 2, "fedcg.adj-warmup": 1, "fedcg.bottleneck": 8,
                  "fedcg.sinkhorn-iters": 2, "finetune-epochs": 0, "run-name": "fedcg"},
                 num_nodes=2)
    finally:
        logging.getLogger("flwr").removeHandler(caplog.handler)
    text = caplog.text
    assert "fedcg: labelling teacher 0: asking" in text
    assert "labelling of teacher 0 in " in text
    assert "fedcg: round 1: 4 clients train with teacher 0 (the student replaces it after round 2)" in text
    assert "fedcg: round 2: the student becomes teacher 1" in text
