"""README.md, docs/getting-started.md and docs/benchmarks.md: the default job's committed accuracies,
the timed quick start and the "Which method when" table."""

from __future__ import annotations

from dataclasses import dataclass

from docs.blocks import block
from docs.blocks.data import compare, docs_link, joined, num, raw, signed, span, table

NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "local": "local", "ditto": "Ditto", "ifca": "IFCA",
         "fedsem": "FedSEM", "flt": "FLT", "sfl": "SFL", "sfl-star": "SFL\\*", "fedska": "FedSKA",
         "fedu": "FedU", "fedcg": "FedCG", "fedper": "FedPer", "lg-fedavg": "LG-FedAvg"}
GRAPH = ("flt", "sfl", "sfl-star", "fedska", "fedu", "fedcg")
NEAR = 0.5  # "best measured" lists every method within this many points of the best


def _name(method: str) -> str:
    return NAMES.get(method, method)


def _link(name: str, prefix: str, shown: str | None = None) -> str:
    return f"[{shown or name}]({prefix}results/{name}.md)"


# --- the default job and the timed quick start ----------------------------------------------------
def _steps(name: str) -> tuple[dict, dict]:
    data = raw(name)
    return data, data["steps"]


@block("quick-start-numbers")
def quick_start_numbers(prefix: str) -> str:
    """The default job's committed comparison and the timed quick start."""
    c = compare("default-job")
    shown = ", ".join(f"{_name(m) if m != 'local' else 'local models'} {num(c.pers(m), 1)} %"
                      for m in c.methods)
    data, steps = _steps("first-run")
    m = data["machine"]
    loads = [v for s in steps.values() for v in (s["load-before"], s["load-after"])]
    return (f"The default job's committed comparison ({_link('default-job', prefix)}): {shown}. "
            f"The quick start, timed {data['date']} on the shared development machine ({m['cpu']}, "
            f"{m['cores']} cores, load average {span(loads, 0)} from other jobs): "
            + ", ".join(f"{step} {num(s['seconds'], 0)} s" for step, s in steps.items())
            + f" ({_link('first-run', prefix)}; [Timings]({docs_link(prefix)}benchmarks.md#timings)).")


@block("first-run-table")
def first_run_table(prefix: str) -> str:
    rows = []
    for name in ("first-run", "first-run-runs"):
        data, steps = _steps(name)
        for step, s in steps.items():
            rows.append((data["date"], step, num(s["seconds"], 0),
                         f"{num(s['load-before'], 1)} → {num(s['load-after'], 1)}",
                         "completed" if s["rc"] == 0 else f"exit {s['rc']}",
                         _link(name, prefix)))
    return table(("date", "step", "wall time (s)", "load average before → after", "outcome", "file"),
                 rows, align="llrlll")


@block("first-run-reading")
def first_run_reading(prefix: str) -> str:
    c = compare("default-job")
    runs = [s for name in ("first-run", "first-run-runs") for s in _steps(name)[1].values()
            if s.get("personalized-mean") is not None]
    means = [s["personalized-mean"] for s in runs]
    loads = [v for name in ("first-run", "first-run-runs") for s in _steps(name)[1].values()
             for v in (s["load-before"], s["load-after"])]
    method = c.methods[0]
    commits = {_steps(name)[0]["code"]["commit"] for name in ("first-run", "first-run-runs")}
    return (
        f"The same job in one process (`python -m benchmarks.compare --methods {method} ...`, no "
        f"SuperLink or Ray) took {num(c.get(method, 'wall-seconds'), 1)} s for {_name(method)} "
        f"(`wall-seconds` in {_link('default-job', prefix, '`default-job.json`')}), so most of the "
        "wall time above is Flower's runtime, and a loaded machine stretches all of it: these runs "
        f"shared {c.data['machine']['cores']} cores with load averages of {span(loads, 0)}, and no "
        f"run on an idle machine was measured. The {len(runs)} `flwr run`s ended at "
        + ", ".join(f"{num(v)} %" for v in means)
        + f" personalized mean, {num(max(means) - min(means), 1)} points apart; the in-process "
        f"comparison: {num(c.pers(method))} %"
        + (f" (it ran the code of commit {c.data['code']['commit']}, the timed runs that of "
           f"{', '.join(sorted(commits))})" if commits - {c.data["code"]["commit"]} else "")
        + ".")


