"""Flat parameter rows: round trip, integer buffers, validation."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from models import build_model
from strategies.shared.params import ParameterLayout


def _resnet_arrays():
    torch.manual_seed(0)
    return ArrayRecord(build_model("resnet9", (3, 32, 32), 10).state_dict())


def test_round_trip_keeps_every_entry_and_dtype():
    arrays = _resnet_arrays()
    layout = ParameterLayout.of(arrays)
    row = layout.row(arrays)
    assert row.dtype == torch.float32 and row.ndim == 1
    # BatchNorm running stats are floats and belong to the row; num_batches_tracked does not
    assert any("running_mean" in k for k in layout.keys)
    assert not any("num_batches_tracked" in k for k in layout.keys)
    assert layout.size == sum(int(np.prod(s)) for s in layout.shapes)
    back = layout.arrays(row)
    assert list(back.keys()) == list(arrays.keys())
    for key in arrays.keys():
        np.testing.assert_array_equal(back[key].numpy(), arrays[key].numpy())
        assert back[key].numpy().dtype == arrays[key].numpy().dtype


def test_matrix_repeats_the_initial_row():
    arrays = ArrayRecord(build_model("mclr", (1, 28, 28), 10).state_dict())
    layout = ParameterLayout.of(arrays)
    matrix = layout.matrix(arrays, 3)
    assert matrix.shape == (3, 784 * 64 + 64 + 64 * 10 + 10)
    assert torch.equal(matrix[0], matrix[2])


def test_wrong_shape_is_rejected_with_the_entry_name():
    arrays = ArrayRecord(build_model("mclr", (1, 28, 28), 10).state_dict())
    layout = ParameterLayout.of(arrays)
    other = ArrayRecord(build_model("mclr", (1, 28, 28), 5).state_dict())
    with pytest.raises(ValueError, match="head"):
        layout.row(other)
