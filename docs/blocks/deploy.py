"""docs/deploy.md and docs/deploy-cost.md: the deployed speed of every method, Bouquet against a
minimal Flower app, where one message's time goes and FedCG's balancing schedules."""

from __future__ import annotations

import statistics

from docs.blocks import block
from docs.blocks.data import DASH, joined, num, pct, raw, span, table, times

EVERY = "deploy-speed-every-method"
SIDE = "deploy-speed-side-by-side"
EARLIER = "deploy-speed"
PROFILE = "client-profile"
BOUQUET = "bouquet "
# why a method above ABOVE × FedAvg's s/round costs more (the numbers are generated beside it)
ABOVE = 1.5
WHY = {
    "fedska": "the fused schedule with E_g = `fedska.encoder-steps` = {default} (today's default) "
              "carries the split learning on the train messages, and its messages carry the slot "
              "features and the graph targets besides the model",
    "fedcg": "the balancing phase after each teacher replacement, and a FedCG message carries the "
             "model, the student and the teacher; the last round's extra phase also balances the "
             "teacher replaced in that round (for the final evaluation's test histogram)",
    "flt": "its one-shot first round (the autoencoder rounds and the embedding query); the other "
           "rounds are at FedAvg's cost, so the ratio falls with the number of rounds",
}


def _link(name: str, prefix: str) -> str:
    return f"[`{name}`]({prefix}results/{name}.md)"


def _runs(data: dict, poll: str | None = None) -> list[dict]:
    return [r for r in data["rows"] if poll is None or r["poll"] == poll]


def _methods(data: dict) -> list[tuple[str, float, float, list[int], int]]:
    """(method, mean s/round, ratio to fedavg, phases of rounds 1..R, rounds) as
    `benchmarks.studies.deploy_speed.methods_table` computes them."""
    runs = [r for r in data["rows"] if r["side"].startswith(BOUQUET)]
    fedavg = [statistics.mean(r["seconds"]) for r in runs if r["side"] == BOUQUET + "fedavg"]
    base = statistics.mean(fedavg)
    out, seen = [], []
    for r in runs:
        method = r["side"].removeprefix(BOUQUET)
        if method in seen:
            continue
        seen.append(method)
        same = [statistics.mean(x["seconds"]) for x in runs if x["side"] == r["side"]]
        phases = [p for p in r["phases"][1:] if p is not None]
        out.append((method, statistics.mean(same), statistics.mean(same) / base, phases,
                    len(r["seconds"])))
    return out


def _load(runs: list[dict]) -> str:
    return span([v for r in runs for v in (r["load-before"], r["load-after"])], 0)


