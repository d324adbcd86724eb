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

Target ε. The run's ledger, with the balance replies charged before the round's training,
reaches each client with its train request, so its DP-SGD steps stop at `dp-target-epsilon` as every
method's do; a balance request goes only to the clients whose ε after one more noised reply stays
within the target (`UploadLedger.affordable`, on the run ledger's copy), and one not asked is left
out of that teacher's labelling (`withheld-clients` in the round records).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from strategies.methods.fedcg.settings import BALANCE_STATISTICS
from strategies.shared.privacy import UploadLedger

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")


class FedCGSamplePrivacy:
    """`dp = 'sample'` on FedCG's server (module doc)."""

    def __init__(self, uploads: UploadLedger) -> None:
        self.uploads = uploads

    @classmethod
    def of(cls, cfg: RunConfig) -> FedCGSamplePrivacy | None:
        """The server's DP state of a `dp = 'sample'` run; None under any other mode."""
        uploads = UploadLedger.of(cfg)
        return None if uploads is None else cls(uploads)

    def affordable(self, clients: Iterable[int]) -> list[int]:
        """Of `clients`, those a balance request may go to: all without a target; with one, those
        whose ε after one more noised reply stays within it (the others are withheld)."""
        kept, withheld = [], []
        for client in clients:
            (kept if self.uploads.affordable(client, records=1) else withheld).append(client)
        if [client for client in withheld if self.uploads.withhold(client)]:
            log.info("fedcg: clients %s not asked for balance statistics: a noised reply would take "
                     "them past dp-target-epsilon = %g", withheld, self.uploads.target_epsilon)
        return kept

    def instructions(self) -> Any:
        """The `dp-upload` record of one balance request (its own noise seed)."""
        return self.uploads.upload_instructions([BALANCE_STATISTICS])

    def charge(self, clients: Iterable[int]) -> None:
        """Charge one noised balance reply received from each of `clients`."""
        self.uploads.charge_uploads([int(c) for c in clients])
