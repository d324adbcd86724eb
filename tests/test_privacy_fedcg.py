"""Sample-level DP (`dp = 'sample'`) for FedCG (docs/privacy.md): its model (θ_a, the residual
branches' rows V, the GCN weights and λ) and its student train by DP-SGD with per-example gradients
from Opacus (FedCG layers through their registered grad sampler), the balance statistics leave each
client clipped and noised by the `dp-upload` layer, each client's ε every round is Opacus' RDP of
that schedule, a target ε stops training (and the balance queries it would not afford), and bad
combinations are refused in one line before any client is contacted."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from strategies.shared.messages import CLIENT, ClientAddress
from strategies.shared.privacy import DP_UPLOAD, UploadInstructions, clip_scale
from strategies.shared.run_config import RunConfig, default_run_config

RUN = {"method": "fedcg", "dataset": "digits", "model": "cnn", "partition": "domains",
       "domain-family": "styles", "domains-per-client": 2, "num-clients": 4, "num-rounds": 2,
       "local-epochs": 1, "batch-size": 10, "lr": 0.05, "max-samples-per-client": 30,
       "finetune-epochs": 0, "checkpoint-every": 0, "seed": 3, "fraction-train": 1.0,
       "fedcg.domains": 2, "fedcg.teacher-period": 1, "fedcg.adj-warmup": 1,
       "fedcg.bottleneck": 8, "fedcg.sinkhorn-iters": 3, "fedcg.balance-sample": 4,
       "dp": "sample", "dp-delta": 1e-3, "dp-noise-multiplier": 1.1, "dp-max-grad-norm": 1.0,
       "dp-upload-noise-multiplier": 3.0, "dp-upload-clip-norm": 2.0}
ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))  # Opacus' default orders


def _model(residual: bool = True, use_w: bool = True):
    from models import build_model
    from models.fedcg import FedCGModel, FedCGSpec

    torch.manual_seed(0)
    spec = FedCGSpec(num_domains=3, layers="all", gcn_layers=2, bottleneck=4, use_w=use_w,
                     residual=residual, relu=True, gcn_init="scaled")
    model = FedCGModel(build_model("cnn", (1, 12, 12), 5), spec)
    model.set_adjacency(torch.tensor([[0.5, 0.3, 0.2], [0.3, 0.5, 0.2], [0.2, 0.2, 0.6]]))
    return model


@pytest.mark.parametrize("residual,use_w", [(True, True), (True, False), (False, True)])
def test_opacus_per_example_gradients_of_a_fedcg_model_are_autograds_one_example_at_a_time(
        residual, use_w):
    """Every parameter of a FedCG model (θ_a, V, the GCN weights, λ and the backbone's layers):
    Opacus' per-example gradients, FedCG layers through their grad sampler, equal the gradients
    of each example's loss alone, by plain autograd."""
    from opacus import GradSampleModule
    from torch.nn import functional as F

    from client_app.methods.fedcg import DomainInput
    from client_app.methods.fedcg_privacy import recording

    model = _model(residual, use_w)
    x = torch.randn(7, 1, 12, 12)
    y = torch.randint(0, 5, (7,))
    domains = torch.tensor([0, 2, 2, 1, 0, 2, 1])
    expected = []
    for i in range(7):
        model.zero_grad()
        F.cross_entropy(DomainInput(model, x, domains)(torch.tensor([i])), y[i:i + 1]).backward()
        expected.append({n: p.grad.clone() for n, p in model.named_parameters()
                         if p.grad is not None})
    wrapped = GradSampleModule(DomainInput(model, x, domains), batch_first=True,
                               loss_reduction="sum")
    with recording(model):
        F.cross_entropy(wrapped(torch.arange(7)), y, reduction="sum").backward()
    for name, p in model.named_parameters():
        assert p.grad_sample is not None, name
        assert p.grad_sample.shape == (7, *p.shape), name
        want = torch.stack([e[name] if name in e else torch.zeros_like(p) for e in expected])
        torch.testing.assert_close(p.grad_sample, want, atol=1e-6, rtol=1e-4, msg=name)
    wrapped._close()
