"""The own model's twin on the safeguard's consensus path: the same updates on every train sample.

Where the federation hands every client its consensus (the safeguard's record carries a `margin`,
client_app/safeguard_consensus.py) and the run sets `safeguard-twin` (record field `twin`; off by
default), the client's own model never trains on the held-out slice, which
costs a client of a small train split the slice's share of its data in every round. Each client
there keeps a twin of its own model (`context.state`, `TWIN`), updated exactly as the own model is
(same start: the same mix of the twin with the received model at the chosen weight; same epochs,
batch order seed and dropout draws) but on the whole train split, slice included:

- after a local update (`train`): from the twin's version of the start the own model trained from
  (the consensus itself where the client trained from it), the same local epochs on every sample;
  kept where the own model was kept (`keep_trained`);
- at an evaluation (`answer`): the twin's version of the chosen mix, fine-tuned on every sample as
  the own model is on the slice-free split; the fine-tuned twin is the newest twin either way.

The safeguard's choices (the mix weight, fine-tuned or not) are still made with the slice-free own
model's held-out evidence; where the choice involves the own model (a weight below 1, or the
fine-tuned model), the client answers with the twin's version instead. Cost: one more local update
per sampled client and round, one more fine-tuning per evaluated client; no byte is added to what
server and clients exchange (the twin is never sent).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord, Context

from client_app.runtime import ClientRuntime, model_record
from client_app.training import seeded_generator, train_epochs

TWIN = "safeguard.twin.{}"  # context.state: the twin of the client's own model


def twin_model(context: Context, client: int, own: ArrayRecord | None) -> ArrayRecord | None:
    """The client's twin (`own` itself before it has one; None where there is no own model)."""
    key = TWIN.format(client)
    return context.state[key] if key in context.state.array_records else own


def keep_twin(context: Context, client: int, model: torch.nn.Module) -> None:
    context.state[TWIN.format(client)] = model_record(model)


def twin_start(start: ArrayRecord, own: ArrayRecord | None, twin: ArrayRecord | None,
               received: ArrayRecord | None, weight: float, mix) -> ArrayRecord:
    """The twin's version of `start`, the mix (1 − weight)·own + weight·received: the same mix with
    the twin in place of the own model; `start` itself where it holds no own model (weight 1, no
    own model, or training from the consensus)."""
    if own is None or twin is None or received is None or weight >= 1.0:
        return start
    return ArrayRecord(mix(twin.to_torch_state_dict(), received.to_torch_state_dict(), weight))


def rng_state() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The global random state (CPU and CUDA) a local update's dropout draws from."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return torch.get_rng_state(), cuda


def replay(rng: tuple[torch.Tensor, list[torch.Tensor]], update) -> None:
    """Run `update()` with the global random state `rng` (the state before the own model's update,
    so the twin's dropout draws are the own model's), then leave the state as it was before."""
    after = rng_state()
    torch.set_rng_state(rng[0])
    if rng[1]:
        torch.cuda.set_rng_state_all(rng[1])
    try:
        update()
    finally:
        torch.set_rng_state(after[0])
        if after[1]:
            torch.cuda.set_rng_state_all(after[1])


def train(rt: ClientRuntime, ins, start: ArrayRecord,
          rng: tuple[torch.Tensor, list[torch.Tensor]]) -> torch.nn.Module:
    """The twin's local update: from `start`, the request's local epochs on the whole train split
    with the own model's batch-order seed and dropout draws (`replay`)."""
    x, y = rt.tensors("train")
    model = rt.model(start)
    replay(rng, lambda: train_epochs(
        model, x, y, epochs=ins.local_epochs, batch_size=ins.batch_size, lr=ins.lr,
        momentum=ins.momentum, generator=seeded_generator(ins.seed, rt.client_id, ins.server_round)))
    return model


def prepare(rt: ClientRuntime, context: Context, guard, start: ArrayRecord,
            received: Mapping[str, ArrayRecord], choice=None
            ) -> tuple[ArrayRecord, tuple[torch.Tensor, list[torch.Tensor]]] | None:
    """Before a local update on the consensus path with the twin (the record carries a `margin` and
    `twin`; None elsewhere): the twin's start (`twin_start`; `choice` None: the client trains from `start`, the
    consensus itself) and the random state the own model's update starts from."""
    from client_app.safeguard import mix, own_model, without_own_update
    if not (guard.margin and guard.twin):
        return None
    own = own_model(context, rt.client_id)
    if choice is not None and choice.source and choice.weight < 1.0:
        other = without_own_update(context, rt.client_id, guard, received[choice.source])
        start = twin_start(start, own, twin_model(context, rt.client_id, own), other,
                           choice.weight, mix)
    return start, rng_state()


def answer(rt: ClientRuntime, ins, context: Context, guard, own: ArrayRecord | None,
           received: Mapping[str, ArrayRecord], choice, finetuned: bool, used,
           rng: tuple[torch.Tensor, list[torch.Tensor]]):
    """At an evaluation on the consensus path with the twin (the record carries a `margin` and
    `twin`; elsewhere `used` unchanged): the twin's version of the chosen mix (`choice`, of `received` as the safeguard
    tested them, with the own model `own` it was made with) and, with `finetune-epochs` > 0, that
    mix fine-tuned on every sample (the own model's fine-tuning with its dropout draws, `rng`),
    kept as the newest twin. Returns the test result the client answers with: the twin's
    fine-tuned model where the safeguard chose the fine-tuned own model (`finetuned`), the twin's
    mix where the chosen mix holds the own model (weight below 1), else `used`."""
    from client_app.evaluation import _finetune
    from client_app.safeguard import mix, without_own_update
    from client_app.training import evaluate as test_model
    twin = twin_model(context, rt.client_id, own)
    if not (guard.margin and guard.twin) or own is None or twin is None or not choice.source:
        return used
    other = without_own_update(context, rt.client_id, guard, received[choice.source])
    start = other if choice.weight >= 1.0 else ArrayRecord(
        mix(twin.to_torch_state_dict(), other.to_torch_state_dict(), choice.weight))
    x_test, y_test = rt.tensors("test")
    if ins.finetune_epochs > 0:
        tuned = rt.model(start)
        replay(rng, lambda: _finetune(tuned, *rt.tensors("train"), ins, rt.client_id))
        keep_twin(context, rt.client_id, tuned)
        if finetuned:
            return test_model(tuned, x_test, y_test, ins.batch_size, rt.data.target_scale)
    if choice.weight < 1.0:
        return test_model(rt.model(start), x_test, y_test, ins.batch_size, rt.data.target_scale)
    return used
