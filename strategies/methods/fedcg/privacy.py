"""FedCG under `dp = 'sample'` (docs/privacy.md), the server's half: its balance statistics' noise
and accounting, and the target ε for them.

FedCG's clients train the model (θ_a, V, the GCN weights, λ) and the student by DP-SGD in the
shared loop (the run's `privacy` record on `train.fedcg`, `client_app.privacy`; FedCG layers'
per-example gradients: `client_app.methods.fedcg_privacy`), and under DP their train replies carry
no count or agreement statistics. What else leaves a client for training is the balancing's answer
to `query.fedcg_balance` (per-domain sums of the teacher's logits, a sample of logit rows, or the
soft marginals of a Sinkhorn step): each such request carries a `dp-upload` record naming
`balance-statistics`, which the client's `dp-upload` layer clips to `dp-upload-clip-norm` and noises
with std `dp-upload-noise-multiplier` × that norm. Each reply received is one Gaussian mechanism
charged to the client at noise multiplier σ_u/2 (sensitivity 2·C_u to one example) in the
`UploadLedger` (`sample_uploads`), which the run's DP-SGD ledger takes (server_app/privacy.py).

Target ε. The run's ledger reaches the clients with each round's train requests, made before the
round's balance queries; so a balance query goes only to the clients for which it and then a whole
round of DP-SGD (the model's and the student's steps at their Poisson rate) keep ε within
`dp-target-epsilon`, counted on this strategy's own copy of every client's entries (the DP-SGD
steps its train replies report and the uploads charged here). A client asked so can then take all
its round's steps; one not asked is left out of the balancing, and its DP-SGD steps stop at the
target on the client as every method's do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from strategies.methods.fedcg.settings import BALANCE_STATISTICS
from strategies.shared.privacy import (Entry, PrivacyReport, UploadLedger, epsilon, merged,
                                       sample_schedule)

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")

TRAININGS_PER_ROUND = 2  # the model and the student, each `local-epochs` epochs of DP-SGD


class FedCGSamplePrivacy:
    """`dp = 'sample'` on FedCG's server (module doc)."""

    def __init__(self, *, uploads: UploadLedger, noise_multiplier: float, delta: float,
                 target_epsilon: float, batch_size: int, local_epochs: int) -> None:
        self.uploads = uploads
        self.noise_multiplier, self.delta, self.target = noise_multiplier, delta, target_epsilon
        self.batch_size, self.local_epochs = batch_size, local_epochs
        self.spent: dict[int, list[Entry]] = {}  # client -> every entry so far (steps, uploads)
        self.train_sizes: dict[int, int] = {}
        self.left_out = 0  # balance requests not sent because of the target

    @classmethod
    def of(cls, cfg: RunConfig) -> FedCGSamplePrivacy | None:
        """The server's DP state of a `dp = 'sample'` run; None under any other mode."""
        uploads = UploadLedger.of(cfg)
        if uploads is None:
            return None
        return cls(uploads=uploads, noise_multiplier=cfg.dp_noise_multiplier, delta=cfg.dp_delta,
                   target_epsilon=cfg.dp_target_epsilon, batch_size=cfg.batch_size,
                   local_epochs=cfg.local_epochs)

    def take_train_sizes(self, sizes: Mapping[int, int]) -> None:
        self.train_sizes.update({int(c): int(n) for c, n in sizes.items()})

    def upload_entry(self) -> Entry:
        """One noised balance reply: a Gaussian mechanism at σ_u/2, rate 1."""
        return (self.uploads.upload_noise_multiplier / 2.0, 1.0, 1)

    def round_steps(self, client: int) -> list[Entry]:
        """The DP-SGD steps a whole round of this client takes (model and student)."""
        rate, steps = sample_schedule(self.train_sizes[client], self.batch_size, self.local_epochs)
        return [(self.noise_multiplier, rate, steps)] * TRAININGS_PER_ROUND

    def affordable(self, clients: Iterable[int]) -> list[int]:
        """Of `clients`, those a balance request may go to: all without a target; with one, those
        whose ε after it and a whole round of DP-SGD stays within the target (a client of unknown
        train size is not asked)."""
        clients = list(clients)
        if self.target <= 0:
            return clients
        kept = []
        for client in clients:
            if client not in self.train_sizes:
                continue
            history = [*self.spent.get(client, []), self.upload_entry(), *self.round_steps(client)]
            if epsilon(history, self.delta) <= self.target:
                kept.append(client)
        if len(kept) < len(clients):
            self.left_out += len(clients) - len(kept)
            log.info("fedcg: %d of %d clients not asked for balance statistics: the noised reply "
                     "and a round of DP-SGD would take them past dp-target-epsilon = %g",
                     len(clients) - len(kept), len(clients), self.target)
        return kept

    def instructions(self) -> Any:
        """The `dp-upload` record of one balance request (its own noise seed)."""
        return self.uploads.upload_instructions([BALANCE_STATISTICS])

    def charge(self, clients: Iterable[int]) -> None:
        """Charge one noised balance reply received from each of `clients`."""
        clients = [int(c) for c in clients]
        self.uploads.charge_uploads(clients)
        for client in clients:
            self.spent[client] = merged([*self.spent.get(client, []), self.upload_entry()])

    def take_report(self, client: int, report: PrivacyReport) -> None:
        """The DP-SGD steps a train reply reports."""
        self.spent[client] = merged([*self.spent.get(client, []), *report.entries()])