# --- Which method when -----------------------------------------------------------------------------
@dataclass
class Row:
    """A row of the table: its data (a template filled from the first file's settings) and the
    committed comparisons it cites, the first holding the shipped defaults (a method's value is
    taken from the first file that ran it)."""

    data: str
    files: tuple[str, ...]
    note: str = ""


SG = "method-safeguard/"  # the method tables re-run with the per-client safeguard (a shipped default)
ROWS = (
    Row("groups with disjoint labels (`{partition}`, {num-clients} clients, {num-clusters} groups, "
        "{num-rounds} rounds)", (f"{SG}flt-label-clusters-m50-answer", "flt-label-clusters-m50"), "ari"),
    Row("the default job ({num-clients} clients, {num-clusters} groups, {num-rounds} rounds)",
        ("default-job",), "default"),
    Row("2 labels per client (`{partition}` q={shards-per-client}, {num-clients} clients, "
        "{num-rounds} rounds)", (f"{SG}fedska-mnist-shards-q2-k100-start",
                                 f"{SG}sfl-mnist-shards-q2-k100-answer",
                                 "fedska-mnist-shards-q2-k100-defaults",
                                 "sfl-mnist-shards-q2-k100", "fedska-mnist-shards-q2-k100")),
    Row("mild label skew (`{partition}` q={shards-per-client}, {num-clients} clients, "
        "{num-rounds} rounds)", (f"{SG}fedska-mnist-shards-q10-k100-start",
                                 f"{SG}sfl-mnist-shards-q10-k100-answer",
                                 "fedska-mnist-shards-q10-k100-defaults",
                                 "sfl-mnist-shards-q10-k100", "fedska-mnist-shards-q10-k100")),
)
# (shipped defaults: the safeguard with the federation's weight and start and FLT's structure check;
# the check with safeguard-margin 0 (no federation weight or start, nor the slice's training of the
# consensus); the thresholded graph with the safeguard; neither; FLT's reference absolute threshold)
UNSTRUCTURED = tuple((f"{SG}flt-{name}-m50-start", f"{SG}flt-{name}-m50-no-weight",
                      f"{SG}flt-{name}-m50-keep", f"flt-{name}-m50-defaults", f"flt-{name}-m50")
                     for name in ("iid", "dirichlet1"))
STYLES = ("fedcg-styles-k1-defaults", "fedcg-styles-k2-b16")
ROTATED = "fedcg-rotated-mnist-defaults"
TRAFFIC = "traffic-synthetic"


def _values(files: tuple[str, ...]) -> dict[str, tuple[float, float | None]]:
    """method -> (personalized mean, FedAvg's "+ local epochs" mean), first file first; every file
    must supply a method (a row cites only the runs its numbers come from)."""
    out: dict[str, tuple[float, float | None]] = {}
    for name in files:
        c = compare(name)
        supplied = [m for m in c.methods
                    if m not in out and (c.final(m, "personalized") or {}).get("mean") is not None]
        if not supplied:
            raise ValueError(f"docs: README row cites {name}, but earlier runs of the row supply all "
                             "of its methods")
        out.update((m, (c.pers(m), c.ft(m))) for m in supplied)
    return out


def _best(values: dict[str, tuple[float, float | None]]) -> list[str]:
    top = max(v for v, _ in values.values())
    near = sorted((m for m, (v, _) in values.items() if v >= top - NEAR), key=lambda m: -values[m][0])
    return near[:4]


def _cells(row: Row, prefix: str) -> tuple[str, ...]:
    first = compare(row.files[0])
    data = row.data.format(**first.settings)
    values = _values(row.files)
    best = ", ".join(f"{_name(m)} {num(values[m][0], 1)}" for m in _best(values))
    avg, ft = values["fedavg"]
    fedavg = num(avg, 1) + (f"; + {first.settings['finetune-epochs']} local epoch "
                            f"{num(ft, 1)}" if ft is not None else "")
    graph = sorted((m for m in values if m in GRAPH), key=lambda m: -values[m][0])
    aware = ", ".join(f"{_name(m)} {num(values[m][0], 1)}" for m in graph)
    if row.note == "ari":
        flt = first.get("flt", "flt")
        aware += (f": finds the groups (ARI {num(flt['ari'], 1)})" if flt["ari"] == 1.0
                  else f" (ARI {num(flt['ari'], 2)})")
    if row.note == "default" and "flt" in values and "local" in values and \
            round(values["flt"][0], 1) == round(values["local"][0], 1) and \
            not first.get("flt", "flt").get("complete-graph"):  # the graph links no pair
        aware += (" (FLT = local: with 2 clients per group the groups do not separate in FLT's "
                  "embedding, and its relative threshold links no pair)")
    links = ", ".join(_link(name, prefix, _short(name)) for name in row.files)
    return data, best, fedavg, aware, links


