"""How well can FedCG's domain classifier tell the domains apart when it is told them (each pooling's supervised ceiling)?

The supervised ceiling of FedCG's domain classifier: how well each pooling can tell the domains apart.

    python -m benchmarks.studies.fedcg_ceiling --families rotations,styles --pools global,avg2,flatten \
        --set fedcg.domain-stride=2 --name fedcg-classifier-ceiling

FedCG discovers domains without labels; no clustering can separate domains that its domain
classifier cannot tell apart even when *told* the domains. For each domain
family and each `fedcg.classifier-pool`, this trains the domain classifier (the same module as the
teacher / student, `models.fedcg.DomainClassifier`) centrally and supervised on the true domain of
every training image of the benchmark's partition (the train clients' images, pooled), and reports
its accuracy and NMI (argmax against the true domain) on the held-out test clients' images of the
seen domains. Same data settings as `benchmarks.studies.fedcg_domains` (its DEFAULTS plus `--set`). Writes
`benchmarks/results/<name>.{md,json}`.
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
from docs.results.studies import fedcg_ceiling as markdown
from benchmarks.studies.fedcg_domains import DEFAULTS

log = logging.getLogger("bouquet.benchmarks")


def domain_images(cfg: Any, split: str) -> tuple[Any, Any]:
    """(images, true domain ids) of every client's `split` images, in their domains."""
    import torch

    from datasets.federated import load_client_data

    xs, ds = [], []
    for client in range(cfg.num_clients):
        data = load_client_data(cfg.data_spec, client)
        x, d = (data.train_x, data.train_domains) if split == "train" else (data.test_x, data.test_domains)
        xs.append(x)
        ds.append(d)
    return torch.cat(xs), torch.cat(ds)


def supervised_ceiling(cfg: Any, pool: str, epochs: int, lr: float, seed: int) -> dict[str, Any]:
    """Train the domain classifier on the true domains of the training images; test-set accuracy and
    NMI on the seen domains."""
    import torch
    from sklearn.metrics import normalized_mutual_info_score
    from torch.nn import functional as F

    from client_app.methods.fedcg import domain_logits
    from models.fedcg import DomainClassifier

    x, d = domain_images(cfg, "train")
    tx, td = domain_images(cfg, "test")
    seen = torch.isin(td, torch.unique(d))
    tx, td = tx[seen], td[seen]
    torch.manual_seed(seed)
    classifier = DomainClassifier(tuple(x.shape[1:]), int(d.max()) + 1, cfg.fedcg.domain_stride, pool)
    optimiser = torch.optim.Adam(classifier.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    for _ in range(epochs):
        classifier.train()
        for batch in torch.randperm(len(x), generator=generator).split(32):
            optimiser.zero_grad()
            F.cross_entropy(classifier(x[batch]), d[batch]).backward()
            optimiser.step()
    predicted = domain_logits(classifier, tx, 256).argmax(dim=1)
    return {"pool": pool, "train-images": len(x), "test-images": len(tx),
            "accuracy": 100.0 * float((predicted == td).float().mean()),
            "nmi": float(normalized_mutual_info_score(td.numpy(), predicted.numpy())),
            "seconds": time.perf_counter() - started}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = benchmark_parser("studies.fedcg_ceiling", __doc__)
    parser.add_argument("--families", default="rotations,styles")
    parser.add_argument("--pools", default="global,avg2,flatten")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    log_progress()
    set_threads(1)
    from strategies.shared.run_config import RunConfig
    from strategies.shared.run_config import default_run_config

    common = {**DEFAULTS, **parse_set(args.set)}
    rows, started = [], datetime.now(timezone.utc)
    for family in [f.strip() for f in args.families.split(",") if f.strip()]:
        cfg = RunConfig.from_flower({**default_run_config(), **common, "domain-family": family,
                                     "method": "fedcg"})
        names = cfg.data_spec.partition.domain_names[: cfg.data_spec.partition.num_seen_domains]
        for pool in [p.strip() for p in args.pools.split(",") if p.strip()]:
            row = {"family": family, "domains": ", ".join(names),
                   **supervised_ceiling(cfg, pool, args.epochs, args.lr, cfg.seed)}
            log.info("%s %s: accuracy %.1f %%, NMI %.3f (%.0f s)", family, pool, row["accuracy"],
                     row["nmi"], row["seconds"])
            rows.append(row)
    meta = {"name": args.name, "command": "python -m benchmarks.studies.fedcg_ceiling " + shlex.join(argv),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_facts(),
            "code": code_version(), "settings": {k: v for k, v in cfg.flat().items()},
            "epochs": args.epochs, "lr": args.lr}
    write_study(RESULTS_DIR, args.name, {**meta, "rows": rows}, markdown(meta, rows), indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
