"""Client half of `evaluate`: test the received model(s) on the client's own test split.

`personal` (if sent) is the model the client uses → `accuracy` (classification) or `mae`/`mape`/`rmse`
(regression); `global` (if sent) → `global-*`, and with `finetune-epochs` > 0 also "global + local
epochs" → `finetuned-*` (the fair comparison point for personalized methods). Without `personal`, the
client uses the global model. With the safeguard on (graph methods, `client_app.safeguard`) the
client tests the best mix of its own last model with `personal` (or `global`), and reports the own
model's weight as `safeguard-own`; with `finetune-epochs` > 0 its `finetuned-*` are then that model
after the local epochs (on the train split outside the held-out slice), the counterpart of
"global + local epochs" for a method that hands each client its own model, and the fine-tuned model
becomes the client's own model (so a client not sampled for training still refines it, as every
client refines the global model under FedAvg + fine-tuning). The client answers (`accuracy`) with
whichever of the mix and its fine-tuned version scores better on the held-out slice (ties to the
fine-tuned one; where the instructions carry `safeguard-margin`, the fine-tuned one only if clearly
better) and reports which as `safeguard-finetuned` (1: the fine-tuned one).
"""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict

from client_app import safeguard
from client_app.runtime import client_runtime
from client_app.training import Evaluation, seeded_generator, train_epochs
from client_app.training import evaluate as test_model
from strategies.shared.messages import (
    CONFIG, GLOBAL, METRICS, PERSONAL, EvaluateInstructions, EvaluateReply
)


def result_fields(result: Evaluation, prefix: str = "") -> dict[str, float]:
    """`EvaluateReply` fields of one tested model: `correct` + `accuracy` (classification) or
    `mae` / `mape` / `rmse` (regression, which needs `errors`: evaluate with the client's scale).

    `prefix` "" also adds the last-horizon errors (`*_h12`); "global_" / "finetuned_" name the other
    models of the reply.
    """
    if result.errors is None:
        return {f"{prefix}correct": result.correct, f"{prefix}accuracy": result.accuracy}
    errors = result.errors
    fields = {f"{prefix}mae": errors.mae, f"{prefix}mape": errors.mape, f"{prefix}rmse": errors.rmse}
    if not prefix:
        fields.update(correct=0.0, mae_h12=errors.mae_h12, mape_h12=errors.mape_h12, rmse_h12=errors.rmse_h12)
    return fields


def _finetune(model, x, y, ins: EvaluateInstructions, client: int) -> None:
    """The evaluation's `finetune-epochs` local epochs on (x, y), in place (the same seeded batch
    order for the global model and for the safeguard's chosen mix)."""
    train_epochs(model, x, y, epochs=ins.finetune_epochs, batch_size=ins.batch_size, lr=ins.lr,
                 momentum=ins.momentum,
                 generator=seeded_generator(ins.seed, client, ins.server_round, 7))


def evaluate(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = EvaluateInstructions.read(message.content[CONFIG])
    x_test, y_test = rt.tensors("test")
    scale = rt.data.target_scale
    fields: dict[str, float] = {}
    used = None
    if GLOBAL in message.content:
        model = rt.model(message.content[GLOBAL])
        used = test_model(model, x_test, y_test, ins.batch_size, scale)
        fields.update(result_fields(used, "global_"))
        if ins.finetune_epochs > 0 and not (safeguard.enabled(ins) and PERSONAL in message.content):
            _finetune(model, *rt.tensors("train"), ins, rt.client_id)
            tuned = test_model(model, x_test, y_test, ins.batch_size, scale)
            fields.update(result_fields(tuned, "finetuned_"))
    if PERSONAL in message.content:
        received = {PERSONAL: message.content[PERSONAL]}
        if GLOBAL in message.content:
            received[GLOBAL] = message.content[GLOBAL]
        personal, choice = safeguard.choose(rt, context, ins, received)
        model = rt.model(personal)
        used = test_model(model, x_test, y_test, ins.batch_size, scale)
        if safeguard.enabled(ins):
            fields["safeguard_own"] = choice.own_weight
            if choice.gains:
                fields["safeguard_gains"] = list(choice.gains)
                fields["safeguard_squares"] = list(choice.squares)
            if ins.finetune_epochs > 0:  # the used model + local epochs, as global + local epochs
                _finetune(model, *safeguard.training_tensors(rt, ins), ins, rt.client_id)
                tuned = test_model(model, x_test, y_test, ins.batch_size, scale)
                fields.update(result_fields(tuned, "finetuned_"))
                # the client answers with the fine-tuned model where its held-out slice prefers it
                finetuned = safeguard.prefers_finetuned(rt, ins, choice, personal, model)
                fields["safeguard_finetuned"] = float(finetuned)
                used = tuned if finetuned else used
                safeguard.keep_own(context, rt.client_id, model, ins)  # the client's newest own model
    if used is None:
        raise ValueError(f"evaluate needs an ArrayRecord '{GLOBAL}' or '{PERSONAL}'")
    reply = EvaluateReply(
        num_examples=used.num_examples, loss=used.loss, **result_fields(used), **fields,
    )
    return Message(RecordDict({METRICS: reply.metrics()}), reply_to=message)