def _short(name: str) -> str:
    return name.removeprefix(SG).replace("-mnist-shards", "-…")


def _unstructured(prefix: str) -> tuple[str, ...]:
    current, plain, kept, off, reference = ([compare(names[i]) for names in UNSTRUCTURED]
                                            for i in range(5))
    s = [c.settings for c in current]
    data = (f"no structure (`{s[0]['partition']}` / `{s[1]['partition']}` α="
            f"{s[1]['dirichlet-alpha']:g}, {s[0]['num-clients']} clients, {s[0]['num-rounds']} rounds)")
    best = []
    for c in current:
        top = max(c.methods, key=c.pers)
        best.append((top, c.pers(top)))
    same = len({m for m, _ in best}) == 1
    shown = (f"{_name(best[0][0])} {joined(num(v, 1) for _, v in best)}" if same
             else joined(f"{_name(m)} {num(v, 1)}" for m, v in best))
    fedavg = joined(num(c.pers("fedavg"), 1) for c in current)
    threshold = reference[0].settings.get("flt.threshold", "absolute")
    complete = [bool(c.get("flt", "flt").get("complete-graph")) for c in current]
    check = ("it finds no structure and averages over every client" if all(complete) else
             f"it finds no structure on {sum(complete)} of {len(complete)}")
    aware = (f"FLT {joined(num(c.pers('flt'), 1) for c in current)} ({check}; with "
             f"`safeguard-margin=0`: {joined(num(c.pers('flt'), 1) for c in plain)}; with "
             f"`flt.no-structure=keep`: "
             f"{joined(num(c.pers('flt'), 1) for c in kept)}; safeguard off too: "
             f"{joined(num(c.pers('flt'), 1) for c in off)}; with `flt.threshold={threshold}`: "
             f"{joined(num(c.pers('flt'), 1) for c in reference)})")
    links = ", ".join(_link(n, prefix, _short(n)) for names in zip(*UNSTRUCTURED) for n in names)
    return data, shown, fedavg, aware, links


