"""Cross-cutting client features as layers around a method's handlers.

A feature that several methods opt into travels as one record of its own beside a request's
`config` (the per-client safeguard's `safeguard` record, `client_app/safeguard.py`; client-level
DP's noise on non-model uploads, `dp-upload`, `client_app/private_upload.py`). When a train,
evaluate or query request carries such a record, the ClientApp runs the method's handler inside that
feature's layer (`layered`); the layer's module is imported only then. A local update asks the
active layer where training starts (`Layer.start`), which train samples it uses (`train_index`, and
how they are batched, `whole_split_batches`) and what follows training (`trained`); outside any
layer these change nothing, so a method whose requests carry no layer record runs exactly its own
step.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message
from torch import nn

Handler = Callable[[Message, Context], Message]
# (the method's handler, the request, the node's context) -> the reply
Wrapper = Callable[[Handler, Message, Context], Message]

# Request record name -> the "module:function" wrapper of its layer (imported on the first request
# that carries the record).
LAYERS: dict[str, str] = {"safeguard": "client_app.safeguard:around",
                          "dp-upload": "client_app.private_upload:around"}


class Layer:
    """The hooks a local update calls (`ins`: the request's instructions); these change nothing."""

    def start(self, rt: Any, ins: Any, received: Mapping[str, ArrayRecord]) -> ArrayRecord:
        """The model training starts from, given the received candidates (the method's own
        start first): the first."""
        return received[next(iter(received))]

    def train_index(self, rt: Any, ins: Any) -> torch.Tensor | None:
        """The train-split indices to train on; None: every sample."""
        return None

    def whole_split_batches(self) -> bool:
        """Whether a local update over `train_index` batches the whole train split and leaves the
        other samples out of each batch (`train_epochs`' `keep`), rather than batching the
        indexed part itself: False."""
        return False

    def trained(self, rt: Any, ins: Any, model: nn.Module) -> int:
        """Called once `model` is trained, before it is sent; returns the samples it added to the
        reply's `num-examples` (0)."""
        return 0


_NONE = Layer()
_ACTIVE: ContextVar[Layer] = ContextVar("bouquet_client_layer", default=_NONE)


def active() -> Layer:
    """The layer of the request being handled (a no-op layer outside any)."""
    return _ACTIVE.get()


@contextmanager
def entered(layer: Layer) -> Iterator[Layer]:
    """Make `layer` the active one while the block runs."""
    token = _ACTIVE.set(layer)
    try:
        yield layer
    finally:
        _ACTIVE.reset(token)


def training_tensors(rt: Any, ins: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The (x, y) of the train split a local update trains on (`Layer.train_index`: all of it
    outside any layer)."""
    x, y, _ = part_of_split(rt, active().train_index(rt, ins), whole_split=False)
    return x, y


def training_split(rt: Any, ins: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(x, y, keep) for `train_epochs`: the part a local update trains on (`training_tensors`,
    keep None), or, where the layer batches the whole split (`Layer.whole_split_batches`), the whole
    train split and the mask of that part."""
    layer = active()
    return part_of_split(rt, layer.train_index(rt, ins), layer.whole_split_batches())


def part_of_split(rt: Any, index: torch.Tensor | None, whole_split: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(x, y, keep) of the train split's samples at `index` (None: all of them, keep None): with
    `whole_split`, the whole split and the mask of those samples, for `train_epochs` to batch the
    whole split less the others; otherwise those samples alone, keep None."""
    x, y = rt.tensors("train")
    if index is None:
        return x, y, None
    if whole_split:
        return x, y, index_mask(index, len(y), x.device)
    index = index.to(x.device)
    return x[index], y[index], None


def index_mask(index: torch.Tensor, size: int, device: torch.device) -> torch.Tensor:
    """The bool mask over `size` samples that is True at `index`."""
    keep = torch.zeros(size, dtype=torch.bool, device=device)
    keep[index.to(device)] = True
    return keep


_WRAPPERS: dict[str, Wrapper] = {}


def _wrapper(target: str) -> Wrapper:
    if target not in _WRAPPERS:
        module, _, name = target.partition(":")
        _WRAPPERS[target] = getattr(importlib.import_module(module), name)
    return _WRAPPERS[target]


def layered(handler: Handler) -> Handler:
    """`handler`, run inside the layer whose record the request carries (`LAYERS`), if any."""
    def wrapped(message: Message, context: Context) -> Message:
        if message.has_content():
            for name, target in LAYERS.items():
                if name in message.content:
                    return _wrapper(target)(handler, message, context)
        return handler(message, context)

    wrapped.__name__ = wrapped.__qualname__ = getattr(handler, "__name__", "handler")
    wrapped.__doc__ = handler.__doc__
    return wrapped
