"""docs/robustness-suite.md: the suite's run times, learned-graph shares and its reading, from the
committed `benchmarks/results/suite/suite.json` and the diagnosis runs beside it.

Every block reads the rows the suite.json holds (no list of rows is written here): a re-run that adds
rows (a new baseline, a method under a new setting) or relabels them (`<method> (safeguard off)`)
changes the tables at the next `python -m docs.gen`. Prose about a method's behaviour as its paper
defines it reads the `<method> (safeguard off)` row where the suite has one (`Suite.paper`).
"""

from __future__ import annotations

from docs.blocks import block
from docs.blocks.data import (DASH, MISSING, baselines_of, expect_setting, joined, mean, num,
                              raw, signed, span, suite, table)

MAIN = "suite"
FT = "+FT"  # the label suffix of a method's "+ finetune-epochs local epochs" row (benchmarks.suite.FT)
DIAG = "suite/diagnosis"
# the targets: every cell ≥ best baseline − TOLERANCE; + GAIN on the structured cells
TOLERANCE, GAIN = 0.5, 2.0
STRUCTURED = ("label-clusters", "domains")
# the suite as first run, one folder per seed and setting group (FLT γ = 1, FedSKA k = 5, FedU
# `untrained=initial`): the earlier settings the reading compares against
SEED_FOLDERS = tuple(f"suite/{s}-seed{i}" for s in ("label-clusters", "domains", "shards-dirichlet")
                     for i in (0, 1, 2))
SFL_STAR = (("defaults (`gl-k` 5, updates)", "sfl-star-defaults-seed0"),
            ("`sfl.gl-k=3`", "sfl-star-gl-k3-seed0"), ("`sfl.gl-k=8`", "sfl-star-gl-k8-seed0"),
            ("`sfl.gl-features=models`", "sfl-star-gl-models-seed0"))


def _cell(setting: str, rho: float) -> str:
    return f"{setting} ρ={rho:g}"


def _is_baseline(label: str) -> bool:
    return label in baselines_of(label)


def _methods(s) -> list[str]:
    """Every row label of the suite that is not a baseline of its own Δ."""
    return [label for label in s.labels() if not _is_baseline(label)]


def _best(s, setting: str, rho: float) -> tuple[str, float] | None:
    """The row with the highest Δ on a cell."""
    deltas = [(label, s.delta(setting, rho, label)) for label in _methods(s)
              if s.has(label, setting, rho)]
    deltas = [(label, d) for label, d in deltas if d is not None]
    return max(deltas, key=lambda item: item[1]) if deltas else None


@block("suite-wall-time")
def wall_time(prefix: str) -> str:
    """Minutes of training per setting and seed: the sum of the rows' recorded run times."""
    s = suite(MAIN)
    seeds = sorted({r["seed"] for r in s.rows()})
    groups = []  # (setting, model suffix)
    runs_ = [r for r in s.rows() if not r["label"].endswith(FT)]  # a +FT row is its run's second row
    for r in runs_:
        key = (r["setting"], " (cnn)" if r["label"].endswith(" (cnn)") else "")
        if key not in groups:
            groups.append(key)
    rows, totals = [], {seed: 0.0 for seed in seeds}
    for setting, cnn in groups:
        cells = []
        for seed in seeds:
            runs = [r["wall_seconds"] for r in runs_ if r["setting"] == setting and r["seed"] == seed
                    and r["label"].endswith(" (cnn)") == bool(cnn) and r.get("wall_seconds")]
            cells.append(num(sum(runs) / 60, 1) if runs else DASH)
            totals[seed] += sum(runs) / 60
        rows.append((f"{setting}{' (`cnn` rows)' if cnn else ''}", *cells))
    rows.append(("**all**", *(f"**{num(totals[seed], 1)}**" for seed in seeds)))
    return (table(("setting", *(f"seed {seed}, min" for seed in seeds)), rows)
            + f"\n\nSum of the recorded run times (`wall_seconds`: each method's federation, both "
            f"ρ) in minutes, over {len(runs_)} runs (a `+FT` row is a second result of its method's "
            "run and is not counted again). The rows come from the parts joined with "
            "`--merge`, each run on its own (see the commands in `suite-delta.md`), so a part's own "
            "wall time, with its start-up, is in its `suite-delta.md` header.")


