"""Public builders shared by the tests: complete message configs, so a test states only what it is
about."""

from __future__ import annotations

from typing import Any

from flwr.app import ConfigRecord

from strategies.shared.messages import EvaluateInstructions, TrainInstructions


def train_config(**fields: Any) -> ConfigRecord:
    """A valid `train` config (round 1, lr 0.1, one epoch of batch 32, seed 0) with `fields` set."""
    base = dict(server_round=1, lr=0.1, momentum=0.0, local_epochs=1, batch_size=32, seed=0)
    return TrainInstructions(**{**base, **fields}).config()


def evaluate_config(**fields: Any) -> ConfigRecord:
    """A valid `evaluate` config (round 1, batch 32, seed 0, no fine-tuning) with `fields` set."""
    base = dict(server_round=1, batch_size=32, seed=0, lr=0.1, momentum=0.0)
    return EvaluateInstructions(**{**base, **fields}).config()
