"""A test wrapper around the client's `dp-upload` layer that records what it noised."""
from __future__ import annotations

import math

import numpy as np
from flwr.app import ArrayRecord

from strategies.shared.messages import CLIENT, ClientAddress
from strategies.shared.privacy import DP_UPLOAD, UploadInstructions, clip_scale


def counting_uploads(seen: dict[int, int], noise: list[float]):
    """The `dp-upload` layer, wrapped: counts the records it noised per client and keeps, for each,
    the noise it added (noised value − the clipped plain value)."""
    from client_app.private_upload import around

    def counting(handler, message, context):
        plain = {}

        def keep(m, c):
            reply = handler(m, c)
            plain.update({name: {k: reply.content[name][k].numpy().copy()
                                 for k in reply.content[name].keys()}
                          for name in UploadInstructions.read(m.content[DP_UPLOAD]).records
                          if name in reply.content and isinstance(reply.content[name], ArrayRecord)})
            return reply

        reply = around(keep, message, context)
        ins = UploadInstructions.read(message.content[DP_UPLOAD])
        client = ClientAddress.read(message.content[CLIENT]).client_id
        for name, values in plain.items():
            seen[client] = seen.get(client, 0) + 1
            norm = math.sqrt(sum(float(np.square(v.astype(np.float64)).sum())
                                 for v in values.values()))
            scale = clip_scale(norm, ins.clip_norm)
            for key, value in values.items():
                sent = reply.content[name][key].numpy().astype(np.float64)
                noise.extend((sent - value.astype(np.float64) * scale).ravel().tolist())
        return reply

    return counting
