"""The per-client safeguard where the federation hands every client its consensus.

The server's `safeguard` record (server_app/safeguard.py) carries a `margin` only while the strategy
hands every client the same model, the federation's consensus; the client side of that case is here,
called by client_app/safeguard.py (which hands these functions what they need: the held-out slice,
per-sample results on it), whose mix choice every method with the safeguard uses.

- With a `margin`, a mix is taken over the reference (the federation's pooled `weight`, else the
  received model) only if its per-sample gains over it on the slice are that many standard errors
  above zero (McNemar's statistic (b − c) / √(b + c); regression: Σ gain / √Σ gain²;
  `margin_choice`), and the client reports every mix's gains over the received model for the server
  to pool (strategies/shared/evidence.py). A slice of a few dozen samples cannot tell apart models
  within a few points: without the margin, clients of a federation without structure took their own
  model on noise.
- With `send-slice`, a sampled client also trains the model it sends on its slice (`train_on_slice`;
  its own model stays the one trained without it), so the consensus learns every sample, and a
  client whose update the consensus holds scores, trains from and answers with the consensus less
  that update (`sent_update`), which its slice never trained.
- While the record carries `train-consensus` (the server's `safeguard-start`), a sampled client
  trains from the consensus itself, as under FedAvg, keeps the trained model as its own only if it
  scores at least as well on the slice as its own model, and reports how much better its own model
  was (`evidence`, client_app/safeguard.py's `keep_trained`); the server pools that and switches the
  federation to training from the mixes once the own models are clearly better.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context

from client_app.runtime import ClientRuntime, model_record
from client_app.training import seeded_generator, train_epochs
from strategies.shared.evidence import SafeguardInstructions, clearly_better, grid

# a per-sample result on the held-out slice: (task loss, correct top-1 as 0/1; None for regression)
Result = tuple[torch.Tensor, torch.Tensor | None]

_SLICE_STREAM = 14  # seeded_generator purpose id of the batches on the held-out slice
SENT = "safeguard.sent.{}"  # context.state: the model a client last sent (trained on its slice too)


def gain(candidate: Result, reference: Result) -> torch.Tensor:
    """Per-sample gain of `candidate` over `reference` on the held-out slice: +1 / −1 where only
    one of them is right (classification), the error reduction (regression)."""
    loss, hits = candidate
    ref_loss, ref_hits = reference
    return hits - ref_hits if hits is not None else ref_loss - loss


def evidence(candidate: Result, reference: Result) -> tuple[float, float]:
    """The per-sample gains of `candidate` over `reference` (`gain`), summed, and their squares."""
    g = gain(candidate, reference)
    return float(g.sum()), float((g**2).sum())


def margin_choice(tested: Mapping[float, Result], top: float, reference: float, margin: float,
                  points: int) -> tuple[float, list[float], list[float]]:
    """With a margin: the best weight `top` of the mixes `tested` on the grid of `points` (a = 1,
    the received model, among them), or the `reference` weight unless `top`'s gains over it are
    `margin` standard errors above zero (`clearly_better`); and the summed gains of every mix
    a < 1 (ascending) over a = 1, and their squares, for the server to pool."""
    pooled = [evidence(tested[a], tested[1.0]) for a in grid(points)[:-1]]
    if top != reference and not clearly_better(*evidence(tested[top], tested[reference]), margin):
        top = reference
    return top, [total for total, _ in pooled], [squares for _, squares in pooled]


def train_on_slice(rt: ClientRuntime, context: Context, model: torch.nn.Module, ins,
                   x: torch.Tensor, y: torch.Tensor) -> int:
    """With `send-slice`: train `model`, already kept as the client's own, for the same epochs on
    its held-out slice (x, y) as well, so that the model it sends (and the consensus) learns from
    every sample, and remember it with its round and example count (`sent_update`). Returns the
    samples added (0 for an empty slice)."""
    if len(y) == 0:
        return 0
    train_epochs(model, x, y, epochs=ins.local_epochs, batch_size=ins.batch_size, lr=ins.lr,
                 momentum=ins.momentum,
                 generator=seeded_generator(ins.seed, rt.client_id, ins.server_round, _SLICE_STREAM))
    examples = len(rt.data.train_y)
    context.state[SENT.format(rt.client_id)] = model_record(model)
    context.state[SENT.format(rt.client_id) + ".of"] = ConfigRecord(
        {"round": int(ins.server_round), "examples": float(examples)})
    return len(y)


def sent_update(context: Context, client: int, guard: SafeguardInstructions
                ) -> tuple[ArrayRecord, float] | None:
    """Where the record says the received consensus is the n-weighted mean of the models that round
    t's clients sent (`consensus-round`, Σ n_j `consensus-examples`, `consensus-clients`), this
    client among them (its reply was not dropped), and it kept what it sent then (`train_on_slice`):
    that model w_k and the weight Σ n_j/(Σ n_j − n_k) of the mix w_k + weight·(C − w_k) beyond the
    consensus, (Σ n_j·C − n_k·w_k) / (Σ n_j − n_k): the consensus less the client's own update,
    which its slice never trained. None otherwise."""
    t = guard.consensus_round
    key = SENT.format(client)
    if (t is None or client not in (guard.consensus_clients or ())
            or key + ".of" not in context.state.config_records):
        return None
    sent_of = context.state.config_records[key + ".of"]
    total, examples = float(guard.consensus_examples), float(sent_of["examples"])
    if int(sent_of["round"]) != int(t) or total <= examples:
        return None  # it did not train in that round, or its update is all the consensus has
    return context.state[key], total / (total - examples)
