"""Client half of FedSKA (docs/methods/fedska.md). Clients are stateless: the slot permutation is
recomputed from (seed, client id), and the head of the global model comes with each gradient query.

- `train.fedska` (step 1): θ ← w̄; `local-epochs` of SGD on L_C + λ_S·L_S (Eq 9–10), where
  L_S = mean_i (1 − cos(f^e(x_i), h^g_i)) and h^g_i is row π^{-1}(i) of the received `graph_target`
  (samples without a slot, or rounds without a target, get no L_S); then the descriptor
  h̄^c = mean_i f^e(x_i) of the trained model (no grad). Reply `model`, `descriptor` {h_c}.
- `query.ska_embed` (step 3): P[l] = f^e_{w̄}(x_{π(l mod N)}) for l < L (eval mode, no grad);
  reply `slot_features` {p: [L, d]}.
- `query.ska_grad` (step 4): l_k = (1/L) Σ_l loss(f^s_{w̄}(h^g[l]), y_{π(l mod N)}) with the received
  head; reply `grad` {g = ∂l_k/∂h^g: [L, d]} and the loss (Eq 8).
- `fedska.schedule = fused`: `train.fedska` carries both queries (`embed-slots` and the `embed_model`
  record; a `head` record for the gradient at its `graph_target`) and its reply their answers, computed
  before training with the same functions (`slot_features`, `slot_loss_gradient`).

A layer the request turns on (the safeguard, `client_app.layers`) may choose the start (e.g. a mix of
the client's own last model with u_k or w̄) and the train samples (outside its held-out slice); the
slot answers and the descriptor still cover the whole train split.

Slots (§3 [D]): π is a seeded permutation of the client's train indices; slot l ↦ sample π(l mod N).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from torch import nn
from torch.nn import functional as F

from client_app.layers import active, index_mask
from client_app.runtime import ClientRuntime, client_runtime, model_record
from client_app.training import seeded_generator, task_loss, train_epochs
from models import build_model
from strategies.methods.fedska.settings import (
    DESCRIPTOR,
    EMBED_MODEL,
    GRAD,
    GRAD_G,
    GRAPH_TARGET,
    H_C,
    H_G,
    HEAD,
    SLOT_ENCODING,
    SLOT_FEATURES,
    SLOT_P,
    FedSKATrain,
    FedSKATrainReply,
    SlotInstructions,
    TRAIN_FEDSKA,
    SlotReply,
)
from strategies.shared.messages import CONFIG, GLOBAL, METRICS, MODEL

SLOT_STREAM = 17  # seeded_generator purpose id of the slot permutation π
EMBED_BATCH = 1024


def slot_permutation(seed: int, client_id: int, num_samples: int) -> torch.Tensor:
    """π: a seeded permutation of the client's train indices, the same in every phase and round."""
    return torch.randperm(num_samples, generator=seeded_generator(seed, client_id, SLOT_STREAM))


