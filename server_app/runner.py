"""The round loop: drives any Flower message-API strategy over a `ClientGrid` and records metrics.

Per round: configure_train → send → aggregate_train; every `eval-every` rounds and at the end the
round's model(s) are evaluated (configure_evaluate → send → per-client metrics), by default with the
next round's train message (`fuse-evaluate`: one phase per round, see `strategies.shared.fusion`) and after
the last round in an evaluate-only phase. Failed or missing replies are logged with the client id
and skipped. Replies reach the strategy sorted by client id, so aggregation order (and therefore the
floating-point result) does not depend on arrival order.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from datasets.partition import heldout_test_clients
from datasets.sources import dataset_task
from server_app.callbacks import ResumeError, RunCallback, RunView, Stateful
from server_app.metrics import accuracy_summary, regression_summary
from server_app.reporting import RunRecorder
from server_app.clients import ClientGrid, TrainClients
from strategies.shared.priors import ClientReports, TakesClientReports
from strategies.shared.provenance import code_fingerprint
from strategies.shared.run_config import RunConfig
from strategies.shared.messages import (
    METRICS,
    EvaluateInstructions,
    EvaluateReply,
    TrainInstructions,
)
from strategies.shared.phases import (
    ClientKeyed,
    CountsTraffic,
    PhasedStrategy,
    Replies,
    Steps,
    run_phases,
)
from server_app.validation import ReplyValidator, known_record_names, model_record_patterns

log = logging.getLogger("flwr.bouquet")


# Keys of a round record that summary.json's `final` / `round-0` keep: classification (percent) and
# regression (traffic errors, see `regression_record`).
RESULT_KEYS = ("personalized", "global-accuracy", "finetuned",
               "regression", "global-regression", "finetuned-regression")


class ClientsUnavailableError(RuntimeError):
    """Not every client became reachable before the connect timeout."""


def regression_record(rows: list[EvaluateReply]) -> dict[str, Any]:
    """Per-round regression results: `regression` (the model each client uses), `global-regression`
    (the global model) and `finetuned-regression` (global + local epochs), each a
    `regression_summary` over clients; the last two only when every client reported them."""
    def column(name: str) -> np.ndarray:
        return np.array([getattr(r, name) for r in rows], dtype=np.float64)

    record: dict[str, Any] = {"regression": regression_summary(
        column("mae"), column("mape"), column("rmse"),
        (column("mae_h12"), column("mape_h12"), column("rmse_h12"))
        if all(r.mae_h12 is not None for r in rows) else None,
    )}
    for prefix in ("global", "finetuned"):
        if all(getattr(r, f"{prefix}_mae") is not None for r in rows):
            record[f"{prefix}-regression"] = regression_summary(
                column(f"{prefix}_mae"), column(f"{prefix}_mape"), column(f"{prefix}_rmse"))
    return record


def train_devices(replies: list[Message]) -> dict[str, dict[str, int]]:
    """`trained-on`: how many clients trained on each device this round, from the `cuda` metric of
    their replies (absent when no reply reports it)."""
    flags = [int(r.content[METRICS]["cuda"]) for r in replies if "cuda" in r.content[METRICS]]
    if not flags:
        return {}
    counts = {"cpu": flags.count(0), "cuda": flags.count(1)}
    return {"trained-on": {device: n for device, n in counts.items() if n}}


class FederationRunner:
    """Runs one federation: the round loop and every exchange with the clients. Cross-cutting work
    is done by callbacks (`server_app.callbacks`, given as a list; the runner names none), which see
    the run as a `RunView`: the method's report (`MethodReporter`: per-round
    fields and final artifacts, with the ground truth the clients reported, `ClientReports`), byte
    counts, the round log, checkpoints and the TensorBoard event files. The server reads no client
    data: what it knows of the clients' data is what they report in `query.identify`."""

    def __init__(self, grid: Grid, cfg: RunConfig, strategy: Strategy, recorder: RunRecorder,
                 callbacks: Sequence[RunCallback] = ()):
        self.cfg = cfg
        self.view = RunView(cfg, recorder.directory, strategy)
        self.recorder = recorder
        # a strategy that builds a label-sharing graph asks the clients for their label sets
        label_sets = isinstance(strategy, TakesClientReports) and bool(strategy.label_sets_key)
        self.clients = ClientGrid(grid, cfg.num_clients, code_fingerprint(),
                                  ReplyValidator(cfg.max_update_norm, known_record_names(),
                                                 model_record_patterns()), label_sets=label_sets)
        self.reports: ClientReports | None = None  # what the clients reported, once all have
        held_out = heldout_test_clients(cfg.data_spec.partition)
        # training samples among the clients with training data only (held-out test clients: none)
        self.train_clients = self.clients if held_out is None else TrainClients(
            self.clients, sorted(set(range(cfg.num_clients)) - {int(c) for c in held_out}))
        self.latest: dict[int, dict[str, Any]] = {}  # client id -> last evaluation metrics
        # the state of the draws that choose clients (Flower's `sample_nodes` draws from `random`):
        # kept apart from the process's `random`, which Flower's own transport may draw from too, so
        # the choice depends only on the run seed and the rounds before, in process and deployed
        self.sampling = random.Random(cfg.seed).getstate()
        self.callbacks = list(callbacks)
        # what a checkpoint holds: the strategy and last metrics, the round history, and the state
        # of every callback that has some
        self.view.parts = {"federation": self, "rounds": recorder,
                           **{c.state_name: c for c in self.callbacks if isinstance(c, Stateful)}}
        for callback in self.callbacks:
            callback.attach(self.view)

    state_name = "federation"

    @property
    def strategy(self) -> Strategy:
        return self.view.strategy

    @strategy.setter
    def strategy(self, strategy: Strategy) -> None:
        self.view.strategy = strategy

    def state(self) -> dict[str, Any]:
        """The strategy (pickled whole: every method's state), each client's last metrics and the
        state of the client sampling draws."""
        return {"strategy": self.strategy, "latest": self.latest, "sampling": self.sampling}

    def restore(self, state: dict[str, Any]) -> None:
        self.strategy, self.latest = state["strategy"], state["latest"]
        self.sampling = state["sampling"]

    @contextmanager
    def sampling_draws(self) -> Iterator[None]:
        """Run a strategy's configure step (which may sample clients from `random`) on the run's own
        sampling state."""
        outside = random.getstate()
        random.setstate(self.sampling)
        try:
            yield
        finally:
            self.sampling = random.getstate()
            random.setstate(outside)

    # --- setup ------------------------------------------------------------------------------
    def connect(self, timeout: float) -> None:
        """Identify nodes until every client is hosted (or fail with who is missing), then take what
        the clients reported about their data (`take_reports`)."""
        deadline = time.monotonic() + timeout
        while True:
            self.clients.refresh(timeout=min(60.0, timeout))
            missing = self.clients.missing_clients()
            if not missing:
                self.take_reports()
                return
            if self.clients.identify_failures:  # a node that answered with an error won't recover
                node, reason = next(iter(self.clients.identify_failures.items()))
                raise ClientsUnavailableError(
                    f"node {node} failed to identify itself, so clients {missing[:5]} have no "
                    f"SuperNode: {reason}"
                )
            if time.monotonic() > deadline and self.clients.waiting_for():
                raise ClientsUnavailableError(
                    f"after {timeout:.0f} s {self.clients.waiting_for()}; start the SuperNodes of "
                    "the other clients (node_config data-dir) or lower num-clients")
            if time.monotonic() > deadline:
                raise ClientsUnavailableError(
                    f"{len(missing)} of {self.cfg.num_clients} clients have no SuperNode after "
                    f"{timeout:.0f} s (e.g. client ids {missing[:5]}); start SuperNodes with "
                    "--node-config \"partition-id=<i> num-partitions=<n>\" covering every client"
                )
            time.sleep(1.0)

    def take_reports(self) -> None:
        """The clients' reports (`ClientReports`): the ground truth of the method's report, and the
        strategy's when it uses them (`TakesClientReports`: a label-sharing graph, true groups)."""
        cfg = self.cfg
        spec = cfg.data_spec.partition
        names = spec.domain_names if spec.scheme == "domains" else None  # the config's, not data
        self.reports = ClientReports(cfg.num_clients, self.clients.reports,
                                     left_out=self.clients.left_out,
                                     train_sizes=dict(self.clients.validator.train_sizes),
                                     domain_names=names)
        truth = self.reports.truth()
        self.view.truth = truth
        log.info("client reports %s%s", self.reports.describe(),
                 "" if truth is not None and truth.cluster_ids is not None else
                 "; no ground-truth figures (no client reported a group or domain field)")
        if isinstance(self.strategy, TakesClientReports):
            self.strategy.take_reports(self.reports)

    def await_reachable(self, timeout: float) -> bool:
        """Whether some client is reachable, re-identifying nodes for up to `timeout` s when none is
        (Flower's samplers would otherwise wait forever for a node)."""
        deadline = time.monotonic() + timeout
        while not self.clients.get_node_ids():
            if time.monotonic() > deadline:
                return False
            time.sleep(1.0)
            self.clients.refresh(timeout=timeout)
        return True

    # --- messages ---------------------------------------------------------------------------
    def exchange(self, messages: list[Message], phase: str) -> Replies:
        """Send; failures and missing replies are logged by client id; (client id, reply) of the good
        replies, by client id."""
        return self.clients.exchange(messages, self.cfg.round_timeout, phase)

    def hand_traffic(self) -> None:
        """Tell a strategy that reports its traffic (`CountsTraffic`) the bytes of this round so far."""
        if isinstance(self.strategy, CountsTraffic):
            self.strategy.round_traffic = self.clients.round_bytes()

    def aggregate_train(self, server_round: int, replies: Replies) -> tuple[Any, Any]:
        """The strategy's `aggregate_train`: (client id, reply) pairs for a `ClientKeyed` strategy,
        the bare replies for Flower's own."""
        self.hand_traffic()
        if isinstance(self.strategy, ClientKeyed):
            return self.strategy.aggregate_train(server_round, replies)
        return self.strategy.aggregate_train(server_round, [reply for _, reply in replies])

    def aggregate_evaluate(self, server_round: int, replies: Replies) -> Any:
        """The strategy's `aggregate_evaluate`, with the replies as `aggregate_train`'s."""
        if isinstance(self.strategy, ClientKeyed):
            return self.strategy.aggregate_evaluate(server_round, replies)
        return self.strategy.aggregate_evaluate(server_round, [reply for _, reply in replies])

    def train_config(self, server_round: int) -> TrainInstructions:
        cfg = self.cfg
        return TrainInstructions(
            server_round=server_round, lr=cfg.lr, momentum=cfg.momentum,
            local_epochs=cfg.local_epochs, batch_size=cfg.batch_size, seed=cfg.seed,
        )

    def evaluate_config(self, server_round: int) -> EvaluateInstructions:
        cfg = self.cfg
        return EvaluateInstructions(
            server_round=server_round, batch_size=cfg.batch_size, seed=cfg.seed,
            finetune_epochs=cfg.finetune_epochs, lr=cfg.lr, momentum=cfg.momentum,
        )

    def request_records(self, kind: str, server_round: int) -> dict[str, ConfigRecord]:
        """The records callbacks add to every `kind` request of `server_round` (asked for with the
        config, before the method's own step of the phase)."""
        records: dict[str, ConfigRecord] = {}
        for callback in self.callbacks:
            records.update(callback.request_records(kind, server_round))
        return records

    @staticmethod
    def with_records(messages: list[Message], records: dict[str, ConfigRecord]) -> list[Message]:
        for message in messages:
            for name, record in records.items():
                message.content[name] = record
        return messages

    def reply_fields(self, hook: str, server_round: int, replies: Replies) -> dict[str, Any]:
        """Round-record fields the callbacks read from a phase's good replies (`hook`:
        train_replies / evaluate_replies)."""
        fields: dict[str, Any] = {}
        for callback in self.callbacks:
            fields.update(getattr(callback, hook)(server_round, replies))
        return fields

    # --- phases -----------------------------------------------------------------------------
    def evaluates(self, server_round: int) -> bool:
        """Round 0, every `eval-every`-th round and the last round are evaluated."""
        cfg = self.cfg
        return server_round % cfg.eval_every == 0 or server_round == cfg.num_rounds

    def run_phases(self, steps: Steps | None) -> Any:
        """Send the phases a method's step declares (`strategies.shared.phases`), hand back the replies."""
        def exchange(phase: Any) -> Replies:
            replies = self.clients.exchange(phase.messages, self.cfg.round_timeout, phase.name)
            self.hand_traffic()
            return replies

        return run_phases(steps, exchange)

    def method_step(self, hook: str, *args: Any) -> None:
        """Run the strategy's `hook` step (before_train, before_evaluate, after_aggregate) if it has
        exchanges of its own."""
        if isinstance(self.strategy, PhasedStrategy):
            self.run_phases(getattr(self.strategy, hook)(*args, self.clients.get_node_ids()))

    def evaluation_messages(self, server_round: int, arrays: ArrayRecord) -> list[Message]:
        config = self.evaluate_config(server_round).config()
        records = self.request_records("evaluate", server_round)
        self.method_step("before_evaluate", server_round, arrays, config)
        with self.sampling_draws():
            messages = list(self.strategy.configure_evaluate(server_round, arrays, config,
                                                             self.clients))
        return self.with_records(messages, records)

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, Any]:
        """An evaluate-only phase; the round's evaluation record."""
        replies = self.exchange(self.evaluation_messages(server_round, arrays), "evaluate")
        return self.evaluation_record(server_round, replies)

    def evaluation_record(self, server_round: int, replies: Replies) -> dict[str, Any]:
        """Aggregate evaluation replies (sorted by client id) into the round's record fields."""
        self.aggregate_evaluate(server_round, replies)
        rows = []
        for client, reply in replies:
            metrics = EvaluateReply.read(reply.content[METRICS])
            self.latest[client] = metrics.values()
            rows.append(metrics)
        if not rows:
            return {"evaluated-clients": 0}
        if all(r.mae is not None for r in rows):  # callbacks read classification replies only
            return {"evaluated-clients": len(rows), **regression_record(rows)}
        examples = np.array([r.num_examples for r in rows])
        result: dict[str, Any] = {
            "evaluated-clients": len(rows),
            "personalized": accuracy_summary(np.array([r.accuracy for r in rows]), examples),
        }
        if all(r.global_correct is not None for r in rows):
            result["global-accuracy"] = 100.0 * sum(r.global_correct for r in rows) / examples.sum()
        if all(r.finetuned_accuracy is not None for r in rows):
            result["finetuned"] = accuracy_summary(
                np.array([r.finetuned_accuracy for r in rows]), examples)
        result.update(self.reply_fields("evaluate_replies", server_round, replies))
        return result

    def train_phase(self, server_round: int, arrays: ArrayRecord, pending: dict[str, Any] | None
                    ) -> tuple[list[Message], Replies]:
        """Round `server_round`'s train messages and, when `pending` (a finished round whose
        evaluation is still due) is given, that evaluation in the same phase: each client gets one
        message (strategies.shared.fusion). Returns (train messages, good train replies); the pending
        record is completed with its evaluation."""
        evaluation = (self.evaluation_messages(pending["round"], arrays)
                      if pending is not None else [])
        config = self.train_config(server_round).config()
        records = self.request_records("train", server_round)
        self.method_step("before_train", server_round, arrays, config)
        for callback in self.callbacks:  # records that depend on what before_train exchanged
            records.update(callback.step_records("train", server_round))
        with self.sampling_draws():
            configured = list(self.strategy.configure_train(server_round, arrays, config,
                                                            self.train_clients))
        messages = self.with_records(configured, records)
        if pending is None:
            return messages, self.exchange(messages, "train")
        trained, evaluated = self.clients.exchange_fused(
            messages, evaluation, self.cfg.round_timeout, "train")
        pending.update(self.evaluation_record(pending["round"], evaluated))
        self._record_round(pending)
        return messages, trained

    def run(self, arrays: ArrayRecord, resume: bool = False) -> dict[str, Any]:
        """Round 0 (initial model) evaluation, then `num-rounds` rounds; returns the summary. With
        `resume`, continue after the round of the newest valid checkpoint instead.

        With `fuse-evaluate` (default) an evaluated round's record stays pending until its
        evaluation has come back with the next round's training (one phase per round); the last
        one is evaluated in a final evaluate-only phase. Without it, each evaluated round is
        followed by its own evaluate phase. Every metric keeps its value and its round either way.
        """
        cfg = self.cfg
        started = time.perf_counter()
        pending: dict[str, Any] | None  # the last round, when its evaluation is still due
        if resume:
            resumed = self.resume()
            arrays, last_round, self.earlier_seconds, pending = (
                resumed.arrays, resumed.server_round, resumed.seconds, resumed.pending)
        else:
            random.seed(cfg.seed)  # any other draw of the server from `random`
            last_round, self.earlier_seconds = 0, 0.0
            pending = {"round": 0, "seconds": 0.0, **self._traffic(0)}
            if not cfg.fuse_evaluate:
                pending = self._evaluate_pending(pending, arrays)
            self._round_finished(0, arrays, 0.0, pending)
        if pending is not None and not cfg.fuse_evaluate:  # resumed from a fused run's checkpoint
            pending = self._evaluate_pending(pending, arrays)
        for server_round in range(last_round + 1, cfg.num_rounds + 1):
            round_start = time.perf_counter()
            self.clients.round = server_round
            self.clients.refresh(timeout=cfg.round_timeout)
            if not self.await_reachable(cfg.round_timeout):
                log.warning("round %d: no client reachable within %.0f s; round skipped",
                            server_round, cfg.round_timeout)
                if pending is not None:
                    pending = self._evaluate_pending(pending, arrays)
                self._record_round({"round": server_round, "clients-trained": 0,
                                    "failed-clients": [],
                                    "unreachable-clients": list(range(cfg.num_clients)),
                                    "train-loss": None,
                                    "seconds": time.perf_counter() - round_start,
                                    **self._traffic(server_round)})
                continue
            messages, replies = self.train_phase(server_round, arrays, pending)
            pending = None
            trained = [client for client, _ in replies]
            failed = sorted({m.metadata.dst_node_id for m in messages} - set(trained))
            new_arrays, train_metrics = self.aggregate_train(server_round, replies)
            replied = self.reply_fields("train_replies", server_round, replies)
            self.method_step("after_aggregate", server_round)
            if new_arrays is not None:
                arrays = new_arrays
            record = {
                "round": server_round,
                "clients-trained": len(trained),
                "failed-clients": failed,
                "unreachable-clients": self.clients.missing_clients(),  # no SuperNode this round
                "train-loss": float(train_metrics["train-loss"]) if train_metrics else None,
                **train_devices([reply for _, reply in replies]),
                **replied,
            }
            if self.evaluates(server_round) and cfg.fuse_evaluate:
                # reported now, as its state is this round's; the evaluation follows next phase
                record.update(self._round_fields(server_round))
                record.update(seconds=time.perf_counter() - round_start,
                              **self._traffic(server_round))
                pending = record
            else:
                if self.evaluates(server_round):
                    record.update(self.evaluate(server_round, arrays))
                record.update(self._round_fields(server_round))
                record.update(seconds=time.perf_counter() - round_start,
                              **self._traffic(server_round))
                self._record_round(record)
            self._round_finished(server_round, arrays, time.perf_counter() - started, pending)
        if pending is not None:
            self._evaluate_pending(pending, arrays)
        self.final_arrays = arrays
        summary = self.summary(self.earlier_seconds + time.perf_counter() - started)
        for callback in self.callbacks:
            callback.run_finished(summary)
        return summary

    def _evaluate_pending(self, pending: dict[str, Any], arrays: ArrayRecord) -> None:
        """Complete and record a pending round with an evaluate-only phase; its seconds and bytes
        are added to the round's."""
        phase_start = time.perf_counter()
        pending.update(self.evaluate(pending["round"], arrays))
        pending["phases"] = pending.get("phases", 0) + self._traffic(pending["round"])["phases"]
        pending["seconds"] += time.perf_counter() - phase_start
        self._record_round(pending)
        return None

    def _traffic(self, server_round: int) -> dict[str, Any]:
        """The number of exchanges with clients (`phases`) since the last call, for the record of
        round `server_round`; the bytes per client since then go to the callbacks
        (`bytes_exchanged`)."""
        down, up = self.clients.take_traffic()
        for callback in self.callbacks:
            callback.bytes_exchanged(server_round, down, up)
        phases, self.clients.phases = self.clients.phases, 0
        return {"phases": phases}

    def resume(self) -> Any:
        """Where the run continues (`server_app.callbacks.Resumed`), from the first callback that
        resumes runs (checkpoints), every stateful component restored."""
        for callback in self.callbacks:
            resumed = callback.resume()
            if resumed is not None:
                return resumed
        raise ResumeError("cannot resume: this run keeps no checkpoints (checkpoint-every = 0 or "
                          "no checkpoint store); run without resume")

    def _record_round(self, record: dict[str, Any]) -> None:
        """Complete the round's record (callbacks: byte fields), write its rounds.jsonl line."""
        for callback in self.callbacks:
            callback.completing_round(record)
        self.recorder.record_round(record)
        for callback in self.callbacks:
            callback.round_recorded(record)

    def _round_fields(self, server_round: int) -> dict[str, Any]:
        self.hand_traffic()
        fields: dict[str, Any] = {}
        for callback in self.callbacks:
            fields.update(callback.round_fields(server_round))
        return fields

    def _round_finished(self, server_round: int, arrays: ArrayRecord, seconds: float,
                        pending: dict[str, Any] | None) -> None:
        for callback in self.callbacks:
            callback.round_finished(server_round, arrays, self.earlier_seconds + seconds, pending)

    def summary(self, total_seconds: float) -> dict[str, Any]:
        rounds = [r for r in self.recorder.rounds if r["round"] > 0]
        final = next(r for r in reversed(self.recorder.rounds)
                     if "personalized" in r or "regression" in r)
        devices = self.clients.devices()
        names, left_out = self.clients.client_names(), self.clients.left_out  # nodes' own data
        return {
            "method": self.cfg.method,
            "dataset": self.cfg.dataset,
            "task": dataset_task(self.cfg.dataset),
            "partition": self.cfg.partition,
            "num-clients": self.cfg.num_clients,
            "rounds": self.cfg.num_rounds,
            "final": {k: final[k] for k in ("round", *RESULT_KEYS) if k in final},
            "round-0": {k: self.recorder.rounds[0][k] for k in RESULT_KEYS
                        if k in self.recorder.rounds[0]},
            "seconds-per-round": statistics.median(r["seconds"] for r in rounds),
            "total-seconds": total_seconds,
            "devices": sorted(set(devices.values())),
            **({"left-out-clients": self.clients.left_out_clients()} if left_out else {}),
            "clients": [
                {"client-id": c, **({"name": names[c]} if c in names else {}),
                 **({"left-out": left_out[c][1]} if c in left_out else {}),
                 **self.latest.get(c, {}), "device": devices.get(c, "")}
                for c in range(self.cfg.num_clients)
            ],
        }
