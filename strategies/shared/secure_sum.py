"""The server half of secure aggregation (`secure-aggregation = 'secagg+'`,
strategies/shared/secure_aggregation.py): a wrapper of a strategy whose server needs only the
weighted mean of the sampled clients' models. Only the server imports it.

Flower's own server half, `flwr.server.workflow.SecAggPlusWorkflow`, cannot be driven by Bouquet's
runner: it runs only with a `LegacyContext` (it raises TypeError otherwise), samples through the
legacy `Strategy.configure_fit` and `ClientManager`, sends and waits itself
(`grid.send_and_receive` in each stage), identifies a reply by `metadata.src_node_id` (the node, where
Bouquet's client is a logical client that may share its node) and hands the result to the legacy
`aggregate_fit` as `FitRes`. So this wrapper sends the same four stages as Bouquet phases (the
runner sends, validates and counts them) and does the protocol's arithmetic with Flower's functions
(`flwr.common.secure_aggregation`: Shamir `combine_shares`, `generate_shared_key`,
`pseudo_rand_gen`, the modular sums, `factor_extract`, `dequantize`), stage by stage as
`SecAggPlusWorkflow` does; the cryptography is Flower's, none is written here.

Per round: `before_train` samples the round's clients with the wrapped strategy's own
`configure_train`, runs `setup` and `share-keys`, and keeps the train messages with each client's
shares attached (`configure_train` hands them to the runner); `aggregate_train` sums the masked
vectors of the clients that answered (modulo 2**32) and returns the round's model record, still the
model that was sent; `after_aggregate` runs `unmask` and writes the weighted mean into that record,
so the runner's round ends with it. A round whose protocol cannot finish (too few clients left to
rebuild a secret) keeps the model it sent, as a round nobody trained in.

A strategy that shares only part of its model (`secure_part`, a key prefix; the partial-sharing
base, strategies/shared/partial.py) has only the arrays of that part summed: its clients keep the
rest; it takes the replies' metrics in its own `aggregate_train` (which leaves the masked replies
out of its client models) and the unmasked mean in `take_secure_mean`, and the round returns no
global model.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy

from strategies.shared.messages import METRICS
from strategies.shared.phases import ClientKeyed, Phase, PhasedStrategy, Replies, Steps
from strategies.shared.reporter import MethodReporter
from strategies.shared.secure_aggregation import (MODULUS_RANGE, PART, QUERY_SECAGG, RECORD,
                                                  SECAGG, sampled_per_round, shares, threshold)

if TYPE_CHECKING:
    from flwr.serverapp import Grid

    from strategies.shared.priors import ClientReports
    from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")

DEFAULT_MAX_WEIGHT = 1000.0  # Flower's, until the clients have reported their train-set sizes
GRAPH_STREAM = 31  # keeps the neighbour graph's seeds apart from other seeded draws


def wrap(cfg: RunConfig, strategy: Strategy) -> Strategy:
    """`strategy`, wrapped for secure aggregation when the run config asks for it."""
    if cfg.secure_aggregation == "off":
        return strategy
    from datasets.partition import heldout_test_clients

    held_out = heldout_test_clients(cfg.data_spec.partition)
    return SecureAggregation(
        strategy, num_shares=cfg.secagg_num_shares,
        reconstruction_threshold=cfg.secagg_reconstruction_threshold,
        clipping_range=cfg.secagg_clipping_range,
        quantization_range=cfg.secagg_quantization_range, seed=cfg.seed,
        held_out=() if held_out is None else [int(c) for c in held_out],
        expected=sampled_per_round(cfg))


class _Online:
    """The reachable train clients, as the Grid surface Flower's sampling reads."""

    def __init__(self, clients: list[int]) -> None:
        self.clients = clients

    def get_node_ids(self) -> list[int]:
        return list(self.clients)


class RoundProtocol:
    """One round's protocol state (the server's view, as Flower's `WorkflowState`)."""

    def __init__(self, sent: ArrayRecord, messages: dict[int, Message], record: str) -> None:
        self.sent = sent  # the model record the round's train messages carry
        self.messages = messages  # client -> its train message
        self.record = record
        self.num_shares = 0
        self.threshold = 0
        self.neighbours: dict[int, set[int]] = {}
        self.public_keys: dict[int, tuple[bytes, bytes]] = {}
        self.shared: set[int] = set()  # clients whose shares went out (completed share-keys)
        self.masked: dict[int, list[np.ndarray]] = {}  # client -> masked vector (collect stage)
        self.total: list[np.ndarray] = []  # their sum, modulo 2**32
        self.result: ArrayRecord | None = None  # the record aggregate_train returned


