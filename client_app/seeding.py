"""Every random draw a client makes comes from (run seed, client, round, message type).

A handler's own draws (batch orders, held-out slices) use generators it seeds itself
(`client_app.training.seeded_generator`). Draws that PyTorch takes from the process's global generator
(dropout masks, above all) would otherwise depend on which messages this process ran before: under
`flwr run` a simulated SuperNode's worker serves a varying set of clients in a varying order, and a
deployed SuperNode runs each message in a fresh process. This ClientApp mod seeds the global
generators (torch, NumPy, `random`) for each message from the run seed, the logical client, the
round the server stamped on the message (`group_id`, `server_app.clients.ClientGrid`) and the message
type, and restores the generators' previous state afterwards, so a server running in the same process
(the in-process harness) draws exactly what it draws in its own process.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

import numpy as np
import torch
from flwr.app import Context, Message

from client_app.training import seeded_generator_seed
from strategies.shared.messages import CLIENT, ClientAddress

GLOBAL_STREAM = 11  # keeps these seeds apart from the handlers' own (seeded_generator) streams


def message_seed(message: Message, run_seed: int) -> int:
    """The seed of one message's global draws: (run seed, client, round, message type)."""
    content = message.content if message.has_content() else None
    client = (ClientAddress.read(content[CLIENT]).client_id
              if content is not None and CLIENT in content else -1)
    group = message.metadata.group_id or "0"
    server_round = int(group) if group.isdigit() else zlib.crc32(group.encode())
    return global_seed(run_seed, client, server_round, message.metadata.message_type)


def global_seed(run_seed: int, client: int, server_round: int, message_type: str) -> int:
    """The seed of the global draws of `client`'s message of `message_type` in `server_round`
    (client −1: a message addressed to no logical client)."""
    kind = zlib.crc32(message_type.encode())
    return seeded_generator_seed(run_seed, client + 1, server_round, kind, GLOBAL_STREAM)


def seed_torch(seed: int) -> None:
    """`torch.manual_seed(seed)`, without its accelerator half where this process has no accelerator.

    `torch.manual_seed` also seeds the CUDA / XPU / MTIA generators; before such a device is
    initialised it queues each seed with a formatted traceback of the caller's stack
    (`torch.cuda._lazy_call`), applied only if the device is initialised later: 0.35 ms per call 10
    frames deep, 0.7 ms 40 frames deep (a ClientApp's handler runs deeper), several percent of a
    small model's round. Where no accelerator (nor a registered custom device) is available none can be
    initialised in this process, so the queued seeds could never apply: seeding the CPU generator
    alone leaves every draw the same. Elsewhere it is `torch.manual_seed` itself.
    """
    if torch.accelerator.is_available() or hasattr(torch, torch._C._get_privateuse1_backend_name()):
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def seeded_draws(message: Message, context: Context,
                 call_next: Callable[[Message, Context], Message]) -> Message:
    """ClientApp mod: run the handler with the global generators seeded by `message_seed`, then put
    back the state they had."""
    run_seed = int(context.run_config.get("seed", 0))
    seed = message_seed(message, run_seed)
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        seed_torch(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        try:
            return call_next(message, context)
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)