def slot_samples(permutation: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Sample index of every slot l < L: π(l mod N) (slots ≥ N repeat samples)."""
    return permutation[torch.arange(num_slots) % len(permutation)]


def slot_targets(encodings: torch.Tensor, permutation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample L_S targets [N, d] from slot encodings [L, d]: sample π(l) gets row l for
    l < min(L, N); the mask [N] says which samples have one (if L < N, the rest do not)."""
    n = len(permutation)
    used = min(len(encodings), n)
    targets = torch.zeros(n, encodings.shape[1], dtype=encodings.dtype)
    has = torch.zeros(n, dtype=torch.bool)
    targets[permutation[:used]] = encodings[:used]
    has[permutation[:used]] = True
    return targets, has


class StructurePull(nn.Module):
    """The model with L_S attached: its input is sample *positions*, so the penalty of a batch knows
    which targets belong to it. `forward(ids)` = f^s(f^e(x_ids)); `penalty(_)` = λ_S·L_S of the last
    batch = λ_S·(1/B) Σ_{i∈batch, i has a target} (1 − cos(f^e(x_i), h^g_i)) (Eq 10; cos(·, 0) = 0)."""

    def __init__(self, model: nn.Module, x: torch.Tensor, targets: torch.Tensor,
                 has_target: torch.Tensor, lambda_s: float) -> None:
        super().__init__()
        self.model = model
        self.x, self.targets, self.has_target = x, targets, has_target
        self.lambda_s = lambda_s
        self._features: torch.Tensor | None = None
        self._ids: torch.Tensor | None = None
        self.total, self.count = 0.0, 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self._ids = ids
        self._features = self.model.features(self.x[ids])
        return self.model.head(self._features)

    def _terms(self) -> torch.Tensor:
        ids = self._ids
        cos = F.cosine_similarity(self._features, self.targets[ids], dim=1, eps=1e-8)
        terms = (1.0 - cos) * self.has_target[ids].to(cos.dtype)
        self.total += float(terms.detach().sum())
        self.count += int(self.has_target[ids].sum())
        return terms

    def penalty(self, _: nn.Module) -> torch.Tensor:
        return self.lambda_s * self._terms().mean()

    def per_example(self) -> torch.Tensor:
        """λ_S·Σ_{i∈batch} L_S,i: the per-example terms DP-SGD adds to each example's loss before
        clipping (client_app/privacy.py), since L_S reads the batch."""
        return self.lambda_s * self._terms().sum()

    @property
    def mean_structure_loss(self) -> float | None:
        return self.total / self.count if self.count else None


class StructurePenalty:
    """`StructurePull`'s penalty as `train_epochs` takes it (`penalty(model)`), with `per_example`
    for DP-SGD."""

    def __init__(self, pull: StructurePull) -> None:
        self.pull = pull

    def __call__(self, model: nn.Module) -> torch.Tensor:
        return self.pull.penalty(model)

    def per_example(self) -> torch.Tensor:
        return self.pull.per_example()


@torch.no_grad()
def features_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """f^e(x) [n, d] in eval mode, in batches."""
    model.eval()
    return torch.cat([model.features(x[i : i + EMBED_BATCH]) for i in range(0, len(x), EMBED_BATCH)])


def _array(tensor: torch.Tensor) -> Array:
    return Array(np.ascontiguousarray(tensor.detach().cpu().numpy().astype(np.float32)))


def slot_features(rt: ClientRuntime, model: nn.Module, seed: int, num_slots: int) -> ArrayRecord:
    """`slot_features` {p: [L, d]}: f^e of `model` on the client's L slots (query.ska_embed)."""
    x, y = rt.tensors("train")
    samples = slot_samples(slot_permutation(seed, rt.client_id, len(y)), num_slots)
    return ArrayRecord({SLOT_P: _array(features_of(model, x[samples.to(rt.device)]))})


def slot_loss_gradient(rt: ClientRuntime, head: nn.Module, encodings: torch.Tensor, seed: int,
                       num_slots: int) -> tuple[ArrayRecord, float]:
    """(`grad` {g = ∂l_k/∂h^g: [L, d]}, l_k) with l_k = (1/L) Σ_l loss(f^s(h^g[l]), y_{π(l mod N)})
    for the received slot encodings h^g [L, d] (query.ska_grad, Eq 8)."""
    if encodings.shape[0] != num_slots:
        raise ValueError(f"the slot encodings have {encodings.shape[0]} rows but num-slots = {num_slots}")
    encodings = encodings.to(rt.device).requires_grad_(True)
    _, y = rt.tensors("train")
    samples = slot_samples(slot_permutation(seed, rt.client_id, len(y)), num_slots)
    loss = task_loss(head(encodings), y[samples.to(rt.device)])
    (grad,) = torch.autograd.grad(loss, encodings)
    return ArrayRecord({GRAD_G: _array(grad)}), float(loss.detach())


def train(message: Message, context: Context) -> Message:
    """`train.fedska` (§3 step 1): Eq 9 from w̄, then the descriptor h̄^c (§2). Under the fused
    schedule, first the answers of the queries it carries (slot features of the received global
    model, the slot-loss gradient at `graph_target` for the received head): computed before
    training, from the received records only, so they are the separate queries' numbers."""
    rt = client_runtime(message, context)
    ins = FedSKATrain.read(message.content[CONFIG])
    content = message.content
    records: dict[str, ArrayRecord] = {}
    split_loss = None
    if ins.embed_slots is not None:
        source = content[EMBED_MODEL] if EMBED_MODEL in content else content[GLOBAL]
        records[SLOT_FEATURES] = slot_features(rt, rt.model(source), ins.seed, ins.embed_slots)
    if HEAD in content:
        if GRAPH_TARGET not in content or ins.num_slots is None:
            raise ValueError(f"a '{HEAD}' record on {TRAIN_FEDSKA} asks for the gradient at "
                             f"'{GRAPH_TARGET}': both it and 'num-slots' are needed")
        target = torch.from_numpy(content[GRAPH_TARGET][H_G].numpy().astype(np.float32))
        records[GRAD], split_loss = slot_loss_gradient(rt, _head(rt, content[HEAD]), target, ins.seed,
                                                       ins.num_slots)
    received = {GLOBAL: content[GLOBAL]}
    if EMBED_MODEL in content:  # start = graph: w̄ travels as the embedding model
        received[EMBED_MODEL] = content[EMBED_MODEL]
    layer = active()
    start = layer.start(rt, ins, received)
    model = rt.model(start)
    x, y = rt.tensors("train")
    permutation = slot_permutation(ins.seed, rt.client_id, len(y))
    index = layer.train_index(rt, ins)  # None: every sample
    ids = torch.arange(len(y), device=rt.device) if index is None else index.to(rt.device)
    # the layer's whole-split batches: every sample's batches, less those outside `index`
    keep = (index_mask(index, len(y), rt.device)
            if index is not None and layer.whole_split_batches() else None)
    generator = seeded_generator(ins.seed, rt.client_id, ins.server_round)
    common = dict(epochs=ins.local_epochs, batch_size=ins.batch_size, lr=ins.lr,
                  momentum=ins.momentum, generator=generator)
    structure_loss = None
    if GRAPH_TARGET in message.content and ins.lambda_s > 0:
        encodings = torch.from_numpy(message.content[GRAPH_TARGET][H_G].numpy().astype(np.float32))
        slots = ins.num_slots if ins.num_slots is not None else len(encodings)
        if tuple(encodings.shape) != (slots, model.feature_dim):
            raise ValueError(f"'{GRAPH_TARGET}' has shape {tuple(encodings.shape)}; expected "
                             f"[num-slots, d] = [{slots}, {model.feature_dim}]")
        targets, has = slot_targets(encodings, permutation)
        pulled = StructurePull(model, x, targets.to(rt.device), has.to(rt.device), ins.lambda_s)
        if keep is None:
            loss = train_epochs(pulled, ids, y[ids], penalty=StructurePenalty(pulled), **common)
        else:
            loss = train_epochs(pulled, torch.arange(len(y), device=rt.device), y,
                                penalty=StructurePenalty(pulled), keep=keep, **common)
        structure_loss = pulled.mean_structure_loss
    elif index is None:  # round 1 (h^g = 0): cos(·, 0) = 0, L_S is a constant
        loss = train_epochs(model, x, y, **common)
    elif keep is None:
        loss = train_epochs(model, x[ids], y[ids], **common)
    else:
        loss = train_epochs(model, x, y, keep=keep, **common)
    added = layer.trained(rt, ins, model)
    descriptor = features_of(model, x).mean(dim=0)
    reply = FedSKATrainReply(num_examples=len(ids) + added, train_loss=loss, structure_loss=structure_loss,
                       split_loss=split_loss, cuda=rt.on_cuda)
    return Message(RecordDict({
        MODEL: model_record(model),
        DESCRIPTOR: ArrayRecord({H_C: _array(descriptor)}),
        **records,
        METRICS: reply.metrics(),
    }), reply_to=message)


def embed(message: Message, context: Context) -> Message:
    """`query.ska_embed` (§3 step 3): per-slot features of the global feature extractor."""
    rt = client_runtime(message, context)
    ins = SlotInstructions.read(message.content[CONFIG])
    features = slot_features(rt, rt.model(message.content[GLOBAL]), ins.seed, ins.num_slots)
    reply = SlotReply(num_examples=len(rt.tensors("train")[1]))
    return Message(RecordDict({SLOT_FEATURES: features, METRICS: reply.metrics()}), reply_to=message)


def _head(rt: ClientRuntime, record: ArrayRecord) -> nn.Module:
    """f^s of the global model from the `head` record (the model built on the meta device)."""
    with torch.device("meta"):
        model = build_model(rt.cfg.model, rt.data.input_shape, rt.data.num_classes)
    model.head.load_state_dict(record.to_torch_state_dict(), assign=True)
    return model.head.to(rt.device)


def slot_gradient(message: Message, context: Context) -> Message:
    """`query.ska_grad` (§3 step 4, Eq 8): G_k = ∂l_k/∂h^g_k for the received encodings."""
    rt = client_runtime(message, context)
    ins = SlotInstructions.read(message.content[CONFIG])
    encodings = torch.from_numpy(message.content[SLOT_ENCODING][H_G].numpy().astype(np.float32))
    grad, loss = slot_loss_gradient(rt, _head(rt, message.content[HEAD]), encodings, ins.seed,
                                    ins.num_slots)
    reply = SlotReply(num_examples=len(rt.tensors("train")[1]), loss=loss)
    return Message(RecordDict({GRAD: grad, METRICS: reply.metrics()}), reply_to=message)
