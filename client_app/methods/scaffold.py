"""Client half of `scaffold` (message type `train.scaffold`), SCAFFOLD Algorithm 1, option II:
K local steps y ← y − η·(g(y) − c_i + c) from the global model x, then
c_i⁺ = c_i − c + (x − y)/(K·η); reply y (`model`) and c_i⁺ (`client-control`).

The correction is the gradient of the linear term ⟨θ, c − c_i⟩ added to the loss, so the generic
local loop (`client_app.training.train_epochs`) runs the corrected step (exactly so with momentum 0,
the default; with momentum the correction enters the momentum buffer like the gradient). Control
variates apply to the trainable parameters; a buffer's entry of c_i (BatchNorm statistics) stays as
it came (zero). K counts the optimiser steps: local-epochs × ⌈n / batch-size⌉."""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from torch import nn

from client_app.layers import training_tensors
from client_app.runtime import client_runtime, model_record
from client_app.training import Penalty, seeded_generator, train_epochs
from strategies.methods.scaffold.settings import CLIENT_CONTROL, CONTROL, ScaffoldTrain
from strategies.shared.messages import CONFIG, GLOBAL, METRICS, MODEL, TrainReply


def correction_term(correction: dict[str, torch.Tensor]) -> Penalty:
    """⟨θ, c − c_i⟩ over the trainable parameters: its gradient adds c − c_i to g(θ)."""
    def term(model: nn.Module) -> torch.Tensor:
        return sum((p * correction[name]).sum() for name, p in model.named_parameters())

    return term


def local_steps(examples: int, epochs: int, batch_size: int) -> int:
    """K: the optimiser steps of `epochs` passes over `examples` in batches of `batch_size`."""
    return epochs * math.ceil(examples / batch_size)


def updated_control(client_control: dict[str, np.ndarray], control: dict[str, np.ndarray],
                    start: dict[str, torch.Tensor], trained: dict[str, torch.Tensor],
                    steps: int, lr: float) -> dict[str, np.ndarray]:
    """Option II: c_i⁺ = c_i − c + (x − y)/(K·η) for each trainable parameter (in `start`, x, and
    `trained`, y); every other entry of c_i as it came."""
    out = dict(client_control)
    for name, x in start.items():
        drift = (x - trained[name]).detach().cpu().to(torch.float64).numpy() / (steps * lr)
        value = client_control[name].astype(np.float64) - control[name] + drift
        out[name] = value.astype(client_control[name].dtype)
    return out


def train(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = ScaffoldTrain.read(message.content[CONFIG])
    model = rt.model(message.content[GLOBAL])
    control = {k: a.numpy() for k, a in message.content[CONTROL].items()}
    client_control = {k: a.numpy() for k, a in message.content[CLIENT_CONTROL].items()}
    params = dict(model.named_parameters())
    start = {name: p.detach().clone() for name, p in params.items()}
    correction = {name: torch.from_numpy(np.asarray(control[name] - client_control[name]))
                  .to(device=p.device, dtype=p.dtype) for name, p in params.items()}
    term = correction_term(correction) if any(bool(t.any()) for t in correction.values()) else None
    x, y = training_tensors(rt, ins)
    loss = train_epochs(
        model, x, y, epochs=ins.local_epochs, batch_size=ins.batch_size, lr=ins.lr,
        momentum=ins.momentum, generator=seeded_generator(ins.seed, rt.client_id, ins.server_round),
        penalty=term,
    )
    steps = local_steps(len(y), ins.local_epochs, ins.batch_size)
    updated = updated_control(client_control, control, start, dict(model.named_parameters()),
                              steps, ins.lr)
    reply = TrainReply(num_examples=len(y), train_loss=loss, cuda=rt.on_cuda)
    return Message(RecordDict({
        MODEL: model_record(model),
        CLIENT_CONTROL: ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in updated.items()}),
        METRICS: reply.metrics(),
    }), reply_to=message)
