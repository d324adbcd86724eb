"""How well does FedCG's teacher/student loop discover the domains on its own, and which settings change that?

FedCG's domain discovery alone: the teacher/student loop without the main model, in seconds.

    python -m benchmarks.studies.fedcg_discovery --seeds 0,1,2 --set domain-family=styles \
        --set domains-per-client=2 --set domain-unseen-styles=blurred --set num-rounds=30 \
        --set fraction-train=0.25 --set local-epochs=2 \
        --variant lr-0.05:fedcg.domain-lr=0.05 --variant lr-0.2:fedcg.domain-lr=0.2 --name fedcg-discovery

The discovered domains depend only on the domain classifiers: the student learns the teacher's
pseudo-domains and never sees the main FedCG model, so a run of `benchmarks.studies.fedcg_domains` spends
most of its time on a model that does not change its NMI. This script runs that loop with the
project's own pieces — the `domains` partition (`datasets.federated.load_client_data`), the domain
classifier and its seeded initialisation as in `strategies.methods.fedcg.server` (`models.fedcg.DomainClassifier`),
the client's student step (`client_app.training.train_epochs` with the same batch seeds), the
federated standardisation and Sinkhorn labelling (`strategies.methods.fedcg.domain_balance`, fed with every train
client's sums as the strategy's exchanges are), FedAvg by image count and φ ← ϕ every T rounds —
and reports the per-image NMI of the final student on the seen test clients' images, of the last
pseudo-labels on the training images, and the largest domain share. Clients per round are drawn with
numpy from the seed (not Flower's sampler), so a run matches a FedCG run's mechanism, not its draws.
`fedcg.clustering=oracle` trains the student on the true domains (its ceiling in this budget).
Writes `benchmarks/results/<name>.{md,json}`.
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    benchmark_parser,
    code_version,
    log_progress,
    machine_facts,
    parse_set,
    set_threads,
    write_study,
)
from docs.results.studies import fedcg_discovery as markdown
from benchmarks.studies.fedcg_domains import DEFAULTS

log = logging.getLogger("bouquet.benchmarks")


def pseudo_labels(teacher: Any, cfg: Any, train_x: dict[int, Any]) -> dict[int, Any]:
    """Each train client's pseudo-domains under `cfg.fedcg.balance` (the strategy's labelling)."""
    import numpy as np

    from client_app.methods.fedcg import domain_logits, pseudo_domains
    from strategies.methods.fedcg.domain_balance import (
        Labelling, logit_moments, sinkhorn_labelling, soft_marginals, standardisation,
    )

    s = cfg.fedcg
    logits = {c: domain_logits(teacher, x) for c, x in train_x.items()}
    labelling = None
    if s.balanced:
        mean, sd = standardisation(*zip(*(logit_moments(z) for z in logits.values())))
        if s.balance == "centering":
            labelling = Labelling(mean, np.ones(s.domains), np.zeros(s.domains), 1.0)
        else:
            def marginals(labelling: Labelling) -> tuple[list, list, list]:
                answers = [soft_marginals(z, labelling) for z in logits.values()]
                return [a[0] for a in answers], [a[1] for a in answers], [a[2] for a in answers]

            labelling, _ = sinkhorn_labelling(mean, sd, s.sinkhorn_iters, s.sinkhorn_temperature, marginals)
    return {c: pseudo_domains(z, labelling) for c, z in logits.items()}


def discover(cfg: Any) -> dict[str, Any]:
    """Run the teacher/student loop of one FedCG configuration; NMI and shares at the end."""
    import copy

    import numpy as np
    import torch
    from sklearn.metrics import normalized_mutual_info_score as nmi

    from client_app.methods.fedcg import STUDENT_STREAM, domain_logits
    from client_app.training import seeded_generator, train_epochs
    from datasets.federated import load_client_data
    from datasets.partition import heldout_test_clients
    from models import build_model
    from models.fedcg import DomainClassifier, FedCGModel
    from strategies.methods.fedcg.server import BRANCH_SEED_OFFSET
    from strategies.shared.personalized import weighted_mean

    s = cfg.fedcg
    held_out = heldout_test_clients(cfg.data_spec.partition)
    test_clients = [] if held_out is None else held_out.tolist()
    train_clients = [c for c in range(cfg.num_clients) if c not in test_clients]
    data = {c: load_client_data(cfg.data_spec, c) for c in range(cfg.num_clients)}
    train_x = {c: data[c].train_x for c in train_clients if len(data[c].train_x)}
    truth = {c: data[c].train_domains for c in train_x}
    test_x = torch.cat([data[c].test_x for c in test_clients])
    test_d = torch.cat([data[c].test_domains for c in test_clients])
    seen = torch.isin(test_d, torch.unique(torch.cat(list(truth.values()))))
    test_x, test_d = test_x[seen], test_d[seen]
    shape = tuple(test_x.shape[1:])
    with torch.random.fork_rng(devices=[]):  # the strategy's initial teacher and student (strategies.methods.fedcg.server)
        torch.manual_seed(cfg.seed + BRANCH_SEED_OFFSET)
        FedCGModel(build_model(cfg.model, shape, 10), s.spec)
        teacher = DomainClassifier(shape, s.domains, s.domain_stride, s.classifier_pool)
        student = DomainClassifier(shape, s.domains, s.domain_stride, s.classifier_pool)
    oracle = s.clustering == "oracle"
    labels = truth if oracle else pseudo_labels(teacher, cfg, train_x)
    per_round = max(1, int(round(cfg.fraction_train * len(train_x))))
    rng = np.random.default_rng(cfg.seed)
    curve, started = [], time.perf_counter()
    for server_round in range(1, cfg.num_rounds + 1):
        rows, weights = [], []
        for client in sorted(rng.choice(sorted(train_x), per_round, replace=False).tolist()):
            local = copy.deepcopy(student)
            train_epochs(local, train_x[client], labels[client], epochs=cfg.local_epochs,
                         batch_size=cfg.batch_size, lr=s.domain_lr, momentum=0.0,
                         generator=seeded_generator(cfg.seed, client, server_round, STUDENT_STREAM))
            rows.append(torch.nn.utils.parameters_to_vector(local.parameters()).detach())
            weights.append(float(len(labels[client])))
        torch.nn.utils.vector_to_parameters(
            weighted_mean(torch.stack(rows), torch.tensor(weights)), student.parameters())
        if not oracle and server_round % s.teacher_period == 0:
            teacher = copy.deepcopy(student)
            labels = pseudo_labels(teacher, cfg, train_x)
        predicted = domain_logits(student, test_x).argmax(dim=1)
        curve.append(float(nmi(test_d.numpy(), predicted.numpy())))
    all_truth = torch.cat([truth[c] for c in train_x]).numpy()
    all_labels = torch.cat([labels[c] for c in train_x]).numpy()
    histogram = np.bincount(predicted.numpy(), minlength=s.domains)
    return {"nmi-test": curve[-1], "nmi-test-last-5": float(np.mean(curve[-5:])),
            "nmi-labels": float(nmi(all_truth, all_labels)),
            "largest-labels": float(np.bincount(all_labels, minlength=s.domains).max() / len(all_labels)),
            "largest-test": float(histogram.max() / histogram.sum()), "test-histogram": histogram.tolist(),
            "curve": curve, "seconds": time.perf_counter() - started}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.fedcg_discovery", __doc__)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="settings of every variant (on top of benchmarks.studies.fedcg_domains' DEFAULTS)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                        help="a named variant with its overrides (none given: one run of the settings)")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    log_progress()
    set_threads(1)
    from strategies.shared.run_config import RunConfig, default_run_config

    variants: dict[str, dict[str, Any]] = {}
    for spec in args.variant or ["defaults:"]:
        name, _, overrides = spec.partition(":")
        variants[name] = parse_set([o for o in overrides.split(",") if o.strip()])
    common = {**DEFAULTS, **parse_set(args.set), "method": "fedcg"}
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    rows, started = [], datetime.now(timezone.utc)
    for name, overrides in variants.items():
        for seed in seeds:
            cfg = RunConfig.from_flower({**default_run_config(), **common, **overrides, "seed": seed})
            row = {"variant": name, "seed": seed, **discover(cfg)}
            log.info("%s seed %d: NMI test %.3f, labels %.3f (%.0f s)", name, seed, row["nmi-test"],
                     row["nmi-labels"], row["seconds"])
            rows.append(row)
    settings = RunConfig.from_flower({**default_run_config(), **common}).flat()
    meta = {"name": args.name, "command": "python -m benchmarks.studies.fedcg_discovery " + shlex.join(argv),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
            "code": code_version(), "settings": settings, "variants": variants, "seeds": seeds}
    write_study(RESULTS_DIR, args.name, {**meta, "rows": rows}, markdown(meta, rows), indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
