"""FedCG layers (eq. 4–5 of docs/methods/fedcg.md): domain-agnostic conv + λ·Σ_d w_d·(GCN-produced domain branch d).

A `FedCGConv` wraps one `nn.Conv2d` of any backbone. It holds the agnostic layer θ_a (the wrapped conv),
the D raw branch rows V [D, q] (q = kernel + bias size of the layer), the GCN weights (`W` [q, q] for
the 1-layer form, `W1` [q, b] / `W2` [b, q] for the 2-layer bottleneck) and the learnable scalar
`lambda`. Branch parameters are never used directly: the rows pass through the GCN over the D-node
domain graph A (eq. 5) and row d of V̂, reshaped to the conv's kernel and bias, is θ̂^d.

Eq. 4 is linear in the kernel, so f(x; θ_a) + λ·f(x; θ̂^d) = f(x; θ_a + λ·θ̂^d): with hard (one-hot)
domains every sample goes through ONE conv with its domain's combined kernel (training costs one
conv per present domain on its share of the batch, not D + 1 convs); soft weights (test time) run the
agnostic conv and the D branch convs and mix them per sample.

`FedCGModel` is a `Backbone` whose chosen conv layers are FedCG layers; its forward takes the images
and their domains (long [B] = hard ids, float [B, D] = soft weights) and uses the adjacency set with
`set_adjacency`. `precompute_branches()` computes V̂ once for inference. `DomainClassifier` is the
teacher / student g (§4): Conv3×3 32 → ReLU → Conv3×3 64 → ReLU → pooling (global average: the
paper; 2×2 average or none: §6.10) → Linear D.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from models.backbones import Backbone

LAYER_CHOICES = ("last", "all")
GCN_INITS = ("glorot", "scaled", "zero")
ONE_LAYER_MAX_WEIGHTS = 1 << 24  # q·q above this (64 MiB of float32) needs the 2-layer bottleneck


@dataclass(frozen=True)
class FedCGSpec:
    """The structure of the FedCG layers (a run's `fedcg.*` settings that shape the model)."""

    num_domains: int = 4  # D
    layers: str = "last"  # "last": the last conv layer of the backbone; "all": every conv layer
    gcn_layers: int = 2  # 1: V̂ = σ(A V W); 2: V̂ = σ(A σ(A V W1) W2)
    bottleneck: int = 16  # b of the 2-layer form
    use_w: bool = True  # False: the GCN has no weights (V̂ = σ(A V), or σ(A σ(A V)))
    relu: bool = True  # σ = ReLU (True) or the identity
    residual: bool = True  # False: branch only, z = Σ_d w_d f(x; θ̂^d) (Table 3 "GCN" rows)
    lambda_init: float = 0.1
    # W init: "glorot" (spec §3) or "scaled" (variance-preserving: V̂ starts at V's scale; `gcn_weights`)
    gcn_init: str = "glorot"

    def __post_init__(self) -> None:
        if self.num_domains < 1:
            raise ValueError(f"fedcg.domains must be >= 1, got {self.num_domains}")
        if self.layers not in LAYER_CHOICES:
            raise ValueError(f"fedcg.layers must be one of {LAYER_CHOICES}, got {self.layers!r}")
        if self.gcn_layers not in (1, 2):
            raise ValueError(f"fedcg.gcn-layers must be 1 or 2, got {self.gcn_layers}")
        if self.bottleneck < 1:
            raise ValueError(f"fedcg.bottleneck must be >= 1, got {self.bottleneck}")
        if self.gcn_init not in GCN_INITS:
            raise ValueError(f"fedcg.gcn-init must be one of {GCN_INITS}, got {self.gcn_init!r}")
        if self.gcn_init == "zero" and (self.relu or not self.use_w):
            raise ValueError("fedcg.gcn-init='zero' starts the GCN's last weight at 0, where a ReLU passes no "
                             "gradient: it needs fedcg.relu=false and fedcg.use-w=true")


def _glorot(rows: int, cols: int) -> nn.Parameter:
    weight = torch.empty(rows, cols)
    if weight.device.type != "meta":
        nn.init.xavier_uniform_(weight)
    return nn.Parameter(weight)


def _uniform(rows: int, cols: int, variance: float) -> nn.Parameter:
    weight = torch.empty(rows, cols)
    if weight.device.type != "meta":
        bound = (3.0 * variance) ** 0.5
        nn.init.uniform_(weight, -bound, bound)
    return nn.Parameter(weight)


def gcn_weights(q: int, spec: "FedCGSpec") -> dict[str, nn.Parameter]:
    """The GCN weights of one FedCG layer: `W` [q, q] (1 layer) or `W1` [q, b], `W2` [b, q].

    `glorot` (spec §3): Glorot-uniform. With q ≫ b its expanding W2 has variance 2/(q + b) ≈ 2/q, so
    V̂ starts ~20× smaller than V (cnn, last layer: sd 0.0015 against 0.029) and λ·θ̂ is ~0.5 % of
    θ_a: the branches barely act and learn slowly. `scaled`: variance 1/fan-in, doubled after a ReLU
    (He), so every GCN layer keeps its input's second moment and V̂ starts at V's scale."""
    relu_gain = 2.0 if spec.relu else 1.0
    if spec.gcn_layers == 1:
        if spec.gcn_init == "zero":
            return {"W": nn.Parameter(torch.zeros(q, q))}
        return {"W": _glorot(q, q) if spec.gcn_init == "glorot" else _uniform(q, q, 1.0 / q)}
    b = spec.bottleneck
    if spec.gcn_init == "glorot":
        return {"W1": _glorot(q, b), "W2": _glorot(b, q)}
    if spec.gcn_init == "zero":
        return {"W1": _uniform(q, b, 1.0 / q), "W2": nn.Parameter(torch.zeros(b, q))}
    return {"W1": _uniform(q, b, 1.0 / q), "W2": _uniform(b, q, relu_gain / b)}


class FedCGConv(nn.Module):
    """Eq. 4 around one conv layer: z = f(x; θ_a) + λ·Σ_d w_d·f(x; θ̂^d), θ̂ = rows of GCN(A, V, W)."""

    def __init__(self, conv: nn.Conv2d, spec: FedCGSpec) -> None:
        super().__init__()
        self.agnostic = conv
        self.spec = spec
        self.kernel_shape = tuple(conv.weight.shape)
        self.kernel_size = conv.weight.numel()
        self.has_bias = conv.bias is not None
        q = self.kernel_size + (conv.bias.numel() if self.has_bias else 0)
        self.q = q
        self.V = nn.Parameter(self._initial_rows(conv, spec.num_domains))
        if spec.use_w and spec.gcn_layers == 1:
            if q * q > ONE_LAYER_MAX_WEIGHTS:
                raise ValueError(
                    f"fedcg.gcn-layers=1 needs a full W of q×q = {q}×{q} weights for a layer with q = "
                    f"{q} parameters (limit {ONE_LAYER_MAX_WEIGHTS:,}); use fedcg.gcn-layers=2 (bottleneck) "
                    "or fedcg.use-w=false"
                )
        if spec.use_w:
            for name, weight in gcn_weights(q, spec).items():
                self.register_parameter(name, weight)
        self.register_parameter("lambda", nn.Parameter(torch.full((1,), float(spec.lambda_init))))
        self._adjacency: torch.Tensor | None = None
        self._domains: torch.Tensor | None = None
        self._cached: torch.Tensor | None = None  # V̂ precomputed for inference

    @staticmethod
    def _initial_rows(conv: nn.Conv2d, num_domains: int) -> torch.Tensor:
        """Each branch row independently drawn with the layer's default init (§3 Init)."""
        rows = []
        for _ in range(num_domains):
            fresh = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                              conv.padding, conv.dilation, conv.groups, conv.bias is not None,
                              device=conv.weight.device, dtype=conv.weight.dtype)
            parts = [fresh.weight.detach().reshape(-1)]
            if fresh.bias is not None:
                parts.append(fresh.bias.detach().reshape(-1))
            rows.append(torch.cat(parts))
        return torch.stack(rows)

    @property
    def lambda_(self) -> nn.Parameter:
        return self._parameters["lambda"]

    # --- eq. 5 -------------------------------------------------------------------------------
    def node_features(self, adjacency: torch.Tensor) -> torch.Tensor:
        """V̂ [D, q]: 1-layer σ(A V W), 2-layer σ(A σ(A V W1) W2) (eq. 5); without W the products
        with W are left out; σ = ReLU or the identity."""
        sigma = F.relu if self.spec.relu else (lambda t: t)
        a = adjacency.to(self.V.dtype)
        if self.spec.gcn_layers == 1:
            h = a @ self.V
            return sigma(h @ self.W if self.spec.use_w else h)
        h = a @ self.V
        h = sigma(h @ self.W1 if self.spec.use_w else h)
        h = a @ h
        return sigma(h @ self.W2 if self.spec.use_w else h)

    def branch_parameters(self, v_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows of V̂ reshaped to the branch tensors: kernels [D, *kernel_shape], biases [D, out]."""
        kernels = v_hat[:, : self.kernel_size].reshape(len(v_hat), *self.kernel_shape)
        biases = v_hat[:, self.kernel_size :] if self.has_bias else None
        return kernels, biases

    # --- forward ------------------------------------------------------------------------------
    def bind(self, adjacency: torch.Tensor | None, domains: torch.Tensor | None) -> None:
        self._adjacency, self._domains = adjacency, domains

    def precompute(self, adjacency: torch.Tensor) -> None:
        """Compute V̂ once (no gradient) for inference (the model is then evaluated and dropped);
        logits equal the training path."""
        with torch.no_grad():
            self._cached = self.node_features(adjacency).detach()

    def _conv(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        c = self.agnostic
        return F.conv2d(x, weight, bias, c.stride, c.padding, c.dilation, c.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        domains = self._domains
        if domains is None:
            raise RuntimeError("a FedCG layer needs the samples' domains: call FedCGModel(x, domains)")
        if self._cached is not None:
            v_hat = self._cached
        else:
            if self._adjacency is None:
                raise RuntimeError("a FedCG layer needs the domain adjacency: FedCGModel.set_adjacency")
            v_hat = self.node_features(self._adjacency)
        kernels, biases = self.branch_parameters(v_hat)
        if domains.dtype == torch.long:
            return self._hard(x, domains, kernels, biases)
        return self._soft(x, domains.to(x.dtype), kernels, biases)

    def _combined(self, d: int, kernels: torch.Tensor, biases: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """θ_a + λ·θ̂^d (residual) or θ̂^d alone (branch only)."""
        if not self.spec.residual:
            return kernels[d], None if biases is None else biases[d]
        weight = self.agnostic.weight + self.lambda_ * kernels[d]
        bias = None if biases is None else self.agnostic.bias + self.lambda_ * biases[d]
        return weight, bias

    def _hard(self, x: torch.Tensor, domains: torch.Tensor, kernels: torch.Tensor,
              biases: torch.Tensor | None) -> torch.Tensor:
        """One-hot w: each sample through its domain's combined kernel (eq. 4 by linearity)."""
        present = torch.unique(domains)
        if len(present) == 0:  # an empty batch (DP-SGD's Poisson sampling can draw one)
            return self._conv(x, *self._combined(0, kernels, biases))
        if len(present) == 1:
            return self._conv(x, *self._combined(int(present[0]), kernels, biases))
        order = torch.argsort(domains, stable=True)
        counts = torch.bincount(domains, minlength=len(kernels))
        parts, start = [], 0
        for d in present.tolist():
            count = int(counts[d])
            idx = order[start : start + count]
            parts.append(self._conv(x[idx], *self._combined(d, kernels, biases)))
            start += count
        out = torch.cat(parts)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order), device=order.device)
        return out[inverse]

    def _soft(self, x: torch.Tensor, weights: torch.Tensor, kernels: torch.Tensor,
              biases: torch.Tensor | None) -> torch.Tensor:
        """Soft w [B, D]: Σ_d w_d·f(x; θ̂^d) from the D branch convs at once, plus the agnostic conv."""
        num_domains, out_channels = kernels.shape[0], kernels.shape[1]
        stacked = kernels.reshape(num_domains * out_channels, *kernels.shape[2:])
        bias = None if biases is None else biases.reshape(-1)
        branches = self._conv(x, stacked, bias)
        branches = branches.reshape(len(x), num_domains, out_channels, *branches.shape[2:])
        mixed = torch.einsum("bd,bd...->b...", weights, branches)
        if not self.spec.residual:
            return mixed
        return self.agnostic(x) + self.lambda_ * mixed


