"""Sequence forecasters for traffic (docs/datasets.md: an RNN with hidden size 64, 12-step horizon).

Each forecaster is a ``Backbone``: ``features`` reads a window ``[B, steps, features]`` and returns the
last hidden state ``[B, 64]``; ``head`` = Linear(64 → horizon) predicts all horizon steps at once
(z-scored speeds). So FedPer / LG-FedAvg / FedSKA's ``features.*`` / ``head.*`` splits apply unchanged.
``models.backbones`` lists them in its registry.
"""

from __future__ import annotations

import torch
from torch import nn

from models.backbone import Backbone

SequenceShape = tuple[int, int]
"""Window shape ``(steps, features)`` of one sample."""

HIDDEN_SIZE = 64


class RecurrentEncoder(nn.Module):
    """A one-layer GRU or Elman RNN (tanh) over the window; returns the hidden state after the last step."""

    def __init__(self, cell: str, num_features: int, hidden_size: int = HIDDEN_SIZE) -> None:
        super().__init__()
        layers = {"gru": nn.GRU, "rnn": nn.RNN}
        if cell not in layers:
            raise ValueError(f"unknown recurrent cell {cell!r}; allowed: {', '.join(layers)}")
        self.rnn = layers[cell](num_features, hidden_size, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, steps, features]`` → ``[B, hidden_size]``."""
        _, hidden = self.rnn(x)
        return hidden[-1]


def _build(cell: str, input_shape: SequenceShape, horizon: int) -> Backbone:
    _, num_features = input_shape
    features = RecurrentEncoder(cell, num_features, HIDDEN_SIZE)
    return Backbone(features, nn.Linear(HIDDEN_SIZE, horizon), HIDDEN_SIZE)


def build_gru(input_shape: SequenceShape, horizon: int) -> Backbone:
    """GRU(features → 64) = features; head = Linear(64 → horizon)."""
    return _build("gru", input_shape, horizon)


def build_rnn(input_shape: SequenceShape, horizon: int) -> Backbone:
    """Plain RNN (tanh, features → 64) = features, the SFL paper's traffic model;
    head = Linear(64 → horizon)."""
    return _build("rnn", input_shape, horizon)


FORECASTER_BUILDERS = {"gru": build_gru, "rnn": build_rnn}
"""Sequence models by name; ``models.backbones.MODEL_BUILDERS`` includes them."""
