"""What does a graph method's client answer with at the last evaluation, against its own model and the model it received?

    python -m benchmarks.studies.safeguard_answers --name safeguard-answers --runs shards:flt,domains:sfl --seeds 0,1,2,3,4,5

Runs `method` on the robustness suite's `setting` (benchmarks/suite.py: its budget and data
settings, ρ = `--rho`) in process, with the safeguard's evaluation (`client_app.safeguard.evaluate`)
wrapped for the run: at every evaluation each client's own model (the one it last trained, before
the evaluation fine-tunes anything) and the model it received are also tested on its test split.
Writes `benchmarks/results/<name>.{md,json}`: per run, the final personalized mean and, over the
clients at the last evaluation, the mean test accuracy of the own model, of the received model and
of the answer, the own model's mean weight in the chosen mix and the share of clients that answered
with the fine-tuned mix. The runs are the suite's runs of the same cell, seed and `--set` keys (the
wrapper only adds test passes), so the final means equal the suite's.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (RESULTS_DIR, benchmark_parser, code_version, log_progress,
                               machine_facts, parse_set, set_threads, write_study)

FIELDS = ("own", "received", "answer", "own-weight", "finetuned")


def last_answers(overrides: dict[str, Any]) -> dict[str, Any]:
    """Run `overrides` in process; the final personalized mean and the means over clients of
    `FIELDS` at the last evaluation."""
    from client_app import safeguard
    from client_app.runtime import client_runtime
    from client_app.training import evaluate as test_model
    from server_app.harness.simulate import simulate
    from strategies.shared.evidence import SAFEGUARD
    from strategies.shared.messages import CONFIG, METRICS, PERSONAL, EvaluateInstructions

    seen: list[dict[str, float]] = []
    original = safeguard.evaluate

    def evaluate(message, context, guard):
        rt = client_runtime(message, context)
        ins = EvaluateInstructions.read(message.content[CONFIG])
        x, y = rt.tensors("test")
        own = safeguard.own_model(context, rt.client_id)
        row = {"round": ins.server_round,
               "received": test_model(rt.model(message.content[PERSONAL]), x, y,
                                      ins.batch_size).accuracy}
        if own is not None:
            row["own"] = test_model(rt.model(own), x, y, ins.batch_size).accuracy
        reply = original(message, context, guard)
        report = reply.content[SAFEGUARD]
        row["answer"] = float(reply.content[METRICS]["accuracy"])
        row["own-weight"] = float(report["own"])
        if "finetuned" in report:
            row["finetuned"] = float(report["finetuned"])
        seen.append(row)
        return reply

    safeguard.evaluate = evaluate
    try:
        summary = simulate(overrides)
    finally:
        safeguard.evaluate = original
    if not seen:
        raise ValueError(f"safeguard_answers: method {overrides['method']!r} ran no safeguard "
                         "evaluation (the safeguard is for the graph methods)")
    last = max(r["round"] for r in seen)
    rows = [r for r in seen if r["round"] == last]
    means = {}
    for key in FIELDS:  # accuracies and the fine-tuned share in %, the own weight as it is
        values = [r[key] for r in rows if key in r]
        scale = 1.0 if key == "own-weight" else 100.0
        means[key] = scale * sum(values) / len(values) if values else None
    return {"final": summary["final"]["personalized"]["mean"], "round": last, "clients": len(rows),
            **means}


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    from docs.render import provenance

    lines = [*provenance(meta, f"# {meta['name']}: what the safeguard's clients answer with at the "
                               "last evaluation"), "",
             f"Suite budget {meta['common']}, ρ = {meta['rho']:g}. Over the clients at the last "
             "evaluation: test accuracy (%) of the own model (before the evaluation's fine-tuning), "
             "of the received model and of the answer; the own model's mean weight in the chosen "
             "mix; the share of clients answering with the fine-tuned mix.", "",
             "| setting | method | seed | final | own | received | answer | own weight | fine-tuned (% of clients) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    fmt = lambda v, spec=".2f": "—" if v is None else format(v, spec)
    for r in rows:
        lines.append(f"| {r['setting']} | {r['method']} | {r['seed']} | {fmt(r['final'])} | "
                     f"{fmt(r['own'])} | {fmt(r['received'])} | {fmt(r['answer'])} | "
                     f"{fmt(r['own-weight'], '.3f')} | {fmt(r['finetuned'], '.2f')} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.safeguard_answers", __doc__)
    parser.add_argument("--name", default="safeguard-answers")
    parser.add_argument("--runs", required=True,
                        help="comma-separated setting:method pairs (the suite's settings)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rho", type=float, default=1.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a run-config key for every run (repeatable)")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    from benchmarks.suite import COMMON, SETTINGS

    pairs = [tuple(item.split(":", 1)) for item in args.runs.split(",")]
    bad = [":".join(p) for p in pairs if len(p) != 2 or p[0] not in SETTINGS]
    if bad:
        raise SystemExit(f"--runs: {', '.join(bad)} is not setting:method with a setting of "
                         f"{', '.join(SETTINGS)}")
    extra = parse_set(args.set)
    log_progress()
    set_threads(1)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for setting, method in pairs:
        for seed in (int(s) for s in args.seeds.split(",")):
            overrides = {**COMMON, **SETTINGS[setting].overrides, "fraction-train": args.rho,
                         "seed": seed, "method": method, **extra}
            row = {"setting": setting, "method": method, "seed": seed, **last_answers(overrides)}
            rows.append(row)
            print(row, flush=True)
    meta = {"name": args.name,
            "command": "python -m benchmarks.studies.safeguard_answers " + shlex.join(argv),
            "date": started, "machine": machine_facts(), "code": code_version(),
            "common": COMMON, "rho": args.rho, "set": extra}
    write_study(Path(args.results_dir), args.name, {**meta, "rows": rows}, markdown(meta, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
