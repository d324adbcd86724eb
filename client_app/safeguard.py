"""The per-client safeguard of the graph methods: no regret against training alone.

A graph method hands each client a model built from other clients (its graph aggregate, and for some
methods a global model too). Where clients share no structure that model can be worse than the
client's own. With the safeguard on (run config `safeguard = "mix"`; train and evaluate requests then
carry a `safeguard` record, `SafeguardInstructions`, with its `holdout` and `grid`), every client

1. holds out a fixed slice of its train split (`safeguard-holdout`, at least one sample; the same slice
   every round: a seeded permutation of (seed, client id)) and trains only on the rest (batched as
   the batches an epoch over the whole split makes, each less its held-out samples, or, with `batches`
   "slice-free" in the record, batched as the rest: `finetune_slice_free`, `Layer.whole_split_batches`);
2. keeps its own model, the one it last trained, in its node's `context.state`;
3. on receiving the method's model(s), tests the mixes (1 − a)·own + a·received for a on a grid of
   `grid` points in [0, 1] (for each received model) on the held-out slice, and takes the
   best (accuracy, then loss; ties go to the larger a, toward the method's model). Evaluation
   tests that mix; training starts from it where the record carries no `own-start`, and otherwise
   from the client's own model unless the mix is `own-start` standard errors better than the own
   model on the slice (`SafeguardLayer.start`).
4. where the record carries a `margin` (the server sends it while the strategy hands every client
   the federation's consensus), departs from the federation's model only on clear evidence and
   reports it for the server to pool; there `send-slice` and `train-consensus` apply
   (client_app/safeguard_consensus.py), and a sampled client trains from the consensus or from its
   chosen mix (then with the own-model start of step 3).
5. where the evaluation fine-tunes the chosen mix (`finetune-epochs` > 0, client_app/evaluation.py),
   answers with the fine-tuned model if it scores at least as well on the slice (with a margin: if it
   is clearly better than the mix; where the record carries the federation's answer `finetune`,
   that answer unless the other model is clearly better, reporting the fine-tuned model's gains
   over the mix for the server to pool; `prefers_finetuned`); the fine-tuned model is the client's
   own model either way.

Before a client has trained once, or with the safeguard off, it uses the received model unchanged:
the paper's behaviour. The safeguard is a layer (`client_app.layers`): `around` runs a method's train
handler with `SafeguardLayer` active (start, train samples, what follows training; the reply gets a
`safeguard` record, `SafeguardTrainReply`, where there is evidence to report), and answers an
evaluate request that carries `personal` itself (`evaluate`, reply record `SafeguardEvaluateReply`). The choice is computed once per received model: the evaluation that a fused
message carries and the training after it receive the same model and reuse it (cached by a digest
of the received records and the own model's version). The cost is the forward passes over the
held-out slice, `grid` per received model (default 10 % × 5 = half a pass over the train split),
once per client and round; no byte is added to what server and clients exchange.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message

from client_app import safeguard_consensus as consensus
from client_app.evaluation import _finetune, evaluate_global, evaluate_reply, result_fields
from client_app.layers import Handler, Layer, entered, part_of_split
from client_app.runtime import ClientRuntime, client_runtime, model_record
from client_app.training import forward_batches, masked_mae, seeded_generator, task_of
from client_app.training import evaluate as test_model
from strategies.shared.evidence import (SAFEGUARD, SafeguardEvaluateReply, SafeguardInstructions,
                                        SafeguardTrainReply, clearly_better, grid)
from strategies.shared.messages import CONFIG, EVALUATE, GLOBAL, PERSONAL, EvaluateInstructions

_HOLDOUT_STREAM = 13  # seeded_generator purpose id of the held-out permutation
OWN = "safeguard.own.{}"  # context.state: the client's own (last trained) model
CHOICE = "safeguard.choice.{}"  # context.state: the last choice and what it was made for


@dataclass(frozen=True)
class Choice:
    """The chosen start: which received model was mixed in (`source`, "" = none) and its weight `a`
    (1 − a on the own model)."""

    source: str
    weight: float
    # with a margin: per weight a < 1 of the grid (ascending), the summed per-sample gains of the
    # mix over the received model on the held-out slice, and their squares (`evidence`)
    gains: tuple[float, ...] = ()
    squares: tuple[float, ...] = ()
    # the chosen mix's score on the held-out slice, larger is better ([accuracy, −loss];
    # regression: [−loss]); empty where nothing was tested (no own model yet)
    score: tuple[float, ...] = ()
    # its per-sample result on the slice where this call tested it (None when it came from the
    # cache); not kept between messages
    held: tuple[torch.Tensor, torch.Tensor | None] | None = field(default=None, compare=False,
                                                                  repr=False)

    @property
    def own_weight(self) -> float:
        return 1.0 - self.weight if self.source else 0.0


def holdout_index(num_samples: int, fraction: float, seed: int, client: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train indices, held-out indices) of a train split of `num_samples`: a seeded permutation of
    (seed, client), the first ⌈fraction·n⌉ held out (at least 1, never all; none for n < 2)."""
    if num_samples < 2:
        return torch.arange(num_samples), torch.arange(0)
    order = torch.randperm(num_samples, generator=seeded_generator(seed, client, _HOLDOUT_STREAM))
    held = min(max(1, math.ceil(fraction * num_samples)), num_samples - 1)
    return torch.sort(order[held:]).values, torch.sort(order[:held]).values