class FedCGModel(Backbone):
    """A backbone whose chosen conv layers are `FedCGConv`s; forward(x, domains)."""

    def __init__(self, backbone: Backbone, spec: FedCGSpec) -> None:
        super().__init__(backbone.features, backbone.head, backbone.feature_dim)
        self.spec = spec
        convs = [name for name, m in self.named_modules() if isinstance(m, nn.Conv2d)]
        if not convs:
            raise ValueError("FedCG needs a model with convolutional layers (cnn, leaf-cnn, resnet9, celeba-cnn)")
        chosen = convs[-1:] if spec.layers == "last" else convs
        for name in chosen:
            self.set_submodule(name, FedCGConv(self.get_submodule(name), spec))
        self.layer_names: tuple[str, ...] = tuple(chosen)
        self.register_buffer("adjacency", torch.eye(spec.num_domains), persistent=False)

    def fedcg_layers(self) -> Iterator[FedCGConv]:
        for name in self.layer_names:
            yield self.get_submodule(name)

    def set_adjacency(self, adjacency: torch.Tensor) -> None:
        d = self.spec.num_domains
        if tuple(adjacency.shape) != (d, d):
            raise ValueError(f"the domain adjacency must be [{d}, {d}], got {tuple(adjacency.shape)}")
        self.adjacency = adjacency.to(next(self.parameters()).device, torch.float32)

    def node_rows(self) -> torch.Tensor:
        """The raw branch rows of every FedCG layer side by side, [D, Σ q] (input of eq. 6)."""
        return torch.cat([layer.V.detach() for layer in self.fedcg_layers()], dim=1)

    def precompute_branches(self) -> None:
        """V̂ of every FedCG layer computed once for inference (§2 (5))."""
        for layer in self.fedcg_layers():
            layer.precompute(self.adjacency)

    def forward(self, x: torch.Tensor, domains: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for images x and their domains: long [B] = one-hot ids (training, hard test),
        float [B, D] = soft weights (test: the student's probabilities)."""
        if domains is None:
            raise ValueError("FedCGModel needs the samples' domains: model(x, domains)")
        for layer in self.fedcg_layers():
            layer.bind(self.adjacency, domains)
        try:
            return self.head(self.features(x))
        finally:
            for layer in self.fedcg_layers():
                layer.bind(None, None)


CLASSIFIER_POOLS = ("global", "avg2", "flatten")


class DomainClassifier(nn.Sequential):
    """g: images → D domain logits (the teacher φ and the student ϕ; spec §4, §6.10): Conv3×3 C→32,
    ReLU, Conv3×3 32→64, ReLU, then `pool`: `global` average pool (the paper), `avg2` a 2×2 average
    pool, or `flatten` (no pooling), and a Linear layer to D. `stride` applies to both convs."""

    def __init__(self, input_shape: tuple[int, ...], num_domains: int, stride: int = 1,
                 pool: str = "global") -> None:
        if pool not in CLASSIFIER_POOLS:
            raise ValueError(f"fedcg.classifier-pool must be one of {CLASSIFIER_POOLS}, got {pool!r}")
        channels, height, width = input_shape
        for _ in range(2):  # the spatial size after the two convs (kernel 3, padding 1)
            height, width = (height - 1) // stride + 1, (width - 1) // stride + 1
        if pool == "global":
            pooling, features = [nn.AdaptiveAvgPool2d(1)], 64
        elif pool == "avg2":
            pooling, features = [nn.AdaptiveAvgPool2d(2)], 64 * 4
        else:
            pooling, features = [], 64 * height * width
        super().__init__(
            nn.Conv2d(channels, 32, kernel_size=3, padding=1, stride=stride),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3, padding=1, stride=stride),
            nn.ReLU(),
            *pooling,
            nn.Flatten(),
            nn.Linear(features, num_domains),
        )


def fedcg_layer_sizes(model: str, input_shape: tuple[int, ...], num_classes: int,
                      spec: FedCGSpec) -> dict[str, int]:
    """q of every FedCG layer of `model` under `spec` (built on the meta device: no memory, no init);
    raises ValueError for a layout that cannot be built (e.g. a 1-layer GCN on a large layer)."""
    from models.backbones import build_model

    with torch.device("meta"):
        fedcg = FedCGModel(build_model(model, input_shape, num_classes), spec)
    return {name: layer.q for name, layer in zip(fedcg.layer_names, fedcg.fedcg_layers())}
