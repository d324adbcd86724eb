"""Model zoo for Bouquet: every model is a ``Backbone`` split into ``features`` and ``head``.

The split is structural (two submodules) so that personalised-FL methods can partition
the state dict by key prefix: FedPer shares ``features.*``, LG-FedAvg shares ``head.*``,
FedSKA pulls ``features.*``. Callers seed ``torch.manual_seed`` before ``build_model``;
construction consumes the RNG only through parameter initialisation, so it is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral

import torch
from torch import nn

from models.backbone import Backbone
from models.forecasters import FORECASTER_BUILDERS
from models.paper_models import TEXT_MODELS, build_celeba_cnn, build_char_lstm, build_mobilenet_v2

InputShape = tuple[int, int, int]
"""Image shape ``(channels, height, width)`` of one sample."""


def _flat_dim(input_shape: InputShape) -> int:
    """Number of values in one flattened sample."""
    channels, height, width = input_shape
    return channels * height * width


def build_mclr(input_shape: InputShape, num_classes: int) -> Backbone:
    """FedSKA's MNIST model (multinomial logistic regression with a 64-d linear bottleneck).

    features = Flatten + Linear(C·H·W → 64) with no activation; head = Linear(64 → classes).
    """
    feature_dim = 64
    features = nn.Sequential(nn.Flatten(), nn.Linear(_flat_dim(input_shape), feature_dim))
    return Backbone(features, nn.Linear(feature_dim, num_classes), feature_dim)


def build_mlp(input_shape: InputShape, num_classes: int) -> Backbone:
    """FLT's MLP (784 → 200, ReLU, dropout → classes), generalised to any input size.

    features = Flatten + Linear(C·H·W → 200) + ReLU + Dropout(0.2); head = Linear(200 → classes).
    """
    feature_dim = 200
    features = nn.Sequential(
        nn.Flatten(),
        nn.Linear(_flat_dim(input_shape), feature_dim),
        nn.ReLU(),
        nn.Dropout(0.2),
    )
    return Backbone(features, nn.Linear(feature_dim, num_classes), feature_dim)


def _conv_pool_features(
    channels: int, widths: tuple[int, int], pooled_pixels: int, feature_dim: int
) -> nn.Sequential:
    """Two conv5×5 (padding 2) + ReLU + maxpool2 stages, flatten, Linear(→ feature_dim) + ReLU."""
    first, second = widths
    return nn.Sequential(
        nn.Conv2d(channels, first, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(first, second, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(second * pooled_pixels, feature_dim),
        nn.ReLU(),
    )


def build_cnn(input_shape: InputShape, num_classes: int) -> Backbone:
    """Small CPU-friendly CNN from the SFL spec, designed for 28×28 inputs.

    Two conv5×5 (padding 2) + ReLU + maxpool2 stages (C→16→32), then Linear(→128) + ReLU
    as features; head = Linear(128 → classes). The flattened size is computed from
    ``input_shape`` (each pool floors H and W by 2), so any H, W ≥ 4 works.
    """
    channels, height, width = input_shape
    if height < 4 or width < 4:
        raise ValueError(f"model 'cnn' needs height and width >= 4 (two 2x2 pools), got {input_shape}")
    feature_dim = 128
    features = _conv_pool_features(channels, (16, 32), (height // 4) * (width // 4), feature_dim)
    return Backbone(features, nn.Linear(feature_dim, num_classes), feature_dim)


def build_leaf_cnn(input_shape: InputShape, num_classes: int) -> Backbone:
    """The LEAF benchmark's FEMNIST CNN (Caldas et al., 2018), fixed to 28×28 inputs.

    conv5×5 C→32 (pad 2), ReLU, pool2, conv5×5 32→64 (pad 2), ReLU, pool2, flatten,
    Linear(7·7·64 → 2048), ReLU = features; head = Linear(2048 → classes).
    """
    channels, height, width = input_shape
    if (height, width) != (28, 28):
        raise ValueError(f"model 'leaf-cnn' needs 28x28 inputs, got input_shape {input_shape}")
    feature_dim = 2048
    features = _conv_pool_features(channels, (32, 64), 7 * 7, feature_dim)
    return Backbone(features, nn.Linear(feature_dim, num_classes), feature_dim)


def _conv_bn(in_channels: int, out_channels: int) -> nn.Sequential:
    """ResNet9's basic unit: conv3×3 (no bias, BN supplies it) + BatchNorm2d + ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
    )


