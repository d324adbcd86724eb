"""What leaves a client, per method: every record each method's clients send, measured.

Runs every registered method for two rounds in process (`LocalGrid`, the real ClientApp) and records
every reply a client sends: its message type, each record's name and kind, the byte size of each
ArrayRecord (its arrays' data) and the keys of each ConfigRecord / MetricRecord. A fused reply (an
evaluation riding on a train message, `strategies.shared.fusion`) is split into its two halves, so each
row names the exchange it answers. The result, `benchmarks/results/what-leaves.json`, is rendered on
the docs' privacy page (`docs/blocks/privacy.py`), which says what each record reveals.

    python -m benchmarks.what_leaves [--set model=cnn] [--methods fedavg,flt]
"""

from __future__ import annotations

import datetime
import json
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord

from benchmarks.common import RESULTS_DIR, benchmark_parser, code_version, log, log_progress, \
    machine_facts, parse_set
from strategies.shared.fusion import is_fused, split_reply

OUTPUT = RESULTS_DIR / "what-leaves.json"
# a small federation every method can run: 4 clients of MNIST in 2 label clusters, 2 rounds
SETTINGS: dict[str, Any] = {
    "dataset": "mnist", "partition": "label-clusters", "num-clients": 4, "num-clusters": 2,
    "num-rounds": 2, "max-samples-per-client": 120, "model": "mlp", "seed": 0,
    "checkpoint-every": 0,
}
# what a method needs besides SETTINGS (FedCG's domain graph needs convolutional features)
METHOD_SETTINGS: dict[str, dict[str, Any]] = {"fedcg": {"model": "cnn"}}


def record_entry(name: str, record: Any) -> dict[str, Any]:
    """One record of a reply: its name, kind, and bytes (arrays) or keys (configs, metrics)."""
    if isinstance(record, ArrayRecord):
        return {"name": name, "kind": "arrays", "arrays": len(record),
                "bytes": sum(len(array.data) for array in record.values())}
    kind = "metrics" if isinstance(record, MetricRecord) else "config"
    assert isinstance(record, (ConfigRecord, MetricRecord))
    # a key whose value is empty (an unset optional field of the contract) sends nothing
    keys = [key for key, value in record.items() if value not in ("", [], None)]
    return {"name": name, "kind": kind, "keys": sorted(keys)}


def reply_entries(request: Message, reply: Message) -> list[tuple[str, dict[str, Any]]]:
    """(message type, record entry) of every record of `reply`, a fused reply split in two."""
    if reply.has_error():
        return []
    halves = [(request.metadata.message_type, reply)]
    if is_fused(request):
        train, evaluation = split_reply(request, reply)
        halves = [(request.metadata.message_type, train),
                  (evaluation.metadata.message_type, evaluation)]
    return [(kind, record_entry(name, record)) for kind, half in halves
            for name, record in half.content.items()]


def measure(method: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The records `method`'s clients sent in a two-round federation, by message type: each record
    name once, with the largest size seen and the union of keys."""
    from client_app.app import app as client_app
    from server_app.app import run
    from server_app.harness.local_grid import LocalGrid
    from strategies.shared.run_config import RunConfig, default_run_config

    sent: dict[tuple[str, str], dict[str, Any]] = {}

    class RecordingGrid(LocalGrid):
        def _deliver(self, message: Message) -> Message | None:
            reply = super()._deliver(message)
            if reply is not None:
                for kind, entry in reply_entries(message, reply):
                    known = sent.setdefault((kind, entry["name"]), entry)
                    if entry["kind"] == "arrays":
                        known["bytes"] = max(known["bytes"], entry["bytes"])
                    else:
                        known["keys"] = sorted(set(known["keys"]) | set(entry["keys"]))
            return reply

    with tempfile.TemporaryDirectory() as out:
        run_config = {**default_run_config(), **SETTINGS, **METHOD_SETTINGS.get(method, {}),
                      **overrides, "method": method, "output-dir": out, "run-name": method}
        cfg = RunConfig.from_flower(run_config)
        grid = RecordingGrid(client_app, cfg.num_clients, run_config)
        run(grid, cfg, connect_timeout=5.0)
    rows = [{"message": kind, **entry} for (kind, _), entry in sorted(sent.items())]
    return {"method": method, "model": model_size({**METHOD_SETTINGS.get(method, {}), **overrides}),
            "records": rows}


def model_size(overrides: dict[str, Any]) -> dict[str, Any]:
    """The model the sizes are for: its name, parameters and float32 bytes."""
    from datasets.sources import SOURCE_INFO
    from models import build_model

    settings = {**SETTINGS, **overrides}
    shape, classes = SOURCE_INFO[settings["dataset"]]
    model = build_model(settings["model"], shape, classes)
    state = model.state_dict()
    return {"model": settings["model"], "dataset": settings["dataset"],
            "parameters": sum(t.numel() for t in state.values()),
            "bytes": sum(t.numel() * t.element_size() for t in state.values())}


def main(argv: Sequence[str] | None = None) -> int:
    from strategies.shared.registry import method_names

    parser = benchmark_parser("benchmarks.what_leaves", __doc__)
    parser.add_argument("--methods", default="", help="comma-separated methods (default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="run-config override of the measuring federation")
    parser.add_argument("--out", default=str(OUTPUT))
    args = parser.parse_args(argv)
    log_progress()
    overrides = parse_set(args.set)
    methods = [m for m in args.methods.split(",") if m] or list(method_names())
    results = []
    for method in methods:
        log.info("what leaves a client: %s", method)
        results.append(measure(method, overrides))
    command = "python -m benchmarks.what_leaves" + "".join(f" --set {s}" for s in args.set) + (
        f" --methods {args.methods}" if args.methods else "")
    meta = {"command": command, "date": datetime.date.today().isoformat(), "code": code_version(),
            "machine": machine_facts(), "settings": {**SETTINGS, **overrides},
            "method-settings": METHOD_SETTINGS}
    with open(args.out, "w") as handle:
        json.dump({"meta": meta, "methods": results}, handle, indent=1)
        handle.write("\n")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