def train_index(rt: ClientRuntime, ins, guard: SafeguardInstructions) -> torch.Tensor:
    """The train-split indices a client trains on: the part outside the held-out slice."""
    return holdout_index(len(rt.data.train_y), guard.holdout, ins.seed, rt.client_id)[0]


def finetune_slice_free(rt: ClientRuntime, ins, guard: SafeguardInstructions,
                        model: torch.nn.Module) -> None:
    """The evaluation's fine-tuning (`finetune-epochs`) on the train split less the held-out slice,
    batched as the record says (`batches`: "slice-free", the part's own batches; absent, the whole
    split's batches less the slice's samples), in place."""
    x, y, keep = part_of_split(rt, train_index(rt, ins, guard),
                               whole_split=guard.batches != "slice-free")
    _finetune(model, x, y, ins, rt.client_id, keep=keep)


def own_model(context: Context, client: int) -> ArrayRecord | None:
    """The client's own model: the one it last trained (None before its first training)."""
    key = OWN.format(client)
    return context.state[key] if key in context.state.array_records else None


def keep_own(context: Context, client: int, model: torch.nn.Module) -> None:
    """Remember the model a client just trained as its own."""
    context.state[OWN.format(client)] = model_record(model)
    version = CHOICE.format(client) + ".version"
    previous = context.state.config_records.get(version)
    count = int(previous["n"]) + 1 if previous is not None else 1
    context.state[version] = ConfigRecord({"n": count})


def trains_from_consensus(context: Context, client: int, guard: SafeguardInstructions) -> bool:
    """Whether a sampled client trains from the received consensus itself, as under FedAvg, rather
    than from its chosen mix: the record carries `train-consensus` and the client has an own model
    to compare the trained one with (before, it trains from the received model anyway)."""
    return bool(guard.train_consensus) and own_model(context, client) is not None


def keep_trained(rt: ClientRuntime, context: Context, model: torch.nn.Module, ins,
                 guard: SafeguardInstructions) -> SafeguardTrainReply | None:
    """Keep the model a client just trained as its own (`keep_own`). Where it trained from the
    consensus (`trains_from_consensus`), only if it scores at least as well on the held-out slice as
    the client's own model (accuracy, then loss; regression: loss), and return the own model's
    per-sample gains over it there, summed, and their squares, for the server to pool (its
    `safeguard-start` decision); None otherwise."""
    held = held_out(rt, ins, guard) if trains_from_consensus(context, rt.client_id, guard) else None
    if held is None or len(held[1]) == 0:
        keep_own(context, rt.client_id, model)
        return None
    xv, yv = held
    own = _per_sample(rt.model(own_model(context, rt.client_id)), xv, yv, ins.batch_size)
    trained = _per_sample(model, xv, yv, ins.batch_size)
    if tuple(_summary(trained)) >= tuple(_summary(own)):
        keep_own(context, rt.client_id, model)
    start_gain, start_square = consensus.evidence(own, trained)
    return SafeguardTrainReply(start_gain=start_gain, start_square=start_square)


def train_on_slice(rt: ClientRuntime, context: Context, model: torch.nn.Module, ins,
                   guard: SafeguardInstructions) -> int:
    """Where the record carries `send-slice`, train the model it sends on the held-out slice too
    (client_app/safeguard_consensus.py); returns the samples added (0 where nothing is done)."""
    if not guard.send_slice:
        return 0
    return consensus.train_on_slice(rt, context, model, ins, *held_out(rt, ins, guard))