class _Residual(nn.Module):
    """Identity shortcut around ``block``: ``x + block(x)``."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Add the block's output to its input."""
        return x + self.block(x)


def build_resnet9(input_shape: InputShape, num_classes: int) -> Backbone:
    """ResNet9 for CIFAR-10 from DAWNBench (Myrtle.ai / David Page, "How to train your ResNet").

    prep conv 64; layer1 conv 128 + pool + residual(2× conv 128); layer2 conv 256 + pool;
    layer3 conv 512 + pool + residual(2× conv 512); global max pool + flatten = features
    (512-d); head = Linear(512 → classes). Any channel count; H, W ≥ 8 (three 2×2 pools).
    """
    channels, height, width = input_shape
    if height < 8 or width < 8:
        raise ValueError(f"model 'resnet9' needs height and width >= 8 (three 2x2 pools), got {input_shape}")
    feature_dim = 512
    features = nn.Sequential(
        _conv_bn(channels, 64),
        _conv_bn(64, 128),
        nn.MaxPool2d(2),
        _Residual(nn.Sequential(_conv_bn(128, 128), _conv_bn(128, 128))),
        _conv_bn(128, 256),
        nn.MaxPool2d(2),
        _conv_bn(256, 512),
        nn.MaxPool2d(2),
        _Residual(nn.Sequential(_conv_bn(512, 512), _conv_bn(512, 512))),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
    )
    return Backbone(features, nn.Linear(feature_dim, num_classes), feature_dim)


ModelBuilder = Callable[[InputShape, int], Backbone]
"""Signature of a registry entry: ``(input_shape, num_classes) -> Backbone``."""

MODEL_BUILDERS: dict[str, ModelBuilder] = {
    "mclr": build_mclr,
    "mlp": build_mlp,
    "cnn": build_cnn,
    "leaf-cnn": build_leaf_cnn,
    "resnet9": build_resnet9,
    "mobilenet-v2": build_mobilenet_v2,  # FedSKA's CIFAR-10 model (1280-d features)
    "celeba-cnn": build_celeba_cnn,  # LEAF's CelebA CNN, 84×84×3
    "char-lstm": build_char_lstm,  # LEAF / FedSKA Shakespeare: int64 character windows (steps,)
    **FORECASTER_BUILDERS,  # "gru", "rnn": traffic windows (steps, features) → horizon outputs
}
"""Registry of model names to builders; ``build_model`` dispatches through it."""

SEQUENCE_MODELS: tuple[str, ...] = tuple(FORECASTER_BUILDERS)
"""Models whose input is a window ``(steps, features)``; all others take images ``(C, H, W)``."""

IMAGE_MODELS: tuple[str, ...] = tuple(m for m in MODEL_BUILDERS if m not in SEQUENCE_MODELS + TEXT_MODELS)
"""Models whose input is an image ``(C, H, W)``."""

MODEL_NAMES: tuple[str, ...] = tuple(MODEL_BUILDERS)
"""Names accepted by ``build_model``."""


def _is_positive_int(value: object) -> bool:
    """True for a positive integer (numpy ints included, bools excluded)."""
    return isinstance(value, Integral) and not isinstance(value, bool) and int(value) > 0


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> Backbone:
    """Build the registered model ``name`` for images of ``input_shape`` (C, H, W), or for windows
    ``(steps, features)`` when ``name`` is a sequence model (then ``num_classes`` = horizon outputs),
    or for token windows ``(steps,)`` when ``name`` is a text model (then ``num_classes`` = vocabulary).

    Raises ``ValueError`` for an unknown name, a malformed ``input_shape``, a non-positive
    ``num_classes``, or a shape the chosen model cannot take.
    """
    if name not in MODEL_BUILDERS:
        raise ValueError(f"unknown model {name!r}; allowed names: {', '.join(MODEL_NAMES)}")
    dims = tuple(input_shape)
    expected = ("(steps, features)" if name in SEQUENCE_MODELS else "(steps,)" if name in TEXT_MODELS
                else "(channels, height, width)")
    rank = 2 if name in SEQUENCE_MODELS else 1 if name in TEXT_MODELS else 3
    if len(dims) != rank or not all(_is_positive_int(d) for d in dims):
        raise ValueError(f"model {name!r}: input_shape must be {expected} of positive ints, got {input_shape!r}")
    if not _is_positive_int(num_classes):
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    return MODEL_BUILDERS[name](tuple(int(d) for d in dims), int(num_classes))
