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


def instruction_runner(method: str, strategy: Any = None, weight: float | None = None,
                       **overrides: Any) -> Any:
    """A FederationRunner holding only what its instruction builders (`train_config`,
    `evaluate_config`, `safeguard_fields`, `pool_safeguard`, `pool_start`) read: the run config of
    `method` with `overrides` (run-config keys), the strategy, the federation's safeguard weight and
    its start (`StartEvidence` of the run config's `safeguard-start`)."""
    from server_app.runner import FederationRunner
    from strategies.shared.evidence import StartEvidence
    from strategies.shared.run_config import RunConfig, default_run_config

    runner = FederationRunner.__new__(FederationRunner)
    runner.cfg = RunConfig.from_flower({**default_run_config(), "method": method, **overrides})
    runner.strategy, runner.safeguard_weight = strategy, weight
    runner.safeguard_start = StartEvidence(runner.cfg.safeguard_start)
    return runner


def consensus_strategy() -> Any:
    """A personalized strategy that hands every client the same model (`hands_out_consensus`)."""
    return _Consensus.__new__(_Consensus)



class _Consensus(PersonalizedStrategy):
    def hands_out_consensus(self) -> bool:
        return True
