"""Client half of FLT's one-off phases (docs/methods/flt.md). Training rounds use `train.local`
(client_app/methods/local.py): FLT's local step is plain SGD on the client's own model.

- `train.flt_ae` (phase 1): train the received autoencoder on reconstruction MSE with Adam for F
  epochs; reply the autoencoder and {num-examples, recon-loss}. Under dp='sample' the request
  carries a `privacy` record and the training is DP-SGD stepped by Adam (client_app/privacy.py),
  whose steps the reply's `privacy` report gives the server's ledger.
- `query.flt_embed` (phase 2, Form Client Relatedness): encode the local train split with the received
  encoder G (eval mode), run k-means on the codes and reply ONLY the k centroids (ArrayRecord
  `centroids` {`mu`: float32 [k, e]}) and {num-examples}. Labels are used, locally, only to choose k
  under k-mode `local-labels`; no label, code or cluster id leaves the client.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

from client_app.runtime import ClientRuntime, client_runtime, model_record
from client_app.training import LOCAL_TRAINER, seeded_generator
from models.autoencoder import ConvAutoencoder, encode_batched, reconstruction_epochs
from strategies.methods.flt.settings import (
    AUTOENCODER, CENTROIDS, CENTROIDS_MU, ENCODER, AutoencoderInstructions, AutoencoderReply,
    EmbedInstructions, EmbedReply
)
from strategies.shared.messages import CONFIG, METRICS

_AE_STREAM = 11  # seeded_generator purpose id of the autoencoder's batch order


def _autoencoder(rt: ClientRuntime, latent_dim: int) -> ConvAutoencoder:
    """An autoencoder to load received weights into; its random initialisation does not advance the
    global RNG (which local training's dropout draws from), so FCR leaves training unchanged."""
    with torch.random.fork_rng():
        return ConvAutoencoder(rt.data.input_shape, latent_dim)


def train_autoencoder(message: Message, context: Context) -> Message:
    """`train.flt_ae`: reconstruction training of the received autoencoder (spec §2, AE training)."""
    rt = client_runtime(message, context)
    ins = AutoencoderInstructions.read(message.content[CONFIG])
    model = _autoencoder(rt, ins.latent_dim)
    model.load_state_dict(message.content[AUTOENCODER].to_torch_state_dict())
    model = model.to(rt.device)
    x, _ = rt.tensors("train")
    generator = seeded_generator(ins.seed, rt.client_id, ins.ae_round, _AE_STREAM)
    private = LOCAL_TRAINER.get()  # dp='sample': DP-SGD with Adam (client_app/privacy.py)
    if private is not None:
        loss = private(model, x, x, epochs=ins.epochs, batch_size=ins.batch_size, lr=ins.lr,
                       momentum=0.0, generator=generator, task="reconstruction", optimizer="adam")
    else:
        loss = reconstruction_epochs(model, x, epochs=ins.epochs, batch_size=ins.batch_size,
                                     lr=ins.lr, generator=generator)
    reply = AutoencoderReply(num_examples=len(x), recon_loss=loss)
    return Message(
        RecordDict({AUTOENCODER: model_record(model), METRICS: reply.metrics()}), reply_to=message
    )


def local_k(requested: int, mode: str, labels: torch.Tensor, num_codes: int) -> int:
    """k of this client: `fixed` → k; `local-labels` → min(k, distinct local labels) (spec §6.2 [D]);
    never more than the number of codes."""
    k = requested if mode == "fixed" else min(requested, int(torch.unique(labels).numel()))
    return max(1, min(k, num_codes))


def centroids_of(codes: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k-means centroids M_m = kmeans_k(E_m) of the codes (spec §2), float32 [k, e]."""
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):  # a few hundred codes: threads would only contend
        kmeans = KMeans(n_clusters=k, random_state=seed, n_init=10).fit(codes.astype(np.float64))
    return kmeans.cluster_centers_.astype(np.float32)


def embed(message: Message, context: Context) -> Message:
    """`query.flt_embed`: E_m = {G(x)}, centroids = kmeans_k(E_m); reply `centroids` + num-examples."""
    rt = client_runtime(message, context)
    ins = EmbedInstructions.read(message.content[CONFIG])
    model = _autoencoder(rt, ins.latent_dim)
    model.encoder.load_state_dict(message.content[ENCODER].to_torch_state_dict())
    x, y = rt.tensors("train")
    codes = encode_batched(model.encoder.to(rt.device), x).cpu().numpy()
    k = local_k(ins.k, ins.k_mode, y, len(codes))
    mu = centroids_of(codes, k, ins.kmeans_seed)
    reply = EmbedReply(num_examples=len(y))
    return Message(
        RecordDict({
            CENTROIDS: ArrayRecord({CENTROIDS_MU: Array(np.ascontiguousarray(mu))}),
            METRICS: reply.metrics(),
        }),
        reply_to=message,
    )
