"""Client half of `sfl` / `sfl-star` (message type `train.sfl`; the local step of docs/methods/sfl.md).

θ ← w (the global read-out; `start=personal`: θ ← u_i); `local-epochs` of SGD on the task loss + λ1·||θ − u_i||_2 + λ2·||θ − w||_2
(non-squared L2 over all trainable parameters [C]); reply `model` = v_i. A layer the request turns on (the safeguard,
`client_app.layers`) may start θ elsewhere, e.g. from a mix of the client's own last model with w or u_i. The task loss is the generic
loop's (cross-entropy for classification, masked MAE for traffic regression); the pulls come in through
its `penalty` hook, so they work for either task. `reg-grad=false` reproduces the reference code, whose
pulls are computed on detached copies: they are constants and the effective loss is the task loss.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import Context, Message
from torch import nn

from client_app.layers import active
from client_app.local_update import train_and_reply
from client_app.runtime import client_runtime
from client_app.training import Penalty
from strategies.methods.sfl.settings import SFLTrain
from strategies.shared.messages import CONFIG, GLOBAL, MODEL, PERSONAL


def _distance(params: list[torch.Tensor], anchors: list[torch.Tensor]) -> torch.Tensor:
    """||θ − a||_2 over all tensors together (its gradient at θ = a is taken as 0)."""
    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p - a) for p, a in zip(params, anchors)]))


def sfl_penalty(model: nn.Module, personal: Mapping[str, torch.Tensor],
                global_: Mapping[str, torch.Tensor], lambda_personal: float,
                lambda_global: float, reg_grad: bool = True) -> Penalty:
    """λ1·||θ − u_i||_2 + λ2·||θ − w||_2 over `model`'s trainable parameters (spec §2 (3), local
    step; D = non-squared L2 [C `federated.py` criterion]). `personal` / `global_` are state dicts of
    u_i and w. With `reg_grad` false the value is a constant (no gradient), as in the reference code."""
    names = [name for name, _ in model.named_parameters()]
    missing = [n for n in names if n not in personal or n not in global_]
    if missing:
        raise KeyError(f"the personal/global models lack parameters {missing[:3]}")
    device = next(model.parameters()).device
    anchor_u = [personal[n].detach().to(device, torch.float32).clone() for n in names]
    anchor_w = [global_[n].detach().to(device, torch.float32).clone() for n in names]

    def penalty(m: nn.Module) -> torch.Tensor:
        params = list(m.parameters())
        with torch.set_grad_enabled(reg_grad and torch.is_grad_enabled()):
            value = (lambda_personal * _distance(params, anchor_u)
                     + lambda_global * _distance(params, anchor_w))
        return value if reg_grad else value.detach()

    return penalty


def train(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = SFLTrain.read(message.content[CONFIG])
    first, second = (PERSONAL, GLOBAL) if ins.start == "personal" else (GLOBAL, PERSONAL)
    start = active().start(rt, ins, {first: message.content[first],  # θ ← w
                                     second: message.content[second]})
    model = rt.model(start)
    penalty = sfl_penalty(
        model, message.content[PERSONAL].to_torch_state_dict(),
        message.content[GLOBAL].to_torch_state_dict(), ins.lambda_personal, ins.lambda_global,
        ins.reg_grad,
    )
    return train_and_reply(message, rt, ins, model, MODEL, penalty)