@block("deploy-cost-methods")
def cost_methods(prefix: str) -> str:
    data = raw(EVERY)
    rows = _methods(data)
    rounds = sorted({r[4] for r in rows})
    job = data["job"]
    per_round = ", ".join(f"{m} {n}" for m, *_, n in rows if n != rows[0][4])
    head = (f"`benchmarks/studies/deploy_speed.py`: one loopback deployment (SuperLink and 3 SuperNodes, TLS "
            f"and SuperNode authentication), {job['dataset']}, {job['model']}, "
            f"{job['max-samples-per-client']} samples per client, {job['local-epochs']} local epoch, each "
            "method with the benchmark's `METHOD_SETTINGS` (small but complete settings for 3 "
            "clients; FedCG at its default teacher period); "
            f"{rows[0][4]} rounds per run" + (f" ({per_round})" if per_round else "")
            + ". Seconds per round are the mean over the run's rounds, the last including the final "
            f"evaluation. The 2-core machine's load average was {_load(data['rows'])} during the "
            f"session (the deployment's own processes included; per run in {_link(EVERY, prefix)}), "
            "so the timings carry that noise.")
    table_ = table(("method", "s/round (mean over the run)", "ratio to fedavg",
                    "phases, rounds 1..R"),
                   [(m, num(s), num(ratio), ", ".join(map(str, phases)))
                    for m, s, ratio, phases, _ in rows], align="lrrl")
    most = {m: max(phases[:-1], default=0) for m, _, _, phases, _ in rows}
    first_only = [m for m, _, _, phases, _ in rows if phases and phases[0] == most[m]
                  and max(phases[1:-1], default=0) < phases[0]]
    capped = max((most[m] for m in most if m not in first_only), default=0)
    bouquet = [r["median"] for r in data["rows"] if r["side"] == BOUQUET + "fedavg"]
    flower = [r["median"] for r in data["rows"] if r["side"] == "minimal flower fedavg"]
    above = [(m, ratio) for m, _, ratio, _, _ in rows if ratio > ABOVE]
    text = (f"No method needs more than {capped} phases in a round before the last (whose extra "
            "phase is the final evaluation)"
            + (", except the one-shot first round of " + ", ".join(first_only) if first_only else "")
            + ".")
    if bouquet and flower:
        b, f = statistics.median(bouquet), statistics.median(flower)
        text += (f" Bouquet's FedAvg against the minimal Flower app in the same session: {num(b)} vs "
                 f"{num(f)} s per round (medians), {times(b / f, 2)}.")
    if above:
        from strategies.shared import registry

        phases = {m: p for m, _, _, p, _ in rows}
        facts = {"busy": max(phases.get("fedska", [0])[1:-1], default=0),
                 "default": registry.sections()["fedska"].model_fields["encoder_steps"].default}
        runs = {r["side"].removeprefix(BOUQUET): r for r in data["rows"] if r["side"].startswith(BOUQUET)}
        base_load = _load([r for r in data["rows"] if r["side"] == BOUQUET + "fedavg"])

        def why(m: str) -> str:
            busy = max(phases[m][:-1], default=0)
            run = runs[m]
            parts = [f"{'one phase' if busy == 1 else f'up to {busy} phases'} in a round before the "
                     f"last, run at load average {num(run['load-before'], 1)} → "
                     f"{num(run['load-after'], 1)} (FedAvg's runs: {base_load})"]
            if m in WHY:
                parts.append(WHY[m].format(**facts))
            return "; ".join(parts)

        text += f"\n\nWhat is above {ABOVE:g}× FedAvg, and why:\n" + "\n".join(
            f"- **{m}** ({times(ratio, 2)}): {why(m)}." for m, ratio in above)
    return f"{head}\n\n{table_}\n\n{text}"


@block("deploy-side-by-side")
def side_by_side(prefix: str) -> str:
    data = raw(SIDE)
    rows, pair_count = [], {}
    for r in data["rows"]:
        label = r["side"]
        if r.get("pair") is not None:
            pair_count[label] = pair_count.get(label, 0) + 1
            label += f" (pair {r['pair'] + 1})"
        rows.append((label, num(r["median"], 1), ", ".join(str(p) for p in r["phases"]),
                     f"{num(r['load-before'], 1)} → {num(r['load-after'], 1)}"))
    bouquet = [r for r in data["rows"] if r["side"] == BOUQUET + "fedavg"]
    flower = [r for r in data["rows"] if r["side"] == "minimal flower fedavg"]
    b = statistics.median(r["median"] for r in bouquet)
    f = statistics.median(r["median"] for r in flower)
    pairs = sorted({r["pair"] for r in bouquet})
    per_pair = [next(x["median"] for x in bouquet if x["pair"] == p)
                / next(x["median"] for x in flower if x["pair"] == p) for p in pairs]
    per_message = [r["median"] / max(r["phases"]) for r in flower]
    return (
        table(("run", "s/round (median)", "phases per round (Bouquet: round 0..R; Flower: rounds 1..R)",
               "load average before → after"), rows, align="lrll")
        + f"\n\nBouquet fedavg / minimal Flower FedAvg, ratio of median s/round: **{num(b / f)}** "
        f"({num(b, 1)} / {num(f, 1)} s; per pair {joined((num(x) for x in per_pair), ', ')}), with the "
        f"machine's 1-minute load average at {span([v for r in data['rows'] for v in (r['load-before'], r['load-after'])], 1)}. "
        f"What Flower itself costs: its FedAvg round is {max(flower[0]['phases'])} messages per "
        f"SuperNode (train, evaluate), {span(per_message, 0)} s per message here with a one-line "
        "handler, all of it Flower's pull, process start and imports; a Bouquet fedavg round is one "
        "message per SuperNode.")


