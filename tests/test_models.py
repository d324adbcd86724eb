"""Tests for the model zoo: shapes, features/head split, parameter counts, determinism, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models import MODEL_BUILDERS, MODEL_NAMES, Backbone, build_model

NUM_CLASSES = 10
BATCH = 2
TYPICAL_SHAPES: dict[str, tuple[int, ...]] = {
    "mclr": (1, 28, 28),
    "mlp": (1, 28, 28),
    "cnn": (1, 28, 28),
    "leaf-cnn": (1, 28, 28),
    "resnet9": (3, 32, 32),
    "mobilenet-v2": (3, 32, 32),
    "celeba-cnn": (3, 84, 84),
    "char-lstm": (80,),  # int64 character windows (steps,); more in tests/test_paper_grids.py
    "gru": (12, 2),  # traffic windows (steps, features); more in tests/test_traffic.py
    "rnn": (12, 2),
}


def _build(name: str, seed: int = 0) -> Backbone:
    """Seed, then build ``name`` for its typical input shape."""
    torch.manual_seed(seed)
    return build_model(name, TYPICAL_SHAPES[name], NUM_CLASSES)


def _batch(name: str) -> torch.Tensor:
    """A deterministic random image batch of the model's typical shape (character indices for char-lstm)."""
    if name == "char-lstm":
        return torch.randint(0, NUM_CLASSES, (BATCH, *TYPICAL_SHAPES[name]), generator=torch.Generator().manual_seed(1))
    return torch.randn(BATCH, *TYPICAL_SHAPES[name], generator=torch.Generator().manual_seed(1))


def _num_params(model: nn.Module) -> int:
    """Total number of parameters (weights and biases)."""
    return sum(p.numel() for p in model.parameters())


def test_registry_covers_all_models() -> None:
    assert MODEL_NAMES == tuple(MODEL_BUILDERS)
    assert set(MODEL_NAMES) == set(TYPICAL_SHAPES)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_shapes_and_split(name: str) -> None:
    model = _build(name).eval()  # eval: dropout/BN deterministic so the two paths agree
    x = _batch(name)
    with torch.no_grad():
        logits = model(x)
        feats = model.features(x)
        composed = model.head(feats)
    assert isinstance(model, Backbone)
    assert logits.shape == (BATCH, NUM_CLASSES)
    assert logits.dtype == torch.float32
    assert feats.shape == (BATCH, model.feature_dim)
    assert torch.allclose(composed, logits)
    keys = list(model.state_dict())
    assert keys and all(k.startswith(("features.", "head.")) for k in keys)
    assert any(k.startswith("features.") for k in keys)
    assert any(k.startswith("head.") for k in keys)


@pytest.mark.parametrize(
    ("name", "feature_dim"), [("mclr", 64), ("mlp", 200), ("cnn", 128), ("leaf-cnn", 2048), ("resnet9", 512)]
)
def test_feature_dims(name: str, feature_dim: int) -> None:
    assert _build(name).feature_dim == feature_dim


def test_mclr_param_count() -> None:
    assert _num_params(_build("mclr")) == 784 * 64 + 64 + 64 * 10 + 10


def test_mlp_param_count() -> None:
    assert _num_params(_build("mlp")) == 784 * 200 + 200 + 200 * 10 + 10


def test_leaf_cnn_param_count() -> None:
    convs = (5 * 5 * 1 * 32 + 32) + (5 * 5 * 32 * 64 + 64)
    assert _num_params(_build("leaf-cnn")) == convs + 7 * 7 * 64 * 2048 + 2048 + 2048 * 10 + 10


def test_cnn_adapts_to_input_size() -> None:
    torch.manual_seed(0)
    model = build_model("cnn", (3, 32, 32), NUM_CLASSES)
    assert model(torch.zeros(BATCH, 3, 32, 32)).shape == (BATCH, NUM_CLASSES)


def test_resnet9_accepts_any_channel_count() -> None:
    torch.manual_seed(0)
    model = build_model("resnet9", (1, 28, 28), NUM_CLASSES).eval()
    assert model(torch.zeros(BATCH, 1, 28, 28)).shape == (BATCH, NUM_CLASSES)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_same_seed_same_weights(name: str) -> None:
    a, b = _build(name, seed=7).state_dict(), _build(name, seed=7).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_different_seed_different_weights() -> None:
    a, b = _build("mclr", seed=1).state_dict(), _build("mclr", seed=2).state_dict()
    assert not torch.equal(a["head.weight"], b["head.weight"])


def test_unknown_name_lists_allowed() -> None:
    with pytest.raises(ValueError, match="nope") as excinfo:
        build_model("nope", (1, 28, 28), NUM_CLASSES)
    assert all(name in str(excinfo.value) for name in MODEL_NAMES)


@pytest.mark.parametrize(
    ("name", "shape", "num_classes"),
    [
        ("leaf-cnn", (1, 32, 32), 10),
        ("resnet9", (3, 4, 4), 10),
        ("cnn", (1, 2, 2), 10),
        ("mclr", (28, 28), 10),
        ("mclr", (1, 0, 28), 10),
        ("mclr", (1, 28, 28), 0),
    ],
)
def test_bad_shape_or_classes_raises(name: str, shape: tuple[int, ...], num_classes: int) -> None:
    with pytest.raises(ValueError):
        build_model(name, shape, num_classes)  # type: ignore[arg-type]


def test_mclr_sgd_step_reduces_loss() -> None:
    model = _build("mclr")
    x = _batch("mclr")
    y = torch.tensor([3, 7])
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = loss_fn(model(x), y)
    optimizer.zero_grad()
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = loss_fn(model(x), y)
    assert after.item() < before.item()
