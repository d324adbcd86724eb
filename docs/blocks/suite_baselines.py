"""docs/robustness-suite.md: SCAFFOLD and FedAtt in the robustness suite, against FedAvg and the
suite's baselines, from the committed `benchmarks/results/suite/suite.json` and the part that ran
them (`suite/scaffold-fedatt/`: seed 0, `suite/scaffold-fedatt-seeds12/`: seeds 1 and 2), checked
to have run with the settings the page names."""

from __future__ import annotations

from docs.blocks import block
from docs.blocks.data import expect_setting, joined, num, signed, suite, table
from docs.blocks.suite import seed_delta

MAIN = "suite"
PARTS = ("suite/scaffold-fedatt", "suite/scaffold-fedatt-seeds12")
METHODS = ("scaffold", "fedatt")
# the settings the page states for these rows (each method's default when the part ran)
SETTINGS = {"scaffold.server-lr": 1.0, "fedatt.epsilon": 1.2, "fedatt.noise": 0.0}


def _check_part() -> None:
    for key, value in SETTINGS.items():
        expect_setting(PARTS, key, [value])
    part, main = suite(*PARTS), suite(MAIN)
    for row in part.rows():  # the merged suite holds the part's rows unchanged
        merged = main.row(row["setting"], row["rho"], row["seed"], row["label"])
        if merged["mean"] != row["mean"]:
            raise ValueError(f"docs: benchmarks/results/{MAIN}/suite.json has {row['label']} on "
                             f"{row['setting']} ρ={row['rho']:g} seed {row['seed']} at {merged['mean']}, "
                             f"its part at {row['mean']}: re-run the --merge")


def _versus(s, setting: str, rho: float, label: str, other: str) -> float | None:
    """Seed mean of (mean of `label` − mean of `other`) on a cell, over the seeds both ran."""
    cost = seed_delta(s, setting, rho, label, other)
    return None if cost is None else -cost


@block("suite-scaffold-fedatt")
def scaffold_fedatt(prefix: str) -> str:
    """Per cell: FedAvg, SCAFFOLD and FedAtt (mean / worst 5 %), each against FedAvg and against
    the best baseline of the cell."""
    _check_part()
    s = suite(MAIN)
    cells = [c for c in s.cells() if all(s.has(m, *c) for m in METHODS)]
    if not cells:
        raise ValueError(f"docs: benchmarks/results/{MAIN}/suite.json has no cell with "
                         f"{' and '.join(METHODS)}")
    rows = []
    for setting, rho in cells:
        pair = lambda label: joined((num(s.value(setting, rho, label)),  # noqa: E731
                                     num(s.value(setting, rho, label, "worst"), 1)))
        rows.append((f"{setting} ρ={rho:g}", pair("fedavg"), num(s.best_baseline(setting, rho)),
                     *(f"{pair(m)} ({signed(_versus(s, setting, rho, m, 'fedavg'))}; "
                       f"Δ {signed(s.delta(setting, rho, m))})" for m in METHODS)))
    seeds = sorted({r["seed"] for m in METHODS for r in s.rows(label=m)})
    better = {m: [f"{c} ρ={r:g}" for c, r in cells if (_versus(s, c, r, m, "fedavg") or 0) > 0]
              for m in METHODS}
    text = table(("cell", "fedavg mean / worst 5 %", "best baseline",
                  *(f"{m} mean / worst 5 % (− fedavg; Δ)" for m in METHODS)), rows, align="lrrll")
    text += (f"\n\nPersonalized accuracy (%) after round 20 (each client's accuracy with the model the "
             "method gives it; SCAFFOLD, FedAtt and FedAvg give every client the global model), mean "
             f"over seeds {', '.join(map(str, seeds))}; "
             "worst 5 %: mean of the ⌈5 %·K⌉ worst clients. In brackets: the change against FedAvg of "
             "the same seed, and Δ, the row's mean minus max(FedAvg, FedAvg+FT, Local) as in the "
             "matrix above. ")
    for m in METHODS:
        text += (f"{m} is above FedAvg on {len(better[m])} of {len(cells)} cells"
                 + (f" ({', '.join(better[m])})" if better[m] else "") + ". ")
    return text.rstrip()
