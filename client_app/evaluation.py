"""Client half of `evaluate`: test the received model(s) on the client's own test split.

`personal` (if sent) is the model the client uses → `accuracy` (classification) or `mae`/`mape`/`rmse`
(regression); `global` (if sent) → `global-*`, and with `finetune-epochs` > 0 also "global + local
epochs" → `finetuned-*` (the fair comparison point for personalized methods). Without `personal`, the
client uses the global model. A layer the request turns on (`client_app.layers`) may evaluate
`personal` its own way, with `evaluate_global` for the global model.
"""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict

from client_app.runtime import ClientRuntime, client_runtime
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


def _finetune(model, x, y, ins: EvaluateInstructions, client: int, keep=None) -> None:
    """The evaluation's `finetune-epochs` local epochs on (x, y), in place (the same seeded batch
    order for every model a client fine-tunes; `keep`: `train_epochs`' mask)."""
    train_epochs(model, x, y, epochs=ins.finetune_epochs, batch_size=ins.batch_size, lr=ins.lr,
                 momentum=ins.momentum,
                 generator=seeded_generator(ins.seed, client, ins.server_round, 7), keep=keep)


def evaluate_global(message: Message, rt: ClientRuntime, ins: EvaluateInstructions,
                    finetune: bool = True) -> tuple[dict[str, float], Evaluation | None]:
    """`global-*` fields of the received `global` model (and, with `finetune` and `finetune-epochs`
    > 0, `finetuned-*` of it after local epochs on the train split), with its test result; ({},
    None) without one."""
    if GLOBAL not in message.content:
        return {}, None
    x_test, y_test = rt.tensors("test")
    model = rt.model(message.content[GLOBAL])
    used = test_model(model, x_test, y_test, ins.batch_size, rt.data.target_scale)
    fields = result_fields(used, "global_")
    if finetune and ins.finetune_epochs > 0:
        _finetune(model, *rt.tensors("train"), ins, rt.client_id)
        tuned = test_model(model, x_test, y_test, ins.batch_size, rt.data.target_scale)
        fields.update(result_fields(tuned, "finetuned_"))
    return fields, used


def evaluate_reply(message: Message, used: Evaluation | None, fields: dict[str, float]) -> Message:
    """The `metrics` reply of the model the client uses (`used`) with the other models' `fields`."""
    if used is None:
        raise ValueError(f"evaluate needs an ArrayRecord '{GLOBAL}' or '{PERSONAL}'")
    reply = EvaluateReply(
        num_examples=used.num_examples, loss=used.loss, **result_fields(used), **fields,
    )
    return Message(RecordDict({METRICS: reply.metrics()}), reply_to=message)


def evaluate(message: Message, context: Context) -> Message:
    rt = client_runtime(message, context)
    ins = EvaluateInstructions.read(message.content[CONFIG])
    fields, used = evaluate_global(message, rt, ins)
    if PERSONAL in message.content:
        x_test, y_test = rt.tensors("test")
        used = test_model(rt.model(message.content[PERSONAL]), x_test, y_test, ins.batch_size,
                          rt.data.target_scale)
    return evaluate_reply(message, used, fields)
