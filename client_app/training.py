"""The generic local loop: minibatch SGD on task loss + a method's extra terms, and evaluation.

The task loss follows the data: integer targets → classification (cross-entropy); floating-point
targets → regression (traffic forecasting): masked MAE on z-scored targets, NaN targets (missing
readings, stored as 0 in METR-LA) skipped, as Graph WaveNet trains with a masked MAE. Data stays as
tensors on the device; batches are drawn from a seeded permutation, so a client's training is
reproducible from (seed, client id, round).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.sgd import sgd

Penalty = Callable[[nn.Module], torch.Tensor]
TASKS = ("classification", "regression")


def task_of(y: torch.Tensor) -> str:
    """The task a target tensor implies: floating point → `regression`, integer → `classification`."""
    return "regression" if y.is_floating_point() else "classification"


def masked_mae(prediction: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """|prediction − target| over the entries whose target is not NaN (`mean` over them, or `sum`;
    `sample`: the mean over each sample's valid entries, one value per sample).

    A batch without any valid target gives 0 (with a gradient path), not NaN.
    """
    valid = ~torch.isnan(target)
    error = torch.where(valid, (prediction - torch.nan_to_num(target)).abs(), torch.zeros_like(prediction))
    if reduction == "sum":
        return error.sum()
    if reduction == "sample":
        return error.flatten(1).sum(1) / valid.flatten(1).sum(1).clamp_min(1)
    return error.sum() / valid.sum().clamp_min(1)


def task_loss(output: torch.Tensor, target: torch.Tensor, task: str | None = None) -> torch.Tensor:
    """Mean loss of a batch: cross-entropy (classification) or masked MAE (regression).

    `task` None infers it from the target dtype (`task_of`).
    """
    task = task or task_of(target)
    if task == "classification":
        return F.cross_entropy(output, target)
    if task == "regression":
        return masked_mae(output, target)
    raise ValueError(f"unknown task {task!r}; allowed: {', '.join(TASKS)}")


def seeded_generator_seed(*parts: int) -> int:
    """One 63-bit seed mixed from integers such as (seed, client id, round, purpose)."""
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + int(part)) % (2**63 - 1)
    return seed


def seeded_generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded from integers such as (seed, client id, round, purpose)."""
    return torch.Generator().manual_seed(seeded_generator_seed(*parts))


def proximal_penalty(anchor: nn.Module, weight: float) -> Penalty:
    """(weight/2)·||θ − θ_anchor||² over the trainable parameters (FedProx μ, Ditto λ)."""
    fixed = [p.detach().clone() for p in anchor.parameters()]

    def penalty(model: nn.Module) -> torch.Tensor:
        return 0.5 * weight * sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), fixed))

    return penalty


class SGD:
    """`torch.optim.SGD` (no weight decay, dampening or Nesterov) as a thin wrapper around
    `torch.optim.sgd.sgd`, the documented functional form its `step()` calls with the same arguments.

    `torch.optim.Optimizer.step()` / `zero_grad()` import `torch._dynamo` on first use (~0.9 s and ~870
    modules), which a deployed client pays on every message since each message runs in a fresh
    process; the functional form does not. The updates are bit-identical (tests/test_lean_client.py).
    """

    def __init__(self, params, lr: float, momentum: float = 0.0) -> None:
        self.params = list(params)
        self.lr = lr
        self.momentum = momentum
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        active = [i for i, p in enumerate(self.params) if p.grad is not None]
        buffers = [self.buffers[i] for i in active]
        sgd([self.params[i] for i in active], [self.params[i].grad for i in active], buffers,
            weight_decay=0.0, momentum=self.momentum, lr=self.lr, dampening=0.0, nesterov=False,
            maximize=False)
        if self.momentum:
            for i, buffer in zip(active, buffers):
                self.buffers[i] = buffer


# The local training a cross-cutting layer puts in place of `train_epochs`' loop while it handles a
# message (e.g. DP-SGD, client_app/privacy.py), called with `train_epochs`' arguments; None: the loop.
LOCAL_TRAINER: ContextVar[Callable[..., float] | None] = ContextVar("bouquet_local_trainer",
                                                                    default=None)