@block("suite-shares")
def shares(prefix: str) -> str:
    """The learned graph's share inside the true structure in the last round, per row and cell."""
    s = suite(MAIN)
    cells = [c for c in s.cells() if c[0] in STRUCTURED]
    rows = []
    for label in s.labels():
        values = [s.share(c[0], c[1], label) if s.has(label, *c) else None for c in cells]
        if any(v is not None for v in values):
            rows.append((label, *(num(v) for v in values)))
    if not rows:
        return "No row of the suite recorded a learned graph's share."
    return table(("row", *(_cell(*c) for c in cells)), rows) + (
        "\n\nShare of the learned graph's off-diagonal weight inside the true clusters in the last "
        "round, mean over the seeds.")


@block("suite-cells")
def cells(prefix: str) -> str:
    """Per cell: the best baseline, the best row and the rows that meet or miss the targets."""
    s = suite(MAIN)
    rows = []
    for setting, rho in s.cells():
        base = s.best_baseline(setting, rho)
        best = _best(s, setting, rho)
        deltas = {label: s.delta(setting, rho, label) for label in _methods(s)
                  if s.has(label, setting, rho)}
        gain = [f"{label} ({signed(d, 1)})" for label, d in deltas.items()
                if d is not None and d >= GAIN]
        miss = [label for label, d in deltas.items() if d is not None and d < -TOLERANCE]
        rows.append((_cell(setting, rho), num(base), num(100 - base) if base is not None else DASH,
                     f"{best[0]} ({signed(best[1])})" if best else DASH,
                     (", ".join(gain) or "none") if setting in STRUCTURED else "(not a target)",
                     f"{len(miss)} of {len(deltas)}"))
    return table(("cell", "best baseline (seed mean of the max)", "headroom to 100", "best row (Δ)",
                  f"rows with Δ ≥ +{GAIN:g}", f"rows below −{TOLERANCE:g}"), rows, align="lrrlll")


def seed_delta(s, setting: str, rho: float, label: str, base: str) -> float | None:
    """Seed mean of (mean of `base` − mean of `label`) on a cell: what a wrong setting costs."""
    diffs = []
    for seed in s.seeds(setting, rho, label):
        own, ref = s.rows(setting, rho, seed, label), s.rows(setting, rho, seed, base)
        if own and ref and own[0]["mean"] is not None and ref[0]["mean"] is not None:
            diffs.append(ref[0]["mean"] - own[0]["mean"])
    return mean(diffs)


def _pair(s, label: str, setting: str, rhos=(1.0, 0.2), key: str = "delta") -> str:
    values = []
    for rho in rhos:
        if not s.has(label, setting, rho):
            values.append(DASH)
        elif key == "delta":
            values.append(signed(s.delta(setting, rho, label), 1))
        else:
            values.append(num(s.value(setting, rho, label, key), 1))
    return joined(values)