@block("deploy-earlier")
def earlier(prefix: str) -> str:
    data = raw(EARLIER)
    rows = {r["configuration"]: r for r in data["rows"]}
    shown = "; ".join(f"{name}: {num(r['median-seconds-per-round'], 1)} s/round"
                      for name, r in rows.items())
    return (f"The earlier measurement, one train and one evaluate exchange per round with the previous "
            f"code, is kept for reference ({_link(EARLIER, prefix)}, load average "
            f"{num(data['load-average-at-end'], 0)} at its end): {shown}.")


@block("deploy-cost-profile")
def profile(prefix: str) -> str:
    data = raw(PROFILE)
    stages = data["stages"]
    start = data["interpreter-start"]
    whose = {"flower imports": "Flower", "import torch": "torch (any torch ClientApp pays it; "
             "Flower's own PyTorch template too)", "bouquet imports": "Bouquet",
             "run config + client data": "Bouquet", "train handler (training + reply records)": "Bouquet"}
    rows = [("interpreter start", num(start[1] if isinstance(start[0], (int, float)) else
                                      statistics.median(s[1] for s in start)), "Python")]
    for name, (wall, cpu) in stages.items():
        if name in whose:
            rows.append((name, num(cpu), whose[name]))
    total = sum(float(r[1]) for r in rows)
    ours = sum(float(r[1]) for r in rows if r[2] == "Bouquet")
    return (table(("stage", "CPU s (median)", "whose"), rows, align="lrl")
            + f"\n\nOf the {num(total, 1)} CPU seconds a message costs inside its process, Bouquet's "
            f"code is {num(ours)} s ({pct(ours / total, 0)}); the rest is Flower's process start "
            "and the torch import.")


def _styles(name: str):
    from docs.blocks.fedcg import Runs

    return Runs(name), raw(name)


@block("deploy-cost-fedcg-schedule")
def fedcg_schedule(prefix: str) -> str:
    columns = (("global-soft", "global accuracy (soft)", 2), ("nmi-test", "NMI student, test images", 3),
               ("nmi-train", "NMI student, train images", 3), ("nmi-labels", "NMI pseudo-labels", 3),
               ("largest-train", "largest domain (train labels)", 2))
    rows, per_seed = [], []
    for k in (2, 1):
        for suffix in ("", "-sampled"):
            name = f"fedcg-styles-k{k}-defaults{suffix}"
            runs, meta = _styles(name)
            s = meta["settings"]
            schedule = s.get("fedcg.balance-schedule", "exchange")
            per = (s["fedcg.sinkhorn-iters"] + 1) if schedule == "exchange" else 1
            rows.append((f"{k} domain{'s' if k > 1 else ''}", f"{schedule} ({per} per teacher)",
                         str(len(meta["seeds"])),
                         *(runs.cell("distance", key, digits) for key, _, digits in columns),
                         _link(name, prefix)))
            per_seed.append(f"{k} per client, {schedule}: "
                            f"{runs.per_seed('distance', 'global-soft', 2)} and "
                            f"{runs.per_seed('distance', 'nmi-test', 3)}")
    return (table(("styles, train clients with", "schedule", "seeds", *(c[1] for c in columns),
                   "table"), rows, align="llr" + "r" * len(columns) + "l")
            + "\n\nPer seed (global accuracy, NMI student on the test images): "
            + "; ".join(per_seed) + ".")


@block("flower-speed")
def flower_speed(prefix: str) -> str:
    out = []
    for name in ("flower_speed", "flower_speed_cnn"):
        data = raw(name)
        ratios = [statistics.median(per["bouquet"]) / statistics.median(per["flower"])
                  for per in data["timings"].values()]
        base = data["base"]
        out.append(f"with `{base.get('model', 'mclr')}` and {base.get('max-samples-per-client', DASH)} "
                   f"samples per client ({_link(name, prefix)}, "
                   f"{' and '.join(data['timings'])} clients) the ratio is {span(ratios, 2)}")
    return "Bouquet's s/round over Flower's (medians): " + "; ".join(out) + "."
