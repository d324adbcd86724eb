"""FedCG's local training under DP-SGD (`dp = 'sample'`, docs/privacy.md): per-example gradients of
a FedCG layer for Opacus.

DP-SGD (`client_app.privacy.dp_train_epochs`) takes each example's gradient from Opacus'
`GradSampleModule`, which computes it layer by layer from the layer's input and output gradient.
A FedCG layer (`models.fedcg.FedCGConv`) is not one of Opacus' layers: with one-hot domains each
sample i goes through one conv whose kernel is K_{d_i} = θ_a + λ·θ̂^{d_i} (θ̂ = the rows of
GCN(A, V, W)), and its parameters θ_a, λ, V and the GCN weights enter only through K. Its grad
sampler, registered with Opacus (`opacus.grad_sample.register_grad_sampler`), composes:

- Opacus' own conv grad sampler (`compute_conv_grad_sample`) on the layer's input and output
  gradient, with θ_a's geometry: each sample's gradient g_i with respect to the kernel and bias it
  went through;
- the chain rule through K: θ_a gets g_i, λ gets ⟨g_i, θ̂^{d_i}⟩, and the rows V̂ get λ·g_i in row
  d_i (branch only, `fedcg.residual = false`: g_i, and θ_a and λ nothing);
- V and the GCN weights: each sample's vector-Jacobian product of V̂ = GCN(A, V, W) at that
  cotangent, by `torch.func` (`vjp`, vmapped over the batch).

The batch's domains and A are kept on each FedCG layer by a forward pre-hook while the model trains
(`recording`), for the backward pass (the model unbinds them after each forward). Imported only when a
FedCG train request carries a `privacy` record.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from opacus.grad_sample.conv import compute_conv_grad_sample
from opacus.grad_sample.utils import register_grad_sampler
from torch import nn
from torch.func import functional_call, vjp, vmap

from models.fedcg import FedCGConv, FedCGModel

GCN_PARAMETERS = ("V", "W", "W1", "W2")  # the parameters V̂ = GCN(A, V, W) is computed from


class _BranchRows(nn.Module):
    """V̂ of one FedCG layer as a module's forward (so `functional_call` can swap its parameters)."""

    def __init__(self, layer: FedCGConv) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, adjacency: torch.Tensor) -> torch.Tensor:
        return self.layer.node_features(adjacency)


@register_grad_sampler(FedCGConv)
def fedcg_conv_grad_sample(layer: FedCGConv, activations: list[torch.Tensor],
                           backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Each sample's gradient of every trainable parameter of `layer` (module doc)."""
    domains = getattr(layer, "_dp_domains", None)
    adjacency = getattr(layer, "_dp_adjacency", None)
    if domains is None or adjacency is None:
        raise RuntimeError("a FedCG layer's per-example gradients need the batch's domains and A: "
                           "train it inside client_app.methods.fedcg_privacy.recording")
    if domains.dtype != torch.long:
        raise ValueError("DP-SGD trains a FedCG layer with one-hot (hard) domains only")
    if len(domains) == 0:  # an empty Poisson batch: zero gradients (Opacus' empty-batch form)
        return {p: torch.zeros_like(p).unsqueeze(0) for p in layer.parameters() if p.requires_grad}
    plain = compute_conv_grad_sample(layer.agnostic, activations, backprops)
    kernel = plain[layer.agnostic.weight]  # [B, *kernel shape]: ∂ℓ_i/∂K_{d_i}
    batch = len(kernel)
    parts = [kernel.reshape(batch, -1)]
    if layer.has_bias:
        parts.append(plain[layer.agnostic.bias])
    flat = torch.cat(parts, dim=1)  # [B, q]: each sample's gradient of its branch row
    names = [name for name in GCN_PARAMETERS if name in layer._parameters]
    rows = _BranchRows(layer)

    def gcn(*values: torch.Tensor) -> torch.Tensor:
        return functional_call(rows, {f"layer.{n}": v for n, v in zip(names, values)}, (adjacency,))

    with torch.enable_grad():
        v_hat, pullback = vjp(gcn, *(layer._parameters[n].detach() for n in names))
    residual = layer.spec.residual
    scale = layer.lambda_.detach().to(flat.dtype) if residual else 1.0
    cotangent = flat.new_zeros(batch, *v_hat.shape)
    cotangent[torch.arange(batch, device=flat.device), domains] = flat * scale
    grads: dict[nn.Parameter, torch.Tensor] = dict(
        zip((layer._parameters[n] for n in names), vmap(pullback)(cotangent)))
    if residual:
        grads[layer.agnostic.weight] = kernel
        if layer.has_bias:
            grads[layer.agnostic.bias] = plain[layer.agnostic.bias]
        grads[layer.lambda_] = (flat * v_hat.detach()[domains]).sum(dim=1, keepdim=True)
    else:  # θ_a and λ take no part in the branch-only layer
        for p in (layer.agnostic.weight, layer.agnostic.bias, layer.lambda_):
            if p is not None:
                grads[p] = p.new_zeros(batch, *p.shape)
    return {p: g for p, g in grads.items() if p.requires_grad}


def _record(layer: FedCGConv, inputs: tuple[torch.Tensor, ...]) -> None:
    layer._dp_domains, layer._dp_adjacency = layer._domains, layer._adjacency


@contextmanager
def recording(model: FedCGModel) -> Iterator[FedCGModel]:
    """While the block runs, every FedCG layer of `model` keeps its last batch's domains and A for
    the backward pass (`fedcg_conv_grad_sample`)."""
    layers = list(model.fedcg_layers())
    handles = [layer.register_forward_pre_hook(_record) for layer in layers]
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()
        for layer in layers:
            layer._dp_domains = layer._dp_adjacency = None
