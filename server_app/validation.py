"""Reply validation: every client reply is checked before it can touch server state.

`ClientGrid` runs `ReplyValidator.problem` on each reply it receives; a reply with a problem is turned
into an error reply whose reason names the check, so every caller (the round loop, FLT's phases, any
strategy's extra exchanges) skips it the way it skips a client that crashed, and the round goes on.

Checks, in order (the first failure is reported):
1. **records**: the reply carries only records of the message contract (`strategies.shared.messages`
   names, each method's contract names and the model records it declares, `Method.model_records`, e.g.
   IFCA's `cluster-<i>`, and names the request itself used); training and evaluation replies carry a
   `metrics` record.
2. **num-examples**: training replies report a positive `num-examples` not above the train-set size
   the client declared in `query.identify`; evaluation replies a non-negative one not above its
   declared test-set size.
3. **finite values**: every floating-point array of every ArrayRecord is finite.
4. **model structure**: a returned model (`model`, `personal`, `global`, a method's declared model
   record such as `cluster-<i>`, or a record
   named like one the request carried) has exactly the array names, shapes and dtypes of the model
   the client was sent.
5. **update norm**: ||returned model − nearest model sent||₂ ≤ `max-update-norm` (0 disables).
"""

from __future__ import annotations

import math
from fnmatch import fnmatchcase
from types import ModuleType
from collections.abc import Mapping

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from strategies.shared import messages as contract

INVALID_REPLY = 100  # error code of a reply dropped by validation (Flower's own codes are < 10)

MODEL_RECORDS = frozenset({contract.GLOBAL, contract.PERSONAL, contract.MODEL})


def record_names(module: ModuleType) -> set[str]:
    """The record names a contract module defines: its upper-case str constants other than message
    types."""
    return {value for key, value in vars(module).items()
            if key.isupper() and isinstance(value, str) and "." not in value
            and not key.startswith(("TRAIN", "EVALUATE", "QUERY", "IDENTIFY"))}


def known_record_names() -> frozenset[str]:
    """Every record name the contracts define: the shared messages' and each registered method's
    contract module's (the module of its settings), for reply validation."""
    import sys

    from strategies.shared.registry import METHODS

    modules = {contract, *(sys.modules[m.settings.__module__] for m in METHODS.values()
                           if m.settings is not None)}
    return frozenset(name for module in modules for name in record_names(module))


def model_record_patterns() -> tuple[str, ...]:
    """The shared model record names and every registered method's declared model-record patterns
    (`Method.model_records`), for reply validation."""
    from strategies.shared.registry import METHODS

    declared = sorted({p for m in METHODS.values() for p in m.model_records})
    return (*sorted(MODEL_RECORDS), *declared)


def _structure(record: ArrayRecord) -> dict[str, tuple[tuple[int, ...], str]]:
    return {name: (tuple(array.shape), array.dtype) for name, array in record.items()}


def _distance(a: ArrayRecord, b: ArrayRecord) -> float:
    """||a − b||₂ over all arrays of two records of the same structure (array by array: no
    flattened copy of the whole model)."""
    return math.sqrt(sum(float(np.square(x.numpy() - b[name].numpy(), dtype=np.float64).sum())
                         for name, x in a.items()))


class ReplyValidator:
    """Checks replies against the request they answer and what each client declared about itself."""

    def __init__(self, max_update_norm: float = 0.0, known: frozenset[str] | None = None,
                 model_records: tuple[str, ...] | None = None) -> None:
        self.max_update_norm = max_update_norm
        self.train_sizes: dict[int, int] = {}  # client id -> declared train-set size
        self.test_sizes: dict[int, int] = {}
        # record names a reply may carry: the shared contract's, plus the methods' (registry)
        self.known = known if known is not None else frozenset(record_names(contract))
        # names / fnmatch patterns of records that carry a model: the shared ones, plus the methods'
        self.model_records = model_records if model_records is not None else tuple(sorted(MODEL_RECORDS))

    def is_model_record(self, name: str) -> bool:
        """Whether record `name` carries a model (checked against the models sent)."""
        return any(fnmatchcase(name, pattern) for pattern in self.model_records)

    def declare(self, client: int, train_size: int, test_size: int) -> None:
        self.train_sizes[client] = train_size
        self.test_sizes[client] = test_size

    def problem(self, client: int, request: Message, reply: Message) -> str | None:
        """None if `reply` may be used, else '<check>: <what was wrong>'."""
        kind = request.metadata.message_type
        sent = request.content
        content = reply.content
        training = kind.split(".")[0] == "train"
        evaluation = kind.split(".")[0] == "evaluate"
        unknown = sorted(set(content.keys()) - self.known - set(sent.keys())
                         - {n for n in content.keys() if self.is_model_record(n)})
        if unknown:
            return f"records: unexpected record(s) {unknown} in a '{kind}' reply"
        if (training or evaluation) and not isinstance(content.get(contract.METRICS), MetricRecord):
            return f"records: a '{kind}' reply must carry a '{contract.METRICS}' MetricRecord"
        if training or evaluation:
            problem = self._examples(client, content[contract.METRICS], training)
            if problem:
                return problem
        for name, record in content.items():
            if not isinstance(record, ArrayRecord):
                continue
            for array_name, array in record.items():
                values = array.numpy()
                if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
                    bad = int((~np.isfinite(values)).sum())
                    return (f"finite values: array '{name}/{array_name}' has {bad} NaN/inf "
                            f"entr{'y' if bad == 1 else 'ies'}")
        sent_models = {n: r for n, r in sent.items()
                       if isinstance(r, ArrayRecord) and self.is_model_record(n)}
        for name, record in content.items():
            if not isinstance(record, ArrayRecord):
                continue
            references = ({name: sent[name]} if isinstance(sent.get(name), ArrayRecord)
                          else sent_models if self.is_model_record(name) else {})
            if not references:
                continue
            problem = self._matches(name, record, references)
            if problem:
                return problem
        return None

    def _examples(self, client: int, metrics: MetricRecord, training: bool) -> str | None:
        value = metrics.get("num-examples")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return f"num-examples: missing or not a number ({value!r})"
        declared = (self.train_sizes if training else self.test_sizes).get(client)
        split = "train" if training else "test"
        if value < (1 if training else 0):
            return f"num-examples: {value} is not {'positive' if training else 'non-negative'}"
        if declared is not None and value > declared:
            return (f"num-examples: {value} is above the {declared} {split} samples the client "
                    "declared")
        return None

    def _matches(self, name: str, record: ArrayRecord,
                 references: Mapping[str, ArrayRecord]) -> str | None:
        structure = _structure(record)
        candidates = [(ref, r) for ref, r in references.items() if _structure(r) == structure]
        if not candidates:
            ref_name, ref = next(iter(references.items()))
            expected = _structure(ref)
            diff = sorted(set(structure) ^ set(expected)) or [
                k for k in structure if structure[k] != expected.get(k)]
            key = diff[0]
            return (f"model structure: '{name}' does not match the model sent as '{ref_name}' "
                    f"(array '{key}': got {structure.get(key, 'nothing')}, expected "
                    f"{expected.get(key, 'nothing')})")
        if self.max_update_norm > 0:
            norm = min(_distance(record, r) for _, r in candidates)
            if not norm <= self.max_update_norm:
                return (f"update norm: ||'{name}' − model sent|| = {norm:.4g} exceeds "
                        f"max-update-norm = {self.max_update_norm:g}")
        return None

