"""Public builders shared by the tests: complete message configs, so a test states only what it is
about."""

from __future__ import annotations

from typing import Any

from flwr.app import ConfigRecord

from strategies.shared.messages import EvaluateInstructions, TrainInstructions
from strategies.shared.personalized import PersonalizedStrategy


def train_config(**fields: Any) -> ConfigRecord:
    """A valid `train` config (round 1, lr 0.1, one epoch of batch 32, seed 0) with `fields` set."""
    base = dict(server_round=1, lr=0.1, momentum=0.0, local_epochs=1, batch_size=32, seed=0)
    return TrainInstructions(**{**base, **fields}).config()


def evaluate_config(**fields: Any) -> ConfigRecord:
    """A valid `evaluate` config (round 1, batch 32, seed 0, no fine-tuning) with `fields` set."""
    base = dict(server_round=1, batch_size=32, seed=0, lr=0.1, momentum=0.0)
    return EvaluateInstructions(**{**base, **fields}).config()


def safeguard_component(method: str, strategy: Any = None, weight: float | None = None,
                        **overrides: Any) -> Any:
    """The server's safeguard (`server_app.safeguard.Safeguard`) of a run of `method` with
    `overrides` (run-config keys), attached to a run whose strategy is `strategy`, with the
    federation's pooled `weight`."""
    from pathlib import Path

    from server_app.callbacks import RunView
    from server_app.safeguard import Safeguard
    from strategies.shared.run_config import RunConfig, default_run_config

    cfg = RunConfig.from_flower({**default_run_config(), "method": method, **overrides})
    component = Safeguard(cfg)
    component.attach(RunView(cfg, Path("."), strategy))
    component.weight = weight
    return component


def consensus_strategy() -> Any:
    """A personalized strategy that hands every client the same model (`hands_out_consensus`)."""
    return _Consensus.__new__(_Consensus)



class _Consensus(PersonalizedStrategy):
    def hands_out_consensus(self) -> bool:
        return True

    def consensus_mass(self) -> tuple[int, float, list[int]] | None:
        return None