@block("suite-reading")
def reading(prefix: str) -> str:
    s = suite(MAIN)
    L = s.paper
    link = lambda page, text: f"[{text}]({prefix}methods/{page}.md)"  # noqa: E731
    bullets = []

    # headroom: the cell where + GAIN cannot be reached
    tight = [(c, s.best_baseline(*c)) for c in s.cells() if c[0] in STRUCTURED]
    tight = [(c, b) for c, b in tight if b is not None and 100 - b < GAIN + TOLERANCE]
    for c, base in tight:
        best = _best(s, *c)
        bullets.append(
            f"**{_cell(*c)}**: the best baseline is at {num(base, 1)}, so the cell has "
            f"{num(100 - base, 1)} points of headroom; the best row, {best[0]}, reaches "
            f"{num(s.value(c[0], c[1], best[0]), 1)} ({signed(best[1], 1)}).")

    # FLT: the threshold rule on the unstructured cells
    if s.has("flt"):
        expect_setting(SEED_FOLDERS, "flt.threshold", [MISSING, "absolute"])
        old = suite(*SEED_FOLDERS, baselines_from=(MAIN,))
        tight_rule = suite(f"{DIAG}/flt-relative-0.03", baselines_from=(MAIN,))
        expect_setting([f"{DIAG}/flt-relative-0.03"], "flt.relative-gamma", [0.03])
        flt = L("flt")
        bullets.append(
            f"**FLT on shards and Dirichlet** (Δ at ρ = 1 / 0.2): with γ = 1 "
            f"{_pair(old, 'flt', 'shards')} and {_pair(old, 'flt', 'dirichlet')} (a few large groups "
            f"of clients with different labels, `diagnosis/flt-shards-seed0/`); with the relative "
            f"threshold (`{flt}`) {_pair(s, flt, 'shards')} and {_pair(s, flt, 'dirichlet')}. A tighter "
            f"threshold (0.03 × median) gives {_pair(tight_rule, 'flt', 'shards')} and "
            f"{_pair(tight_rule, 'flt', 'dirichlet')}, and {signed(tight_rule.delta('domains', 0.2, 'flt'), 1)} "
            f"on domains ρ = 0.2 against {signed(s.delta('domains', 0.2, flt), 1)}; it stays a setting "
            f"({link('flt', 'FLT')}).")

    # FedSKA
    if s.has("fedska"):
        ska = L("fedska")
        below = [_cell(*c) for c in s.cells() if s.has(ska, *c)
                 and (s.delta(*c, ska) or 0) < -TOLERANCE]
        start = suite(f"{DIAG}/fedska-start-global-shards-dirichlet-seed1", baselines_from=(MAIN,))
        expect_setting([f"{DIAG}/fedska-start-global-shards-dirichlet-seed1"], "fedska.start",
                       ["global"])
        bullets.append(
            f"**FedSKA** (`{ska}`) is below the baselines by more than {TOLERANCE:g} on "
            + (", ".join(f"{c} ({signed(s.delta(*_split(c), ska), 1)})" for c in below) or "no cell")
            + ". Without true clusters the learned graph links clients with other labels; the paper's "
            f"start from w̄ (`start=global`, seed 1) gives {signed(start.delta('shards', 1.0, 'fedska'), 1)} "
            f"on shards ρ = 1 ({link('fedska', 'FedSKA')})." + _with_safeguard(s, "fedska"))

    # SFL with its given graph on domains
    if s.has("sfl") and s.has("sfl", "domains", 1.0):
        sfl = L("sfl")
        bullets.append(
            f"**SFL with its given label-sharing graph** (`{sfl}`) gives "
            f"{signed(s.delta('domains', 1.0, sfl), 1)} on domains ρ = 1: every client holds every "
            "label, so the given graph is complete and SFL is FedAvg with half of each client's own "
            f"model. The rows that learn the graph: "
            + ", ".join(f"{m} {signed(s.delta('domains', 1.0, L(m)), 1)}"
                        for m in ("sfl-star", "fedska", "flt") if s.has(L(m), "domains", 1.0)) + "."
            + (f" With the safeguard (`sfl`) each client keeps as much of its own model as its "
               f"held-out data asks for: {signed(s.delta('domains', 1.0, 'sfl'), 1)}."
               if sfl != "sfl" and s.has("sfl", "domains", 1.0) else ""))

    # FedU
    if s.has("fedu"):
        fedu = L("fedu")
        old = suite(*SEED_FOLDERS, baselines_from=(MAIN,))
        unstructured = [st for st in s.settings]
        bullets.append(
            f"**FedU** (`{fedu}`) at ρ = 1: "
            + ", ".join(f"{signed(s.delta(st, 1.0, fedu), 2)} on {st}" for st in unstructured
                        if s.has(fedu, st, 1.0))
            + f" (η·λ small: near Local). At ρ = 0.2, with `fedu.untrained=neighbours`: "
            + ", ".join(f"{signed(s.delta(st, 0.2, fedu), 2)} on {st}" for st in unstructured
                        if s.has(fedu, st, 0.2))
            + "; the reference rows (an unsampled client keeps the initial model) gave "
            + ", ".join(f"{signed(old.delta(st, 0.2, 'fedu'), 2)}" for st in unstructured
                        if old.has("fedu", st, 0.2))
            + f". On domains ρ = 0.2 FedU ends at {num(s.value('domains', 0.2, fedu))} (FedAvg "
            f"{num(s.value('domains', 0.2, 'fedavg'))}, Local {num(s.value('domains', 0.2, 'local'))}) "
            f"({link('fedu', 'FedU')}).")

    # FedCG with the conv model
    if s.has("fedcg (cnn)"):
        ceiling = {r["pool"]: r for r in raw("fedcg-classifier-ceiling")["rows"]
                   if r["family"] == "rotations"}
        v = lambda label, rho: s.value("domains", rho, label)  # noqa: E731
        n = len(s.seeds("domains", 1.0, "fedcg (cnn)"))
        bullets.append(
            f"**FedCG on rotated domains** (`cnn`, against FedAvg and Local with the same model, "
            f"mean of {n} seeds): at ρ = 1 {num(v('fedcg (cnn)', 1.0), 1)} against FedAvg "
            f"{num(v('fedavg (cnn)', 1.0), 1)} and Local {num(v('local (cnn)', 1.0), 1)} "
            f"({signed(s.delta('domains', 1.0, 'fedcg (cnn)'), 1)}); at ρ = 0.2 "
            f"{num(v('fedcg (cnn)', 0.2), 1)} against FedAvg {num(v('fedavg (cnn)', 0.2), 1)} and "
            f"Local {num(v('local (cnn)', 0.2), 1)} ({signed(s.delta('domains', 0.2, 'fedcg (cnn)'), 1)}). "
            "FedCG keeps one global model whose branches are chosen per image by the student's "
            "domain; the rotations are not separable by its global-average-pool domain classifier "
            f"(supervised ceiling {num(ceiling['global']['accuracy'], 0)} %, "
            f"[`fedcg-classifier-ceiling`]({prefix}results/fedcg-classifier-ceiling.md)), so the "
            f"branches do not specialise ({link('fedcg', 'FedCG')}).")

    # wrong cluster counts
    wrong = [label for label in s.labels() if "(C=" in label]
    if wrong:
        parts = []
        for label in wrong:
            method = label.split(" (C=")[0]
            cost = [(c, seed_delta(s, *c, label, method)) for c in s.cells() if s.has(label, *c)]
            parts.append(f"{label}: " + ", ".join(f"{signed(-d, 1)} on {_cell(*c)}" for c, d in cost
                                                   if d is not None))
        bullets.append(
            "**Wrong cluster counts** (change of the mean against the same method with the true C, "
            "same seed, mean over the seeds): " + "; ".join(parts) + ". FLT needs no C. Bytes: IFCA "
            "downloads C models per sampled client (`suite-bytes-*.png`).")
    return "\n".join(f"- {b}" for b in bullets)