def train_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    generator: torch.Generator,
    penalty: Penalty | None = None,
    task: str | None = None,
    keep: torch.Tensor | None = None,
) -> float:
    """Run `epochs` passes of SGD on the task loss (+ penalty); return the mean task loss.

    The task loss is cross-entropy or masked MAE (`task_loss`; `task` None = from the target dtype).
    With `keep` (a bool mask over the samples), each epoch makes the batches it would make over every
    sample and trains on them less the samples outside `keep` (a batch left empty is skipped): the
    left-out samples cost their share of each step, not steps. A layer's `LOCAL_TRAINER`, when one
    is set, trains instead (on the kept samples).
    """
    override = LOCAL_TRAINER.get()
    if override is not None:
        if keep is not None:
            x, y = x[keep.to(x.device)], y[keep.to(y.device)]
        return override(model, x, y, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                        generator=generator, penalty=penalty, task=task)
    task = task or task_of(y)
    model.train()
    optimizer = SGD(model.parameters(), lr=lr, momentum=momentum)
    total, count = 0.0, 0
    kept = None if keep is None else keep.to(x.device)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator).to(x.device)
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            if kept is not None:
                idx = idx[kept[idx]]
                if len(idx) == 0:
                    continue
            loss = task_loss(model(x[idx]), y[idx], task)
            objective = loss + penalty(model) if penalty is not None else loss
            optimizer.zero_grad(set_to_none=True)
            objective.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
    return total / max(count, 1)


@dataclass(frozen=True)
class ForecastErrors:
    """Errors of de-normalised forecasts [n, horizon]: MAE, MAPE (a fraction) and RMSE over every
    horizon step, and the same at the last step (`*_h12`: 60 minutes ahead for 5-minute data)."""

    mae: float
    mape: float
    rmse: float
    mae_h12: float
    mape_h12: float
    rmse_h12: float


def _masked_errors(prediction: torch.Tensor, target: torch.Tensor) -> tuple[float, float, float]:
    """(MAE, MAPE, RMSE) over entries with a finite, non-zero target; NaN when there are none."""
    valid = torch.isfinite(target) & (target != 0)
    count = int(valid.sum())
    if count == 0:
        return float("nan"), float("nan"), float("nan")
    error = (prediction - target)[valid].double()
    mae = float(error.abs().mean())
    mape = float((error.abs() / target[valid].double().abs()).mean())
    rmse = float(error.square().mean().sqrt())
    return mae, mape, rmse


def forecast_errors(prediction: torch.Tensor, target: torch.Tensor) -> ForecastErrors:
    """Masked MAE / MAPE / RMSE (Graph WaveNet's metrics, null value 0) of forecasts in data units.

    Entries whose target is 0 or NaN (a missing reading) are skipped by all three metrics.
    """
    if prediction.shape != target.shape or prediction.dim() != 2:
        raise ValueError(
            "prediction and target must both be [n, horizon]; "
            f"got {tuple(prediction.shape)} and {tuple(target.shape)}"
        )
    overall = _masked_errors(prediction, target)
    last = _masked_errors(prediction[:, -1:], target[:, -1:])
    return ForecastErrors(*overall, *last)


@dataclass(frozen=True)
class Evaluation:
    """Test result of one model: mean task loss, correct top-1 predictions (0 for regression), and
    for regression the forecast errors in data units (`errors`; None for classification)."""

    loss: float
    correct: int
    num_examples: int
    errors: ForecastErrors | None = None

    @property
    def accuracy(self) -> float:
        return self.correct / self.num_examples if self.num_examples else 0.0


def forward_batches(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(output, target) of `model` in eval mode over (x, y) in batches, without gradients (so the
    batches can be larger than training's: at least 256)."""
    model.eval()
    step = max(batch_size, 256)
    for start in range(0, len(y), step):
        with torch.no_grad():  # left before yielding: the caller's grad mode stays its own
            output = model(x[start : start + step])
        yield output, y[start : start + step]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    scale: tuple[float, float] | None = None,
    task: str | None = None,
) -> Evaluation:
    """Mean task loss on (x, y) and, for classification, the number of correct top-1 predictions.

    Regression: the loss is the masked MAE on z-scored targets, and with `scale` = (mean, std) the
    forecasts and targets are de-normalised (`v·std + mean`) for `forecast_errors`.
    """
    task = task or task_of(y)
    loss, correct = 0.0, 0
    outputs = []
    for output, target in forward_batches(model, x, y, batch_size):
        if task == "regression":
            loss += float(masked_mae(output, target, reduction="sum"))
            outputs.append(output)
        else:
            loss += float(F.cross_entropy(output, target, reduction="sum"))
            correct += int((output.argmax(dim=1) == target).sum())
    if task != "regression":
        return Evaluation(loss / max(len(y), 1), correct, len(y))
    valid = int((~torch.isnan(y)).sum())
    errors = None
    if scale is not None and outputs:
        mean, std = scale
        errors = forecast_errors(torch.cat(outputs) * std + mean, y * std + mean)
    return Evaluation(loss / max(valid, 1), 0, len(y), errors)
