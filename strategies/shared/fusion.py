"""One message for two phases: the previous round's evaluation rides on this round's train message.

A deployed message costs seconds of fixed overhead (SuperNode pull, a fresh ClientApp process), so the
round loop sends a client its evaluation of round r together with its training of round r + 1: the
client evaluates the model(s) it received, then trains, and replies once. The evaluation's records
travel as `evaluate:<name>`; a record identical to a train record travels once
(`FusedEvaluation.shared`): under the same name (a global model both phases send, a client's own
personal model) or, for a model, under another (a method whose evaluation sends as `personal` the
model its training sends as `global`). Both halves use
these functions: the server to fuse requests and split replies, the client to split a request and fuse
its two replies.
"""

from __future__ import annotations

import copy

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from strategies.shared.messages import CLIENT, EVALUATION_PREFIX, FUSED, FusedEvaluation


def _same(a: object, b: object) -> bool:
    """Whether two records hold the same values (ArrayRecords: names, dtypes, shapes and bytes)."""
    if a is b:
        return True
    if isinstance(a, ArrayRecord) and isinstance(b, ArrayRecord):
        return list(a.keys()) == list(b.keys()) and all(
            (x.dtype, x.shape, x.data) == (y.dtype, y.shape, y.data)
            for x, y in zip(a.values(), b.values()))
    if isinstance(a, ConfigRecord) and isinstance(b, ConfigRecord):
        return dict(a) == dict(b)
    return False


def _identical(train: RecordDict, name: str, record: object) -> str | None:
    """The name of a train record identical to the evaluation's `name` record: the same name first,
    then, for a model, any other train model; None if there is none."""
    if name in train and _same(train[name], record):
        return name
    if isinstance(record, ArrayRecord):
        return next((other for other, candidate in train.items()
                     if isinstance(candidate, ArrayRecord) and _same(candidate, record)), None)
    return None


def fuse(train: Message, evaluation: Message) -> Message:
    """A message of `train`'s type and destination carrying both contents."""
    records = dict(train.content.items())
    shared, sources = [], []
    for name, record in evaluation.content.items():
        source = _identical(train.content, name, record)
        if source is None:
            records[EVALUATION_PREFIX + name] = record
        else:
            shared.append(name)
            sources.append(source)
    renamed = any(name != source for name, source in zip(shared, sources))
    records[FUSED] = FusedEvaluation(message_type=evaluation.metadata.message_type, shared=shared,
                                     sources=sources if renamed else []).config()
    return Message(RecordDict(records), dst_node_id=train.metadata.dst_node_id,
                   message_type=train.metadata.message_type, group_id=train.metadata.group_id)


def is_fused(message: Message) -> bool:
    return message.has_content() and FUSED in message.content


def _with(message: Message, content: RecordDict, message_type: str | None = None) -> Message:
    """`content` under a copy of `message`'s metadata (same ids, so replies map to the same client)."""
    metadata = copy.copy(message.metadata)
    if message_type is not None:
        metadata.message_type = message_type
    return Message(content=content, metadata=metadata)


def split_request(message: Message) -> tuple[Message, Message]:
    """(the train message, the evaluation message) a fused message carries."""
    info = FusedEvaluation.read(message.content[FUSED])
    train, evaluation = {}, {}
    for name, record in message.content.items():
        if name == FUSED:
            continue
        if name.startswith(EVALUATION_PREFIX):
            evaluation[name[len(EVALUATION_PREFIX):]] = record
        else:
            train[name] = record
            if name == CLIENT:  # the address applies to both
                evaluation[name] = record
    for name, source in zip(info.shared, info.sources or info.shared):
        if source not in train:
            raise ValueError(f"a fused message shares its train record '{source}' as the evaluation's "
                             f"'{name}', but carries no '{source}' record")
        evaluation[name] = train[source]
    return (_with(message, RecordDict(train)),
            _with(message, RecordDict(evaluation), info.message_type))


def fuse_reply(request: Message, train_reply: Message, evaluation_reply: Message) -> Message:
    """The client's one reply to a fused request: the train reply's records and the evaluation
    reply's records as `evaluate:<name>`."""
    records = dict(train_reply.content.items())
    records.update({EVALUATION_PREFIX + name: record
                    for name, record in evaluation_reply.content.items()})
    return Message(RecordDict(records), reply_to=request)


def split_reply(request: Message, reply: Message) -> tuple[Message, Message]:
    """(train reply, evaluation reply) of a reply to the fused `request`; an error reply stands for
    both halves."""
    if reply.has_error():
        return reply, reply
    info = FusedEvaluation.read(request.content[FUSED])
    train = {n: r for n, r in reply.content.items() if not n.startswith(EVALUATION_PREFIX)}
    evaluation = {n[len(EVALUATION_PREFIX):]: r for n, r in reply.content.items()
                  if n.startswith(EVALUATION_PREFIX)}
    return (_with(reply, RecordDict(train)),
            _with(reply, RecordDict(evaluation), info.message_type))
