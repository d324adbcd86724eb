"""The client half of secure aggregation (`secure-aggregation = 'secagg+'`, docs/privacy.md): a
ClientApp mod that runs Flower's own `secaggplus_mod` unchanged (key pairs, Shamir shares,
encryption, quantization and masks are all Flower's) for every request that carries a `secagg`
record (strategies/shared/secure_aggregation.py); other requests pass straight through.

Flower's mod is written for one client per node and for the legacy record layout, so this mod adapts
four things around it and nothing inside it:

- **the record**: Bouquet's `secagg` ConfigRecord (Flower's keys) becomes the mod's
  `secaggplus_configs`; its answer goes back as `secagg`, the masked vector as an ArrayRecord (so the
  server counts its bytes).
- **the client**: a node may host several logical clients, so the mod sees a message addressed to
  the logical client id (its protocol id) and each client's protocol state is kept in the node's
  context under its own name (`secaggplus_state:<client id>`), swapped in for the call.
- **the training**: at `collect-masked-vectors` the mod calls the rest of the ClientApp (the
  method's train handler, a fused evaluation included); the arrays of the reply's model record
  (`record` of the request, or the reply's only ArrayRecord; those starting with `part`) are handed to the mod in the legacy
  `fitres.*` layout it reads (`flwr.compat` converts), with the reply's `num-examples` as weight.
- **the reply**: the method's reply without the masked arrays, with the masked vector: the server
  never receives the model in the clear. Its metrics (train loss, num-examples) stay in the clear,
  as under Flower's `SecAggPlusWorkflow`.

Where only part of the model is shared (`part`, a key prefix: the partial-sharing methods), the rest
of the trained model never leaves the client: the mod keeps it in the node's context
(`secagg.kept:<client id>`) and, on every later request to that client, puts it in place of the
same arrays of the `personal` model the server sends (which holds the initial model there), before
training or evaluating; a client that kept nothing yet uses what it received, the initial model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from strategies.shared.messages import CLIENT, METRICS, PERSONAL, ClientAddress
from strategies.shared.secure_aggregation import PART, RECORD, SECAGG

Handler = Callable[[Message, Context], Message]

KEPT = "secagg.kept:{}"  # context.state: the arrays outside the shared part a client trained


class SecureAggregationError(RuntimeError):
    """A request the protocol cannot serve (its model record is missing from the reply)."""


def _same_metadata(message: Message, content: RecordDict) -> Message:
    """`content` under a copy of `message`'s metadata (same ids and type)."""
    return Message(content=content, metadata=copy.copy(message.metadata))


