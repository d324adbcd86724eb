"""Sample-level differential privacy on the client: DP-SGD in place of the generic local loop.

`private_training` is a ClientApp mod (applied to every message, like `client_app.seeding`): when a
train request carries a `privacy` record (`strategies.shared.privacy.PrivacyInstructions`, the server's
`server_app/privacy.py` adds it under `dp = 'sample'`), every `client_app.training.train_epochs` the
method's handler runs becomes `dp_train_epochs` (through `training.LOCAL_TRAINER`), and the reply gets
a `privacy` record (`PrivacyReport`) with the steps taken and the client's ε. Outside such a request
nothing changes.

`dp_train_epochs` is DP-SGD (Abadi et al., 2016) by Opacus: Poisson sampling of the train split at
rate q = 1 / ⌈n / batch-size⌉ for ⌈n / batch-size⌉ steps per epoch (as Opacus' DP data loader), each
example's gradient clipped to `max-grad-norm` (per-example gradients from Opacus' `GradSampleModule`),
Gaussian noise of std σ·C added to their sum (Opacus' `DPOptimizer`), divided by the expected batch
size. A method's penalty that does not read the data (a proximal pull): its gradient is added
after the noise. One that does (FedSKA's structure pull) exposes `per_example`, the sum of the
last batch's per-example penalty terms: it joins each example's loss before clipping. A method
phase that trains outside `train_epochs` calls the trainer itself: FLT's autoencoder phase
(`train.flt_ae`) with task 'reconstruction' (y = x, each example's mean squared error) and its noised
gradient stepped by Adam (`optimizer='adam'`). The sampling and the noise come from generators seeded by the handler's own (seed, client,
round) generator, so a run is reproducible. With a target ε, the client takes only the steps that
keep its ε (its ledger, the request's, plus this message's) within it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from flwr.app import Context, Message
from torch import nn
from torch.nn import functional as F

from client_app.training import LOCAL_TRAINER, Penalty, masked_mae, task_of
from strategies.shared.messages import CLIENT, ClientAddress
from strategies.shared.privacy import (PRIVACY, Entry, PrivacyInstructions, PrivacyReport,
                                       batch_norm_message, epsilon, steps_within)


class PrivacyError(ValueError):
    """DP-SGD cannot run as configured here (a BatchNorm layer, δ not below 1/n)."""


def schedule(n: int, batch_size: int, epochs: int) -> tuple[float, int]:
    """(sampling rate, steps) of DP-SGD over n examples: ⌈n / batch-size⌉ steps per epoch at rate
    1 / ⌈n / batch-size⌉ (Opacus' DP data loader)."""
    per_epoch = max(math.ceil(n / batch_size), 1)
    return 1.0 / per_epoch, epochs * per_epoch


def check_model(model: nn.Module) -> None:
    """Raise `PrivacyError` naming the first layer DP-SGD cannot handle (BatchNorm)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm):
            raise PrivacyError(batch_norm_message(type(model).__name__, name,
                                                  type(module).__name__))


def _sample_losses(output: torch.Tensor, target: torch.Tensor, task: str) -> torch.Tensor:
    """The sum of the per-example task losses of a batch (the per-example gradients' loss)."""
    if task == "classification":
        return F.cross_entropy(output, target, reduction="sum")
    if task == "reconstruction":  # an autoencoder's (FLT's): each example's mean squared error
        return F.mse_loss(output, target, reduction="none").flatten(1).mean(1).sum()
    return masked_mae(output, target, reduction="sample").sum()


def dp_train_epochs(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int, lr: float,
    momentum: float, generator: torch.Generator, penalty: Penalty | None = None,
    task: str | None = None, ins: PrivacyInstructions, prior: list[Entry], spent: list[Entry],
    planned_steps: list[int] | None = None, optimizer: str = "sgd",
) -> float:
    """DP-SGD in place of `train_epochs` (module doc), its noised gradient stepped by SGD or, with
    `optimizer` 'adam', by Adam (FLT's autoencoder, task 'reconstruction' with y = x); appends (σ, q, steps taken) to `spent` and
    the steps it would have taken without a target to `planned_steps`; returns the mean task loss
    of the examples it trained on."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    n = len(y)
    if n == 0:
        return 0.0
    if ins.delta * n >= 1.0:
        raise PrivacyError(f"dp-delta = {ins.delta:g} must be below 1/n = {1.0 / n:.3g} for a client "
                           f"with {n} train samples; lower dp-delta")
    check_model(model)
    task = task or task_of(y)
    rate, planned = schedule(n, batch_size, epochs)
    steps = steps_within([*prior, *spent], ins.noise_multiplier, rate, planned, ins.delta,
                         ins.target_epsilon)
    spent.append((ins.noise_multiplier, rate, steps))
    if planned_steps is not None:
        planned_steps.append(planned)
    if steps == 0:
        return 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    sampling = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
    noise = torch.Generator(device=device).manual_seed(
        int(torch.randint(2**62, (1,), generator=generator)))
    model.train()
    wrapped = GradSampleModule(model, batch_first=True, loss_reduction="sum")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer = {optimizer!r}: DP-SGD steps with 'sgd' or 'adam'")
    inner = (torch.optim.Adam(params, lr=lr) if optimizer == "adam"
             else torch.optim.SGD(params, lr=lr, momentum=momentum))
    optimizer = DPOptimizer(inner,
                            noise_multiplier=ins.noise_multiplier, max_grad_norm=ins.max_grad_norm,
                            expected_batch_size=max(round(rate * n), 1), loss_reduction="mean",
                            generator=noise)
    total, count = 0.0, 0
    try:
        for _ in range(steps):
            index = (torch.rand(n, generator=sampling) < rate).nonzero().squeeze(1).to(x.device)
            optimizer.zero_grad(set_to_none=True)
            loss = _sample_losses(wrapped(x[index]), y[index], task)
            per_example = getattr(penalty, "per_example", None)  # a penalty that reads the batch
            (loss + per_example() if per_example is not None else loss).backward()
            optimizer.pre_step()  # clip per example, add noise, average: p.grad
            pull = penalty(model) if penalty is not None and per_example is None else None
            if pull is not None and pull.requires_grad:  # data-independent: its exact gradient,
                # after the noise (a constant penalty, e.g. SFL's with reg-grad off, has none)
                for p, g in zip(params, torch.autograd.grad(pull, params, allow_unused=True)):
                    if g is not None:
                        p.grad = p.grad + g
            optimizer.original_optimizer.step()
            total += float(loss.detach())
            count += len(index)
    finally:
        optimizer.zero_grad(set_to_none=True)
        wrapped._close()  # hooks and per-example gradients removed: `model` is plain again
    return total / max(count, 1)


def private_training(message: Message, context: Context,
                     call_next: Callable[[Message, Context], Message]) -> Message:
    """ClientApp mod: a train request with a `privacy` record is handled with DP-SGD as every local
    training (module doc) and answered with the client's `privacy` report; any other message runs
    the plain loop."""
    request = (message.content if message.has_content()
               and message.metadata.message_type.split(".")[0] == "train" else None)
    if request is None or PRIVACY not in request:
        token = LOCAL_TRAINER.set(None)  # e.g. a fused request's evaluation: no DP-SGD there
        try:
            return call_next(message, context)
        finally:
            LOCAL_TRAINER.reset(token)
    ins = PrivacyInstructions.read(request[PRIVACY])
    client = ClientAddress.read(request[CLIENT]).client_id if CLIENT in request else -1
    prior: list[Entry] = ins.history(client)
    spent: list[Entry] = []
    planned: list[int] = []
    token = LOCAL_TRAINER.set(partial(dp_train_epochs, ins=ins, prior=prior, spent=spent,
                                      planned_steps=planned))
    try:
        reply = call_next(message, context)
    finally:
        LOCAL_TRAINER.reset(token)
    if reply.has_error():
        return reply
    if not spent:
        raise PrivacyError(f"dp = 'sample': the '{message.metadata.message_type}' handler trained "
                           "without the generic local loop, so DP-SGD did not run; this method does "
                           "not support dp = 'sample'")
    report = PrivacyReport(noise=[e[0] for e in spent], rates=[e[1] for e in spent],
                           steps=[e[2] for e in spent], planned_steps=sum(planned),
                           epsilon=epsilon([*prior, *spent], ins.delta))
    reply.content[PRIVACY] = report.config()
    return reply

