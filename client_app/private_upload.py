"""Noise on what a client uploads besides its model, under `dp = 'client'` (docs/privacy.md).

A request of a method whose clients send summaries of their data (FLT's centroids of encoded inputs,
FedSKA's descriptor, slot features and slot-loss gradients) carries a `dp-upload` record
(`UploadInstructions`: the reply's records to noise, the noise multiplier σ_u, the clipping norm C_u
and a seed). This layer (`client_app.layers`) runs the method's handler unchanged, then replaces
each named ArrayRecord of the reply by its clipped, noised copy: its floating arrays clipped together
to L2 norm C_u and N(0, (σ_u·C_u)²) added to every value, from a generator seeded by the record's
seed (`strategies.shared.privacy.noised_record`). So the server only ever sees those records noised,
each one Gaussian mechanism on the client's data; the server accounts for them
(`strategies.shared.private_aggregation.AggregateNoise`)."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message

from client_app.layers import Handler
from strategies.shared.privacy import DP_UPLOAD, UploadInstructions, noised_record


def around(handler: Handler, message: Message, context: Context) -> Message:
    """The method's reply with the records `dp-upload` names clipped and noised."""
    ins = UploadInstructions.read(message.content[DP_UPLOAD])
    reply = handler(message, context)
    if reply.has_error():
        return reply
    generator = torch.Generator().manual_seed(ins.seed)
    for name in ins.records:  # in the order the server named them: reproducible draws
        record = reply.content[name] if name in reply.content else None
        if isinstance(record, ArrayRecord):
            reply.content[name] = noised_record(record, ins.clip_norm,
                                                ins.noise_multiplier * ins.clip_norm, generator)
    return reply
