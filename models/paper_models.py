"""The papers' larger models, each a ``Backbone`` split into ``features`` and ``head``:

- ``mobilenet-v2``: torchvision's MobileNet-v2 adapted to 32×32 inputs (FedSKA's CIFAR-10 model):
  the first conv has stride 1 and the first stride-2 inverted-residual stage (24 channels) has
  stride 1, so a 32×32 image is downsampled 8× (to 4×4) instead of 32× (to 1×1). ``features`` =
  torchvision's ``features`` (ending in the 1×1 conv to 1280 channels) + global average pool +
  flatten (1280-d, FedSKA's d); ``head`` = torchvision's classifier, Dropout(0.2) + Linear(1280 →
  classes). Randomly initialised (torchvision's init; no ImageNet weights are downloaded).
- ``celeba-cnn``: LEAF's CelebA CNN: 4 × [Conv3×3 32 (pad 1), BatchNorm, MaxPool 2 (pad 1), ReLU]
  on 84×84×3 (84 → 43 → 22 → 12 → 7), flatten = features (32·7·7 = 1568-d); head = Linear(1568 →
  classes) (2 for smiling / not).
- ``char-lstm``: the character LSTM of LEAF's / FedSKA's Shakespeare task: Embedding(80 → 8), one
  LSTM layer of 256, the hidden state after the last character = features (256-d); head =
  Linear(256 → 80) predicts the next character. Its input is int64 character indices ``[B, steps]``.
"""

from __future__ import annotations

import torch
from torch import nn

from models.backbone import Backbone

MOBILENET_FEATURES = 1280  # MobileNet-v2's last hidden layer (torchvision's last_channel)
CELEBA_SIDE = 84
CELEBA_FEATURES = 32 * 7 * 7  # 1568
CHAR_EMBEDDING = 8
CHAR_HIDDEN = 256
TEXT_MODELS: tuple[str, ...] = ("char-lstm",)
"""Models whose input is a window of int64 token indices ``(steps,)`` (next-character task)."""


def build_mobilenet_v2(input_shape: tuple[int, int, int], num_classes: int) -> Backbone:
    """torchvision's MobileNet-v2 for 32×32-like inputs (module docstring); any channel count, H, W ≥ 8."""
    from torchvision.models import mobilenet_v2

    channels, height, width = input_shape
    if height < 8 or width < 8:
        raise ValueError(f"model 'mobilenet-v2' needs height and width >= 8 (three stride-2 stages), "
                         f"got {input_shape}")
    # torchvision's setting (t, c, n, s) with the 24-channel stage at stride 1 (32×32 adaptation)
    setting = [[1, 16, 1, 1], [6, 24, 2, 1], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1],
               [6, 160, 3, 2], [6, 320, 1, 1]]
    net = mobilenet_v2(weights=None, num_classes=num_classes, inverted_residual_setting=setting)
    first = net.features[0][0]  # Conv2d(3, 32, 3, stride 2, pad 1, no bias)
    net.features[0][0] = nn.Conv2d(channels, first.out_channels, kernel_size=3, stride=1, padding=1,
                                   bias=False)
    nn.init.kaiming_normal_(net.features[0][0].weight, mode="fan_out")  # torchvision's conv init
    features = nn.Sequential(net.features, nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return Backbone(features, net.classifier, MOBILENET_FEATURES)


def build_celeba_cnn(input_shape: tuple[int, int, int], num_classes: int) -> Backbone:
    """LEAF's CelebA CNN (module docstring), fixed to 84×84 inputs."""
    channels, height, width = input_shape
    if (height, width) != (CELEBA_SIDE, CELEBA_SIDE):
        raise ValueError(f"model 'celeba-cnn' needs 84x84 inputs, got input_shape {input_shape}")
    layers: list[nn.Module] = []
    width_in = channels
    for _ in range(4):
        layers += [nn.Conv2d(width_in, 32, kernel_size=3, padding=1), nn.BatchNorm2d(32),
                   nn.MaxPool2d(2, padding=1), nn.ReLU()]
        width_in = 32
    features = nn.Sequential(*layers, nn.Flatten())
    return Backbone(features, nn.Linear(CELEBA_FEATURES, num_classes), CELEBA_FEATURES)


class CharEncoder(nn.Module):
    """Embedding + one LSTM layer over a character window; returns the last step's hidden state."""

    def __init__(self, vocabulary: int, embedding: int = CHAR_EMBEDDING, hidden: int = CHAR_HIDDEN) -> None:
        super().__init__()
        self.vocabulary = vocabulary
        self.embedding = nn.Embedding(vocabulary, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=1, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """int64 ``[B, steps]`` character indices → ``[B, hidden]``."""
        if x.is_floating_point():
            raise TypeError(f"model 'char-lstm' takes int64 character indices [B, steps], got {x.dtype}")
        output, _ = self.lstm(self.embedding(x))
        return output[:, -1]


def build_char_lstm(input_shape: tuple[int], num_classes: int) -> Backbone:
    """The Shakespeare character LSTM (module docstring); the vocabulary is ``num_classes`` (80)."""
    features = CharEncoder(num_classes)
    return Backbone(features, nn.Linear(CHAR_HIDDEN, num_classes), CHAR_HIDDEN)