def _with_safeguard(s, method: str) -> str:
    """The cells where the safeguard row of `method` is below the tolerance, when the suite has it
    beside the paper row."""
    if s.paper(method) == method or not s.has(method):
        return ""
    below = [(c, s.delta(*c, method)) for c in s.cells() if s.has(method, *c)]
    below = [(c, d) for c, d in below if d is not None and d < -TOLERANCE]
    return (f" With the safeguard (`{method}`): "
            + (", ".join(f"{_cell(*c)} {signed(d, 1)}" for c, d in below) if below
               else f"no cell below −{TOLERANCE:g}") + ".")


def _split(cell: str) -> tuple[str, float]:
    setting, rho = cell.split(" ρ=")
    return setting, float(rho)


@block("suite-sfl-star-graphs")
def sfl_star_graphs(prefix: str) -> str:
    """SFL* with other learned graphs, seed 0, every cell, each beside its own baselines."""
    rows = []
    for name, folder in SFL_STAR:
        run = suite(f"{DIAG}/{folder}")
        cells = [f"{_pair(run, 'sfl-star', st)}" for st in run.settings]
        share = joined(num(run.share(st, 1.0, "sfl-star")) for st in STRUCTURED)
        rows.append((name, *cells, share))
    settings = suite(f"{DIAG}/{SFL_STAR[0][1]}").settings
    runs = {name: suite(f"{DIAG}/{folder}") for name, folder in SFL_STAR}
    best = {st: max(runs, key=lambda n: runs[n].delta(st, 1.0, "sfl-star") or float("-inf"))
            for st in settings}
    winners = sorted(set(best.values()))
    return table(("SFL\\*", *settings, "share, " + " / ".join(STRUCTURED) + " (ρ = 1)"), rows) + (
        "\n\nΔ at ρ = 1 / 0.2 (seed 0) against max(FedAvg, Local) of the same folder's run. Best "
        "at ρ = 1: " + ", ".join(f"{st}: {best[st]}" for st in settings) + " — "
        + ("one graph wins every setting." if len(winners) == 1 else
           f"{len(winners)} different graphs, so no single one wins every setting."))