def secure_aggregation(message: Message, context: Context, call_next: Handler) -> Message:
    """ClientApp mod: Flower's `secaggplus_mod` for a request with a `secagg` record (module doc)."""
    if not message.has_content():
        return call_next(message, context)
    message = _with_kept(message, context)
    if not isinstance(message.content.get(SECAGG), ConfigRecord):
        return call_next(message, context)
    from flwr.app.message_type import MessageType
    from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod
    from flwr.common import Code, FitRes, Status, bytes_to_ndarray, ndarrays_to_parameters
    from flwr.common.secure_aggregation.secaggplus_constants import (RECORD_KEY_CONFIGS,
                                                                     RECORD_KEY_STATE, Key, Stage)
    from flwr.compat.common.recorddict_compat import fitres_to_recorddict

    client = ClientAddress.read(message.content[CLIENT]).client_id
    config = dict(message.content[SECAGG])
    target = str(config.pop(RECORD, ""))
    part = str(config.pop(PART, ""))
    collect = config.get(Key.STAGE) == Stage.COLLECT_MASKED_VECTORS
    rest = RecordDict({n: r for n, r in message.content.items() if n != SECAGG})
    protocol_content = RecordDict({**(dict(rest.items()) if collect else {}),
                                   RECORD_KEY_CONFIGS: ConfigRecord(config)})
    protocol_message = Message(protocol_content, dst_node_id=client,
                               message_type=MessageType.TRAIN, group_id=message.metadata.group_id)
    trained: dict[str, object] = {}

    def train(request: Message, ctx: Context) -> Message:
        """The method's training, its model handed to Flower's mod as a legacy `FitRes`."""
        reply = call_next(_same_metadata(message, rest), ctx)
        if reply.has_error():
            raise SecureAggregationError(f"training failed: {reply.error.reason}")
        arrays = [n for n, r in reply.content.items() if isinstance(r, ArrayRecord)]
        name = target or (arrays[0] if len(arrays) == 1 else "")
        if name not in arrays:
            raise SecureAggregationError(
                f"the train reply carries no ArrayRecord '{target}' to aggregate securely"
                if target else f"the train reply carries {len(arrays)} ArrayRecords {arrays}, "
                "not the one model a FedAvg-type server aggregates")
        model = reply.content[name]
        keys = [k for k in model.keys() if k.startswith(part)]
        examples = int(reply.content[METRICS]["num-examples"])
        trained.update(reply=reply, keys=keys, name=name)
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(
            [model[k].numpy() for k in keys]), examples, {})
        return Message(fitres_to_recorddict(fitres, keep_input=True), reply_to=request)

    states = context.state  # the RecordDict itself: its typed views are snapshots
    own = f"{RECORD_KEY_STATE}:{client}"
    if own in states:
        states[RECORD_KEY_STATE] = states[own]
    elif RECORD_KEY_STATE in states:
        del states[RECORD_KEY_STATE]
    try:
        answered = secaggplus_mod(protocol_message, context, train)
    finally:
        if RECORD_KEY_STATE in states:
            states[own] = states[RECORD_KEY_STATE]
            del states[RECORD_KEY_STATE]
    answer = answered.content.config_records[RECORD_KEY_CONFIGS]
    if not collect:
        return Message(RecordDict({SECAGG: ConfigRecord(dict(answer))}), reply_to=message)
    reply: Message = trained["reply"]  # type: ignore[assignment]
    keys: list[str] = trained["keys"]  # type: ignore[assignment]
    masked = [bytes_to_ndarray(b) for b in answer[Key.MASKED_PARAMETERS]]
    records = dict(reply.content.items())
    name: str = trained["name"]  # type: ignore[assignment]
    model = records.pop(name)
    kept = {k: a for k, a in model.items() if k not in keys}
    if kept:  # the arrays outside the summed part stay here (module doc)
        states[KEPT.format(client)] = ArrayRecord(kept)
    # the first array is the client's quantized weight (Flower's factor_combine), then one per key
    records[SECAGG] = ArrayRecord({name: Array(array) for name, array
                                   in zip([":weight", *keys], masked, strict=True)})
    return Message(RecordDict(records), reply_to=message)


def _with_kept(message: Message, context: Context) -> Message:
    """`message` with the arrays this client kept (module doc) in place of the received ones in
    its `personal` model; unchanged where it kept none (always, with secure aggregation off)."""
    if not any(name.startswith(KEPT.format("")) for name in context.state.keys()):
        return message
    if CLIENT not in message.content or not isinstance(message.content.get(PERSONAL), ArrayRecord):
        return message
    client = ClientAddress.read(message.content[CLIENT]).client_id
    kept = context.state.get(KEPT.format(client))
    if not isinstance(kept, ArrayRecord):
        return message
    received = message.content[PERSONAL]
    missing = [k for k in kept.keys() if k not in received]
    if missing:
        raise SecureAggregationError(f"the '{PERSONAL}' model sent to client {client} lacks the "
                                     f"arrays {missing[:3]} it keeps")
    records = dict(message.content.items())
    records[PERSONAL] = ArrayRecord({k: kept[k] if k in kept else a for k, a in received.items()})
    return _same_metadata(message, RecordDict(records))


def unmasked_request(message: Message, context: Context) -> Message:
    """The handler of `query.secagg` (Flower routes a message type to a handler before any mod
    runs): every such request carries a `secagg` record and is answered by the mod above, so one
    that reaches here has none."""
    raise SecureAggregationError(f"a '{message.metadata.message_type}' request must carry a "
                                 f"'{SECAGG}' ConfigRecord")
