"""The shape every Bouquet model has: ``head(features(x))`` with two separately addressable halves
(FedPer shares ``features.*``, LG-FedAvg ``head.*``, FedSKA pulls ``features.*``)."""

from __future__ import annotations

import torch
from torch import nn


class Backbone(nn.Module):
    """A classifier ``head(features(x))`` whose two halves are separately addressable.

    ``features`` maps images ``[B, C, H, W]`` to flat vectors ``[B, feature_dim]``;
    ``head`` maps those vectors to logits ``[B, num_classes]``.
    """

    def __init__(self, features: nn.Module, head: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.features = features
        self.head = head
        self.feature_dim = feature_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``[B, num_classes]`` for images ``x`` of shape ``[B, C, H, W]``."""
        return self.head(self.features(x))