class SecureAggregation(Strategy, PhasedStrategy, ClientKeyed, MethodReporter):
    """SecAgg+ around a FedAvg-type strategy (module doc). `num_shares`, `reconstruction_threshold`:
    the run config's (0: every sampled client, a majority); the clipping and quantization ranges
    are Flower's `SecAggPlusWorkflow` parameters of the same names; the masks' modulus is 2**32."""

    label_sets_key = None  # takes the clients' reports (train-set sizes), asks for no label sets

    def __init__(self, strategy: Strategy, *, num_shares: int, reconstruction_threshold: int,
                 clipping_range: float, quantization_range: int, seed: int,
                 held_out: Iterable[int] = (), expected: int = 0) -> None:
        super().__init__()
        self.strategy = strategy
        self.num_shares = num_shares
        self.reconstruction_threshold = reconstruction_threshold
        self.clipping_range = clipping_range
        self.quantization_range = quantization_range
        self.seed = seed
        self.held_out = frozenset(held_out)
        self.expected = expected
        self.max_weight = DEFAULT_MAX_WEIGHT
        self.protocol: RoundProtocol | None = None
        # the key prefix of the summed arrays ('' = the whole model, the round's global model)
        self.part: str = getattr(strategy, "secure_part", "")
        self.rounds: dict[int, dict[str, Any]] = {}  # round -> what the protocol did (report)

    def __getattr__(self, name: str) -> Any:  # the wrapped strategy's other attributes
        if name.startswith("__") or name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def __getstate__(self) -> dict[str, Any]:  # a checkpoint holds no round's protocol state
        return {**self.__dict__, "protocol": None}

    # --- reporting: the wrapped strategy's, and what the protocol did each round ---------------
    def round_report(self, server_round: int) -> dict[str, Any]:
        """The wrapped strategy's round fields, and `secagg`: clients sampled, surviving and
        dropped, whether the round's sum was unmasked (`completed`)."""
        inner = (self.strategy.round_report(server_round)
                 if isinstance(self.strategy, MethodReporter) else {})
        done = self.rounds.get(server_round)
        return {**inner, **({"secagg": dict(done)} if done is not None else {})}

    def report(self, directory: Path, truth: Any) -> dict[str, Any]:
        return (self.strategy.report(directory, truth)
                if isinstance(self.strategy, MethodReporter) else {})

    def client_graph(self) -> np.ndarray | None:
        return (self.strategy.client_graph()
                if isinstance(self.strategy, MethodReporter) else None)

    def take_reports(self, reports: ClientReports) -> None:
        """The largest train set any client declared weighs 1 (Flower's `max_weight`): weights
        n_k / max stay within [0, 1], so the quantized weighted values stay within the range."""
        sizes = [n for n in reports.train_sizes.values() if n > 0]
        if sizes:
            self.max_weight = float(max(sizes))
        take = getattr(self.strategy, "take_reports", None)
        if take is not None:
            take(reports)

    # --- the protocol's phases -----------------------------------------------------------------
    def before_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                     online: list[int]) -> Steps[None]:
        """Sample the round's clients, then `setup` and `share-keys`."""
        self.protocol = None
        train = _Online([c for c in online if c not in self.held_out])
        messages = {m.metadata.dst_node_id: m
                    for m in self.strategy.configure_train(server_round, arrays, config, train)}
        if not messages:
            return
        first = next(iter(messages.values()))
        record = next(n for n, r in first.content.items() if isinstance(r, ArrayRecord))
        state = RoundProtocol(first.content[record], messages, record)
        sampled = sorted(messages)
        if len(sampled) < 3:
            log.warning("round %d: secure aggregation needs 3 or more clients, %d sampled; no "
                        "training this round", server_round, len(sampled))
            self.rounds[server_round] = {"sampled": len(sampled), "completed": False}
            return
        state.num_shares = shares(self.num_shares, len(sampled))
        state.threshold = min(threshold(self.reconstruction_threshold, state.num_shares),
                              state.num_shares)
        # the neighbour graph (SecAgg+): a ring of the sampled clients in a seeded random order,
        # each client with num_shares // 2 on each side (itself included), as Flower's setup stage
        order = list(sampled)
        random.Random(self.seed * 1_000_003 + server_round * 7919 + GRAPH_STREAM).shuffle(order)
        half = state.num_shares // 2
        state.neighbours = {c: {order[(i + k) % len(order)] for k in range(-half, half + 1)}
                            for i, c in enumerate(order)}
        from flwr.common.secure_aggregation.secaggplus_constants import Key, Stage

        setup = {Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: len(sampled),
                 Key.SHARE_NUMBER: state.num_shares, Key.THRESHOLD: state.threshold,
                 Key.CLIPPING_RANGE: float(self.clipping_range),
                 Key.TARGET_RANGE: int(self.quantization_range), Key.MOD_RANGE: MODULUS_RANGE,
                 Key.MAX_WEIGHT: float(self.max_weight)}
        replies = yield Phase("secagg setup", [_query(c, dict(setup)) for c in sampled])
        for client, reply in replies:
            record = reply.content.get(SECAGG)
            if isinstance(record, ConfigRecord):
                state.public_keys[client] = (record[Key.PUBLIC_KEY_1], record[Key.PUBLIC_KEY_2])
        if not self._enough(server_round, state, set(state.public_keys), "setup"):
            return
        active = set(state.public_keys)
        replies = yield Phase("secagg share-keys", [
            _query(c, {Key.STAGE: Stage.SHARE_KEYS,
                       **{str(n): list(state.public_keys[n])
                          for n in sorted(state.neighbours[c] & active)}})
            for c in sorted(active)])
        forward: dict[int, tuple[list[int], list[bytes]]] = {}
        for client, reply in replies:
            record = reply.content.get(SECAGG)
            if not isinstance(record, ConfigRecord):
                continue
            state.shared.add(client)
            for dst, ciphertext in zip(record[Key.DESTINATION_LIST], record[Key.CIPHERTEXT_LIST],
                                       strict=True):
                srcs, texts = forward.setdefault(int(dst), ([], []))
                srcs.append(client)
                texts.append(ciphertext)
        if not self._enough(server_round, state, state.shared, "share-keys"):
            return
        for client in sorted(state.shared):
            srcs, texts = forward.get(client, ([], []))
            kept = [(s, t) for s, t in zip(srcs, texts) if s in state.shared]
            message = state.messages[client]  # FedAvg's messages share one content: copy it
            records = dict(message.content.items())
            records[SECAGG] = ConfigRecord({
                Key.STAGE: Stage.COLLECT_MASKED_VECTORS,
                Key.SOURCE_LIST: [s for s, _ in kept], Key.CIPHERTEXT_LIST: [t for _, t in kept],
                RECORD: "", PART: self.part})  # the reply's one model record (its part)
            state.messages[client] = Message(RecordDict(records), dst_node_id=client,
                                             message_type=message.metadata.message_type,
                                             group_id=message.metadata.group_id)
        self.protocol = state

    def _enough(self, server_round: int, state: RoundProtocol, alive: set[int], stage: str) -> bool:
        """Whether every client still in the protocol has `threshold` neighbours in `alive` (Flower's
        `_check_threshold`); otherwise the round is given up (logged)."""
        short = [c for c in sorted(alive) if len(state.neighbours[c] & alive) < state.threshold]
        if short or len(alive) < state.threshold:
            log.warning("round %d: secure aggregation stopped after %s: %d client(s) left, "
                        "fewer than the %d that rebuild a secret; the model stays as it is",
                        server_round, stage, len(alive), state.threshold)
            self.rounds[server_round] = {"sampled": len(state.messages), "completed": False,
                                         "stopped-at": stage}
            return False
        return True

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The train messages `before_train` prepared (none if the protocol stopped there)."""
        state = self.protocol
        if state is None:
            return []
        return [state.messages[c] for c in sorted(state.shared)]

    def aggregate_train(self, server_round: int, replies: Replies
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sum the masked vectors (mod 2**32); the metrics as the wrapped FedAvg aggregates them.
        Returns the record `after_aggregate` fills with the unmasked mean."""
        from flwr.common.secure_aggregation.ndarrays_arithmetic import parameters_mod
        from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

        state = self.protocol
        if state is None:
            return None, None
        for client, reply in replies:
            record = reply.content.get(SECAGG)
            if client in state.shared and isinstance(record, ArrayRecord):
                state.masked[client] = [a.numpy().astype(np.int64) for a in record.values()]
        if not state.masked:
            return None, None
        state.total = parameters_mod(
            [sum(vectors) for vectors in zip(*state.masked.values())], MODULUS_RANGE)
        state.result = ArrayRecord({n: Array(np.array(a.numpy(), copy=True))
                                    for n, a in state.sent.items() if n.startswith(self.part)})
        if self.part:  # a part: the strategy takes the metrics, the mean after unmask
            _, metrics = self.strategy.aggregate_train(
                server_round, [(c, r) for c, r in replies if c in state.masked])
            return None, metrics
        contents = [RecordDict({METRICS: reply.content[METRICS]}) for client, reply in replies
                    if client in state.masked]
        key = getattr(self.strategy, "weighted_by_key", "num-examples")
        aggregate = getattr(self.strategy, "train_metrics_aggr_fn", aggregate_metricrecords)
        metrics = aggregate(contents, key)
        return state.result, metrics

    def after_aggregate(self, server_round: int, online: list[int]) -> Steps[None]:
        """`unmask`: the survivors' shares; the weighted mean written into the round's record."""
        from flwr.common.secure_aggregation.crypto.shamir import combine_shares
        from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
        from flwr.common.secure_aggregation.ndarrays_arithmetic import (
            factor_extract, parameters_addition, parameters_mod, parameters_subtraction)
        from flwr.common.secure_aggregation.quantization import dequantize
        from flwr.common.secure_aggregation.secaggplus_constants import Key, Stage
        from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
        from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

        state, self.protocol = self.protocol, None
        if state is None or state.result is None:
            return
        survivors = set(state.masked)
        dropped = state.shared - survivors
        replies = yield Phase("secagg unmask", [
            _query(c, {Key.STAGE: Stage.UNMASK,
                       Key.ACTIVE_NODE_ID_LIST: sorted(state.neighbours[c] & survivors),
                       Key.DEAD_NODE_ID_LIST: sorted(state.neighbours[c] & dropped)})
            for c in sorted(survivors)])
        collected: dict[int, list[bytes]] = {c: [] for c in state.shared}
        for client, reply in replies:
            record = reply.content.get(SECAGG)
            if not isinstance(record, ConfigRecord):
                continue
            for owner, share in zip(record[Key.NODE_ID_LIST], record[Key.SHARE_LIST], strict=True):
                if int(owner) in collected and int(owner) in state.neighbours[client]:
                    collected[int(owner)].append(share)
        short = sorted(c for c, got in collected.items() if len(got) < state.threshold)
        report = {"sampled": len(state.messages), "survivors": len(survivors),
                  "dropped": sorted(dropped), "threshold": state.threshold,
                  "num-shares": state.num_shares}
        if short:
            log.warning("round %d: secure aggregation cannot unmask: clients %s have fewer than %d "
                        "shares back; the model stays as it is", server_round, short[:5],
                        state.threshold)
            self.rounds[server_round] = {**report, "completed": False, "stopped-at": "unmask"}
            return
        total = state.total
        shapes = [a.shape for a in total]
        for client, got in sorted(collected.items()):
            secret = combine_shares(got)
            if client in survivors:  # its own mask, from its mask seed
                total = parameters_subtraction(total, pseudo_rand_gen(secret, MODULUS_RANGE, shapes))
                continue
            # a dropped client: its pairwise masks with the survivors, from its first private key
            for other in sorted(state.neighbours[client] & survivors):
                shared_key = generate_shared_key(bytes_to_private_key(secret),
                                                 bytes_to_public_key(state.public_keys[other][0]))
                mask = pseudo_rand_gen(shared_key, MODULUS_RANGE, shapes)
                # the survivor added the mask if its id is larger, else subtracted it
                total = (parameters_subtraction(total, mask) if other > client
                         else parameters_addition(total, mask))
        total = parameters_mod(total, MODULUS_RANGE)
        weight, values = factor_extract(total)
        mean = dequantize(values, self.clipping_range, self.quantization_range)
        offset = -(len(survivors) - 1) * self.clipping_range
        scale = self.quantization_range / float(weight)
        for (name, sent), value in zip([(n, a) for n, a in state.sent.items()
                                        if n.startswith(self.part)], mean, strict=True):
            dtype = sent.numpy().dtype
            averaged = (value + offset) * scale
            if not np.issubdtype(dtype, np.floating):
                averaged = np.rint(averaged)
            state.result[name] = Array(np.asarray(averaged, dtype=dtype).reshape(sent.shape))
        if self.part:
            self.strategy.take_secure_mean(state.result)
        self.rounds[server_round] = {**report, "completed": True}
        log.info("round %d: secure aggregation unmasked the sum of %d clients (%d dropped)",
                 server_round, len(survivors), len(dropped))

    # --- the rest is the wrapped strategy's ----------------------------------------------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Any]) -> Any:
        pairs = list(replies)
        if isinstance(self.strategy, ClientKeyed):
            return self.strategy.aggregate_evaluate(server_round, pairs)
        return self.strategy.aggregate_evaluate(server_round, [reply for _, reply in pairs])

    def summary(self) -> None:
        self.strategy.summary()


def _query(client: int, config: dict[str, Any]) -> Message:
    """A `query.secagg` message to `client` carrying the stage's `secagg` record."""
    return Message(RecordDict({SECAGG: ConfigRecord(config)}), dst_node_id=client,
                   message_type=QUERY_SECAGG)
