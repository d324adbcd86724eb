"""Per-client server matrices in memory or memory-mapped (strategies/shared/client_matrix.py): same numbers."""

from pathlib import Path

import pytest
import torch

from benchmarks.parallel import without_timings
from server_app.harness.simulate import simulate
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.personalized import PersonalizedStrategy
from strategies.shared.registry import METHODS, build_strategy
from strategies.shared.run_config import RunConfig, default_run_config


def _mapped_files() -> list[str]:
    return [line for line in Path("/proc/self/maps").read_text().splitlines()
            if "client-matrix-" in line]


def test_above_the_threshold_a_matrix_is_an_unlinked_file_mapping_with_the_same_values(tmp_path):
    row = torch.arange(6, dtype=torch.float32)
    storage = ClientMatrixStorage(mmap_bytes=4 * 6 * 3, directory=tmp_path / "run")
    small = storage.filled(row, 3)  # 72 bytes: not above the threshold
    assert not storage.mapped(3, 6) and not _mapped_files()
    big = storage.filled(row, 4)  # 96 bytes: a file
    assert storage.mapped(4, 6)
    assert torch.equal(big, row.repeat(4, 1)) and torch.equal(small, row.repeat(3, 1))
    maps = _mapped_files()
    assert len(maps) == 1 and "(deleted)" in maps[0]  # mapped, and already gone from the folder
    assert list((tmp_path / "run").iterdir()) == []
    copy = storage.copy(big)
    big[1] = -1.0  # the copy has its own storage
    assert torch.equal(copy, row.repeat(4, 1)) and float(big[1].sum()) == -6.0
    zeros = storage.zeros_like(big)
    assert torch.equal(zeros, torch.zeros(4, 6))
    del big, copy, zeros
    assert not _mapped_files()  # the mapping (and the file's space) goes with the tensors


METHOD_CONFIG = {"fedcg": {"model": "cnn"}}  # FedCG needs a conv model


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_builder_hands_the_storage_to_the_strategy(tiny_run, tmp_path, method):
    """A method that keeps per-client matrices receives their storage when it is built (nothing
    sets it afterwards); without one, the run config's threshold applies."""
    cfg = RunConfig.from_flower({**default_run_config(), **tiny_run, "method": method,
                                 "client-matrix-mmap-bytes": 123, **METHOD_CONFIG.get(method, {})})
    storage = ClientMatrixStorage(mmap_bytes=7, directory=tmp_path / "run")
    strategy = build_strategy(cfg, storage)
    if isinstance(strategy, PersonalizedStrategy):
        assert strategy.matrix_storage is storage
        assert build_strategy(cfg).matrix_storage == ClientMatrixStorage(123)
    else:
        assert not hasattr(strategy, "matrix_storage")


@pytest.mark.federation
@pytest.mark.parametrize("method, extra", [("sfl", {}),
                                           ("sfl-star", {"sfl.gl-features": "updates"}),
                                           ("ditto", {})])
def test_a_run_with_every_matrix_memory_mapped_gives_the_same_numbers(tiny_run, tmp_path, method,
                                                                        extra, monkeypatch):
    allocated: list[tuple[bool, Path]] = []
    empty = ClientMatrixStorage.empty

    def recording(self, rows, cols):
        allocated.append((self.mapped(rows, cols), self.directory))
        return empty(self, rows, cols)

    monkeypatch.setattr(ClientMatrixStorage, "empty", recording)
    runs = {}
    for name, threshold in (("memory", 1 << 40), ("mapped", 0)):
        overrides = {**tiny_run, **extra, "method": method, "run-name": name,
                     "partition": "label-clusters", "num-clusters": 2,
                     "client-matrix-mmap-bytes": threshold}
        runs[name] = simulate(overrides)
    matrices = {"sfl": 2, "sfl-star": 3, "ditto": 1}[method]  # V; SFL's U; SFL*'s updates
    assert allocated == ([(False, tmp_path / "memory")] * matrices
                         + [(True, tmp_path / "mapped")] * matrices)
    assert without_timings(runs["mapped"]) == without_timings(runs["memory"])
    assert ((tmp_path / "mapped" / "clients.csv").read_bytes()
            == (tmp_path / "memory" / "clients.csv").read_bytes())
    assert not list((tmp_path / "mapped").glob("client-matrix-*"))  # nothing left in the run dir