def without_own_update(context: Context, client: int, guard: SafeguardInstructions,
                       record: ArrayRecord) -> ArrayRecord:
    """The received consensus less the client's own update where the record says it holds one
    (`sent_update`): the line from the model it sent through the consensus, beyond it; else
    `record`."""
    sent = consensus.sent_update(context, client, guard)
    if sent is None:
        return record
    model, weight = sent
    return ArrayRecord(mix(model.to_torch_state_dict(), record.to_torch_state_dict(), weight))


def _digest(record: ArrayRecord) -> str:
    h = hashlib.blake2b(digest_size=16)
    for key, array in record.items():
        h.update(key.encode())
        h.update(np.ascontiguousarray(array.numpy()).tobytes())
    return h.hexdigest()


def mix(own: Mapping[str, torch.Tensor], other: Mapping[str, torch.Tensor],
        weight: float) -> dict[str, torch.Tensor]:
    """(1 − weight)·own + weight·other for floating tensors; other tensors (counters) from `other`."""
    out = {}
    for key, value in other.items():
        base = own[key]
        if value.is_floating_point():
            out[key] = torch.lerp(base.to(value.dtype), value, weight)
        else:
            out[key] = value
    return out


def choose(rt: ClientRuntime, context: Context, ins, guard: SafeguardInstructions | None,
           received: Mapping[str, ArrayRecord]) -> tuple[ArrayRecord, Choice]:
    """The model a client starts from / uses: the first of `received` (the method's model) with the
    safeguard off (`guard` None) or no own model yet; otherwise the best mix on the held-out slice
    (module doc)."""
    first = next(iter(received))
    own = own_model(context, rt.client_id) if guard is not None else None
    if own is None:
        return received[first], Choice("", 1.0)
    received = {name: without_own_update(context, rt.client_id, guard, record)
                for name, record in received.items()}
    choice = _search(rt, context, ins, guard, own, received)
    if choice.weight == 1.0:
        return received[choice.source], choice
    mixed = mix(own.to_torch_state_dict(), received[choice.source].to_torch_state_dict(),
                choice.weight)
    return ArrayRecord(mixed), choice