def _styles(prefix: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from docs.blocks.fedcg import Runs

    k1, k2 = Runs(STYLES[0]), Runs(STYLES[1])
    rot = Runs(ROTATED)
    meta = raw(STYLES[0])
    seeds = len(k1.values("fedavg", "global-soft"))

    def best(runs: Runs) -> str:
        variants = {"FedAvg": runs.mean("fedavg"), "FedCG": runs.mean("distance")}
        top = max(variants, key=variants.get)
        return f"{top} {num(variants[top], 1)}"

    st = meta["settings"]
    held = round(st["num-clients"] * st["domain-test-clients"])
    protocol = (f"{st['num-clients'] - held} train clients, {held} test clients held out, "
                f"{st['num-rounds']} rounds")
    styles = (
        f"image styles (`domains`: {st['domain-styles'].replace(',', ' / ')}, {protocol}, {seeds} "
        "seeds; one global model)",
        f"one style per client: {best(k1)} (true domains {num(k1.mean('oracle'), 1)}); two per "
        f"client: {best(k2)}",
        joined(num(r.mean("fedavg"), 1) for r in (k1, k2)),
        f"FedCG {joined(num(r.mean('distance'), 1) for r in (k1, k2))}, its one-branch control "
        f"{joined(num(r.mean('d1'), 1) for r in (k1, k2))}",
        ", ".join(_link(n, prefix) for n in STYLES))
    rotated = (
        f"rotated images (`domains`, same protocol, {len(rot.values('fedavg', 'global-soft'))} seeds)",
        joined((f"{n} {num(v, 1)}" for n, v in sorted(
            (("FedAvg", rot.mean("fedavg")), ("FedCG", rot.mean("distance"))), key=lambda x: -x[1])),
            ", "),
        num(rot.mean("fedavg"), 1),
        f"FedCG {num(rot.mean('distance'), 1)} (rotations not separable by its domain classifier)",
        _link(ROTATED, prefix))
    return styles, rotated


def _traffic(prefix: str) -> tuple[str, ...]:
    c = compare(TRAFFIC)
    mae = {m: (c.final(m, "regression") or {}).get("mae") for m in c.methods}
    order = sorted((m for m in mae if mae[m] is not None), key=mae.get)
    graph = [m for m in order if m in GRAPH]
    return ("sensors on a road graph (synthetic traffic; MAE, lower is better)",
            ", ".join(f"{_name(m)} {num(mae[m], 3)}" for m in order[:2]), num(mae["fedavg"], 3),
            ", ".join(_name(m) for m in graph), _link(TRAFFIC, prefix))


@block("which-method")
def which_method(prefix: str) -> str:
    rows = [_cells(row, prefix) for row in ROWS]
    rows.append(_unstructured(prefix))
    rows.extend(_styles(prefix))
    rows.append(_traffic(prefix))
    return table(("clients' data (MNIST unless noted)", "best measured", "FedAvg", "graph-aware",
                  "results"), rows, align="lllll") + (
        "\n\nMean personalized test accuracy (%) over clients from the committed comparisons "
        "(same data, seed and budget for every method of a file; each file starts with its "
        "command). A method's value comes from the first file of its row that ran it: the "
        "shipped defaults first (the graph methods with their per-client safeguard, "
        "`method-safeguard/`), then the earlier runs without it.")


@block("which-method-summary")
def which_method_summary(prefix: str) -> str:
    from docs.blocks.fedcg import Runs

    groups = [_values(ROWS[0].files), _values(ROWS[1].files)]
    gains = [max(v[m][0] for m in ("flt", "ifca", "sfl") if m in v) - v["fedavg"][0] for v in groups]
    few = _values(ROWS[2].files)
    plain = {m: few[m][0] for m in ("local", "ditto", "fedu") if m in few}
    plain["FedAvg + 1 local epoch"] = few["fedavg"][1]
    graph_best = max(few[m][0] for m in few if m in GRAPH)
    as_good = max(v for v in plain.values() if v is not None) >= graph_best - NEAR
    unstructured = [compare(names[0]) for names in UNSTRUCTURED]
    leaders = [max(c.methods, key=c.pers) for c in unstructured]
    gaps = [abs(c.pers("fedavg") - c.pers("flt")) for c in unstructured]
    if all(m == "fedavg" for m in leaders):
        plain_best = "FedAvg is best"
    else:
        names = ", ".join(f"{_name(m)} on {c.settings['partition']}"
                          for m, c in zip(leaders, unstructured))
        plain_best = (f"FedAvg and FLT, which then averages over every client, are within "
                      f"{num(max(gaps), 1)} points of each other (best: {names})")
    k1, k2, rot = Runs(STYLES[0]), Runs(STYLES[1]), Runs(ROTATED)
    gain = lambda r: signed(r.mean("distance") - r.mean("fedavg"), 1)  # noqa: E731
    traffic = compare(TRAFFIC)
    mae = lambda m: traffic.final(m, "regression")["mae"]  # noqa: E731
    return (
        "In short: when clients fall into groups that want different models, a method that finds or "
        "is given the groups (FLT, IFCA, SFL with the label-sharing graph) beats FedAvg by "
        f"{span(gains, 0)} points; when each client holds only a few labels, purely local models, "
        "Ditto, FedU or FedAvg plus one local epoch are "
        + ("as good as or better than" if as_good else "behind")
        + " the graph methods; without structure "
        + plain_best
        + f". FedCG finds style domains without labels (NMI {num(k2.mean('distance', 'nmi-test'))} "
        "with two styles per client), but its domain branches add accuracy mainly through their "
        f"extra capacity (its one-branch control is within {span([abs(r.mean('distance') - r.mean('d1')) for r in (k1, k2)], 1)} "
        f"points): {gain(k1)} over FedAvg with one style per client, {gain(k2)} with two, "
        f"{gain(rot)} on rotations; SFL's road graph lowers the traffic MAE a little "
        f"({num(mae('sfl'), 3)} against FedAvg's {num(mae('fedavg'), 3)}).")

