"""Shared test setup: quiet Flower, cache numba compilation, and handy builders."""

import os
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "bouquet-numba"))

import pytest  # noqa: E402

from models.kernels import use_portable_kernels  # noqa: E402

use_portable_kernels()  # before any test computes a tensor: the golden runs hold on every x86-64 CPU

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def tiny_run(tmp_path):
    """Overrides for a small, fast federation on scikit-learn digits, writing into tmp_path."""
    return {
        "method": "fedavg",
        "dataset": "digits",
        "model": "mclr",
        "partition": "iid",
        "num-clients": 4,
        "num-rounds": 2,
        "local-epochs": 1,
        "batch-size": 32,
        "lr": 0.05,
        "max-samples-per-client": 200,
        "finetune-epochs": 0,
        "output-dir": str(tmp_path),
        "run-name": "run",
    }


import torch  # noqa: E402

# Tests run beside other processes on 2 cores: one intra-op thread avoids OpenMP spin-waiting.
torch.set_num_threads(1)


KINDS = ("unit", "federation", "e2e")


def pytest_collection_modifyitems(config, items):
    """Every test has one kind (select with `-m unit`, `-m "not e2e"`, ...): `e2e` and `federation`
    (whole in-process federations: `simulate`, a `LocalGrid`, a golden-run case) are marked in the
    test files, per file (`pytestmark`) or per test; every test left unmarked is a `unit` test."""
    for item in items:
        if not any(item.get_closest_marker(kind) for kind in KINDS):
            item.add_marker(pytest.mark.unit)
