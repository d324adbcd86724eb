"""The Bouquet ClientApp: routes each message kind to the method's client module.

`train` and `evaluate` are the generic handlers every method may use; the message types only one
method sends (`train.sfl`, `query.flt_embed`, ...) are routed as its registry entry declares
(`strategies.shared.registry.Method.client`), imported on first use. Every train handler also accepts a fused
message (`strategies.shared.fusion`): the evaluation it carries is routed to its own evaluate handler first,
then the training runs, and one reply holds both. A method's train, evaluate and query handlers run
inside the layer of a cross-cutting feature whose record the request carries
(`client_app.layers.layered`, e.g. the safeguard, client-level DP's noise on non-model uploads); a
request without one reaches the method's handler directly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_app import evaluation, identify, secagg, watchdog
from client_app.layers import layered
from client_app.privacy import private_training
from client_app.seeding import seeded_draws
from client_app.methods import fedavg
from strategies.shared.fusion import fuse_reply, is_fused, split_request
from strategies.shared.registry import METHODS, ClientHandler, Method

Handler = Callable[[Message, Context], Message]

# global draws seeded per message (client_app/seeding.py); DP-SGD where a train request asks for it
# (client_app/privacy.py); Flower's SecAgg+ where a request carries a `secagg` record
# (client_app/secagg.py)
app = ClientApp(mods=[seeded_draws, private_training, secagg.secure_aggregation])
watchdog.start()  # a deployed ClientApp process exits once its SuperNode/executor is gone


def with_evaluation(train: Handler) -> Handler:
    """`train`, preceded by the evaluation a fused message carries (run through `app`'s routing)."""
    def handler(message: Message, context: Context) -> Message:
        if not is_fused(message):
            return train(message, context)
        train_part, evaluation_part = split_request(message)
        evaluated = app(evaluation_part, context)
        if evaluated.has_error():
            raise RuntimeError(f"evaluation failed: {evaluated.error.reason}")
        return fuse_reply(message, train(train_part, context), evaluated)

    handler.__name__ = handler.__qualname__ = getattr(train, "__name__", "train")
    handler.__doc__ = train.__doc__
    return handler


def resolve(target: ClientHandler) -> Handler:
    """A handler given as a callable, or as "module:function" (imported on the first message)."""
    if callable(target):
        return target
    module, _, name = target.partition(":")
    cache: list[Handler] = []

    def handler(message: Message, context: Context) -> Message:
        if not cache:
            cache.append(getattr(importlib.import_module(module), name))
        return cache[0](message, context)

    handler.__name__ = handler.__qualname__ = name
    return handler


_ROUTES = {"train": app.train, "evaluate": app.evaluate, "query": app.query}
_INSTALLED: dict[str, ClientHandler] = {}  # message type → the handler it is routed to


def install(method: Method) -> None:
    """Route the message types of `method` (its registry entry's `client`) to its handlers; called
    for every registered method at import, and for a method registered later."""
    for message_type, target in method.client.items():
        kind, _, action = message_type.partition(".")
        if kind not in _ROUTES or not action:
            raise ValueError(f"method {method.name!r}: message type {message_type!r} must be "
                             "'train.<action>', 'evaluate.<action>' or 'query.<action>'")
        if message_type in _INSTALLED:  # methods may share a message type (sfl, sfl-star)
            if _INSTALLED[message_type] != target:
                raise ValueError(f"method {method.name!r}: message type {message_type!r} is already "
                                 f"routed to {_INSTALLED[message_type]!r}")
            continue
        _INSTALLED[message_type] = target
        handler = resolve(target)
        _ROUTES[kind](action)(with_evaluation(layered(handler)) if kind == "train"
                              else layered(handler))


app.query("identify")(identify.identify)
app.query("secagg")(secagg.unmasked_request)  # answered by the secure_aggregation mod
app.train()(with_evaluation(layered(fedavg.train)))
app.evaluate()(layered(evaluation.evaluate))
for _method in METHODS.values():
    install(_method)