def _per_sample(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                batch_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sample (task loss, correct top-1 as 0/1; None for regression) of `model` on (x, y)."""
    losses, hits = [], []
    for output, target in forward_batches(model, x, y, batch_size):
        if task_of(target) == "regression":
            losses.append(masked_mae(output, target, reduction="sample"))
        else:
            losses.append(F.cross_entropy(output, target, reduction="none"))
            hits.append((output.argmax(dim=1) == target).float())
    loss = torch.cat(losses).double()
    return loss, (torch.cat(hits).double() if hits else None)


def _summary(result: tuple[torch.Tensor, torch.Tensor | None]) -> list[float]:
    """A per-sample result's score, larger is better: [accuracy, −loss] (regression: [−loss])."""
    loss, hits = result
    return [-float(loss.mean())] if hits is None else [float(hits.mean()), -float(loss.mean())]


def held_out(rt: ClientRuntime, ins, guard: SafeguardInstructions
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The (x, y) of the client's held-out slice (`holdout_index`)."""
    x, y = rt.tensors("train")
    _, held = holdout_index(len(y), guard.holdout, ins.seed, rt.client_id)
    held = held.to(x.device)
    return x[held], y[held]


def prefers_finetuned(rt: ClientRuntime, ins, guard: SafeguardInstructions, choice: Choice,
                      mixed: ArrayRecord, tuned: torch.nn.Module
                      ) -> tuple[bool, tuple[float, float] | None]:
    """Whether the client answers with `tuned`, the chosen mix (`mixed`) after the evaluation's
    local epochs, rather than the mix itself, judged on the held-out slice, which neither model was
    trained on: it scores at least as well (accuracy, then loss; regression: loss), or, where the
    record carries a `margin` (the client received the federation's consensus), its
    per-sample gains over the mix are that many standard errors above zero, as every other
    departure from the federation's model (`clearly_better`); where the record also carries the
    federation's answer `finetune` (`safeguard-finetune = "federation"`), the client takes that
    answer unless the other model's gains over it are. There, also the summed gains of `tuned` over
    the mix and their squares, for the server to pool (None elsewhere). False where the choice
    tested nothing (no own model yet: the client answers with the received model)."""
    if not choice.score:
        return False, None
    xv, yv = held_out(rt, ins, guard)
    result = _per_sample(tuned, xv, yv, ins.batch_size)
    margin = float(guard.margin or 0.0)
    if margin <= 0.0:
        return tuple(_summary(result)) >= choice.score, None
    held = choice.held or _per_sample(rt.model(mixed), xv, yv, ins.batch_size)
    total, squares = consensus.evidence(result, held)
    if guard.finetune is None:
        return clearly_better(total, squares, margin), None
    if guard.finetune:
        return not clearly_better(-total, squares, margin), (total, squares)
    return clearly_better(total, squares, margin), (total, squares)


def _on_grid(weight: float | None, points: int) -> float:
    """The grid point nearest `weight` (None: 1, the received model itself)."""
    if weight is None:
        return 1.0
    return min(grid(points), key=lambda a: (abs(a - weight), -a))


def _search(rt: ClientRuntime, context: Context, ins, guard: SafeguardInstructions,
            own: ArrayRecord, received: Mapping[str, ArrayRecord]) -> Choice:
    """Per received model, test the mixes on the held-out slice and take the best by (accuracy,
    −loss; regression: −loss), ties to larger weights; a mix other than the received model itself
    is taken only if its per-sample gains over it are `margin` standard errors above zero
    (`clearly_better`; no margin in the record: any gain). With a margin, the reference is the
    federation's `weight` where the record carries one (else a = 1), and the
    choice records the gains of every mix over a = 1 for the server to pool. Across received models
    the best decision wins, ties to the earlier one. Decisions are cached in `context.state` per
    received model (by digest) until the own model or the instructions' margin or weight change, so
    a model received twice (a fused evaluation, then training) is tested once."""
    key = CHOICE.format(rt.client_id)
    version = context.state.config_records.get(key + ".version")
    version = int(version["n"]) if version is not None else 0
    margin = float(guard.margin or 0.0)
    reference = _on_grid(guard.weight, guard.grid)
    cache = context.state.config_records.get(key)
    valid = (cache is not None and int(cache["version"]) == version
             and float(cache["margin"]) == margin and float(cache["weight"]) == reference)
    scores = dict(cache) if valid else {}
    scores["version"], scores["margin"], scores["weight"] = version, margin, reference
    xv, yv = held_out(rt, ins, guard)
    own_state = own.to_torch_state_dict()
    model = rt.model(own)
    own_result = []  # the own model's per-sample result, computed at most once per call

    def test(state: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        model.load_state_dict(state)
        return _per_sample(model, xv, yv, ins.batch_size)

    best, best_key = None, None
    fresh = {}  # digest -> the decision's per-sample result, for the models tested in this call
    for name, record in received.items():
        digest = _digest(record)
        if digest not in scores:  # [a, score...] of the decision for this model
            other = record.to_torch_state_dict()
            tested = {}
            for a in reversed(grid(guard.grid)):  # a = 1 (the received model) first
                if a == 0.0:
                    if not own_result:
                        own_result.append(test(own_state))
                    tested[a] = own_result[0]
                else:
                    tested[a] = test(mix(own_state, other, a) if a < 1.0 else other)
            top = max(tested, key=lambda a: (*_summary(tested[a]), a))  # ties to larger a
            if margin > 0.0:
                top, scores[digest + ".gains"], scores[digest + ".squares"] = \
                    consensus.margin_choice(tested, top, reference, margin, guard.grid)
            scores[digest] = [top, *_summary(tested[top])]
            fresh[digest] = tested[top]
        a, *value = scores[digest]
        candidate = (*value, a)
        if best_key is None or candidate > best_key:  # strict: an equal key keeps the earlier model
            best = Choice(name, float(a), tuple(scores.get(digest + ".gains", ())),
                          tuple(scores.get(digest + ".squares", ())), tuple(value),
                          fresh.get(digest))
            best_key = candidate
    context.state[key] = ConfigRecord(scores)
    return best


class SafeguardLayer(Layer):
    """The safeguard around a method's local update (`client_app.layers.Layer`): training starts
    from the chosen mix (or the consensus, `trains_from_consensus`; with the record's `own-start`
    from the own model unless the chosen mix is clearly better than it), runs outside the held-out
    slice, and the trained model becomes the client's own (`keep_trained`, `train_on_slice`)."""

    def __init__(self, context: Context, guard: SafeguardInstructions) -> None:
        self.context, self.guard = context, guard
        self.reply: SafeguardTrainReply | None = None  # evidence for the server, once trained

    def start(self, rt: ClientRuntime, ins, received: Mapping[str, ArrayRecord]) -> ArrayRecord:
        if trains_from_consensus(self.context, rt.client_id, self.guard):
            return received[next(iter(received))]  # FedAvg's start; the better of the two is kept
        start, choice = choose(rt, self.context, ins, self.guard, received)
        guard = self.guard
        if guard.own_start and choice.source and choice.own_weight < 1.0:
            own = own_model(self.context, rt.client_id)
            xv, yv = held_out(rt, ins, guard)
            mixed = choice.held or _per_sample(rt.model(start), xv, yv, ins.batch_size)
            mine = _per_sample(rt.model(own), xv, yv, ins.batch_size)
            if not clearly_better(*consensus.evidence(mixed, mine), guard.own_start):
                return own  # the own model unless the mix is clearly better on the slice
        return start

    def train_index(self, rt: ClientRuntime, ins) -> torch.Tensor:
        return train_index(rt, ins, self.guard)

    def whole_split_batches(self) -> bool:
        return self.guard.batches != "slice-free"

    def trained(self, rt: ClientRuntime, ins, model: torch.nn.Module) -> int:
        self.reply = keep_trained(rt, self.context, model, ins, self.guard)
        return train_on_slice(rt, self.context, model, ins, self.guard)


def evaluate(message: Message, context: Context, guard: SafeguardInstructions) -> Message:
    """`evaluate` of a request that carries `personal`: test the best mix of the client's own last
    model with `personal` (or `global`) and report the own model's weight (`own`, with the gains
    where there is a margin); with `finetune-epochs` > 0 its `finetuned-*` are that model after the
    local epochs (on the train split outside the held-out slice), the counterpart of "global + local
    epochs" for a method that hands each client its own model, and the fine-tuned model becomes the
    client's own (so a client not sampled for training still refines it, as every client refines
    the global model under FedAvg + fine-tuning). The client answers (`accuracy`) with whichever of
    the mix and its fine-tuned version scores better on the held-out slice (`prefers_finetuned`) and
    reports which as `finetuned` (1: the fine-tuned one)."""
    rt = client_runtime(message, context)
    ins = EvaluateInstructions.read(message.content[CONFIG])
    fields, _ = evaluate_global(message, rt, ins, finetune=False)
    received = {PERSONAL: message.content[PERSONAL]}
    if GLOBAL in message.content:
        received[GLOBAL] = message.content[GLOBAL]
    personal, choice = choose(rt, context, ins, guard, received)
    model = rt.model(personal)
    x_test, y_test = rt.tensors("test")
    used = test_model(model, x_test, y_test, ins.batch_size, rt.data.target_scale)
    report = {"own": choice.own_weight}
    if choice.gains:
        report.update(gains=list(choice.gains), squares=list(choice.squares))
    if ins.finetune_epochs > 0:  # the used model + local epochs, as global + local epochs
        finetune_slice_free(rt, ins, guard, model)
        tuned = test_model(model, x_test, y_test, ins.batch_size, rt.data.target_scale)
        fields.update(result_fields(tuned, "finetuned_"))
        # the client answers with the fine-tuned model where its held-out slice prefers it
        finetuned, gains = prefers_finetuned(rt, ins, guard, choice, personal, model)
        report["finetuned"] = float(finetuned)
        if gains is not None:
            report.update(tuned_gain=gains[0], tuned_square=gains[1])
        used = tuned if finetuned else used
        keep_own(context, rt.client_id, model)  # the client's newest own model
    reply = evaluate_reply(message, used, fields)
    reply.content[SAFEGUARD] = SafeguardEvaluateReply(**report).config()
    return reply


def around(handler: Handler, message: Message, context: Context) -> Message:
    """The safeguard's layer around a method's train or evaluate handler (`client_app.layers`): an
    evaluate request with `personal` is answered by `evaluate`; a train request runs `handler` with
    `SafeguardLayer` active, its reply carrying the evidence the layer gathered."""
    guard = SafeguardInstructions.read(message.content[SAFEGUARD])
    if message.metadata.message_type.split(".")[0] == EVALUATE.split(".")[0]:
        if PERSONAL in message.content:
            return evaluate(message, context, guard)
        return handler(message, context)
    with entered(SafeguardLayer(context, guard)) as layer:
        reply = handler(message, context)
    if layer.reply is not None and not reply.has_error():
        reply.content[SAFEGUARD] = layer.reply.config()
    return reply
