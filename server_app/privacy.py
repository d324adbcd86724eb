"""The server half of differential privacy (strategies/shared/privacy.py, docs/privacy.md), as one
run callback.

`dp = 'sample'`: every train request carries a `privacy` record with the DP-SGD settings and the
ledger, the steps each client has taken in earlier rounds (a deployed ClientApp keeps nothing
between messages, so the server keeps it for the clients); each train reply's `privacy` report adds
its steps to the ledger; a method whose clients also upload noised records under `sample` (FedSKA,
its `sample_uploads`, `strategies.shared.privacy.UploadLedger`) has them added to the same ledger as
Gaussian mechanisms (σ_u, rate 1, records), so a client's ε composes both in RDP. `dp = 'client'`: the strategy's wrapper (`ClientLevelDP`) or, for
per-client aggregates, its layer (`AggregateNoise`) noises each aggregate and accounts for it.
Either way each round's record gets `privacy`: ε at δ (the largest and mean of the clients' under
`sample`, the federation's under `client`), and under `sample` the clients whose target stopped
their training (`stopped-clients`) and every client's ε
(`epsilon-per-client`, clients that never trained 0); the summary gets the final values (and each
client's `epsilon`). The ledger is this component's checkpointed state.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flwr.app import ConfigRecord

from server_app.callbacks import Replies, RunCallback
from strategies.shared.privacy import (PRIVACY, Entry, PrivacyInstructions, PrivacyReport, epsilon,
                                       ledger_fields, merged)
from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")


class Privacy(RunCallback):
    """Instructions, ledger and reported ε of differential privacy (module doc)."""

    state_name = "privacy"

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.ledger: dict[int, list[Entry]] = {}  # client -> merged (noise, rate, steps) history
        self.stopped: set[int] = set()  # clients a target stopped (fewer steps than planned)

    def client_epsilon(self, client: int) -> float:
        return epsilon(self.ledger.get(client, []), self.cfg.dp_delta)

    def instructions(self) -> PrivacyInstructions:
        """The DP-SGD settings and each client's ledger: its entries, and those the strategy's
        UploadLedger charged and the ledger has not taken yet (an upload or phase of this round's
        step before training, e.g. FLT's autoencoder and centroids), so a client's target covers them."""
        cfg = self.cfg
        ledger, uploads = self.ledger, self.uploads()
        if uploads is not None:
            ledger = {client: [*ledger.get(client, []), *uploads.pending_entries(client)]
                      for client in sorted({*ledger, *uploads.pending, *uploads.steps})}
        return PrivacyInstructions(noise_multiplier=cfg.dp_noise_multiplier,
                                   max_grad_norm=cfg.dp_max_grad_norm, delta=cfg.dp_delta,
                                   target_epsilon=cfg.dp_target_epsilon,
                                   **ledger_fields(ledger))

    def step_records(self, kind: str, server_round: int) -> Mapping[str, ConfigRecord]:
        """The train requests' `privacy` record, made after the method's step before training (which
        may charge uploads and phase steps to the ledger)."""
        if self.cfg.dp != "sample" or kind != "train":
            return {}
        return {PRIVACY: self.instructions().config()}

    def train_replies(self, server_round: int, replies: Replies) -> dict[str, Any]:
        cfg = self.cfg
        if cfg.dp != "sample":  # dp='client': `round_fields`, once the round's phases are done
            return {}
        stopped = []
        for client, reply in replies:
            if PRIVACY not in reply.content:
                log.warning("round %d: client %d's train reply carries no privacy report; its "
                            "steps are not in the ledger", server_round, client)
                continue
            report = PrivacyReport.read(reply.content[PRIVACY])
            self.ledger[client] = merged([*self.ledger.get(client, []), *report.entries()])
            if sum(report.steps) < report.planned_steps:
                stopped.append(client)
        self.take_uploads()
        for client in stopped:
            if client not in self.stopped:
                log.info("round %d: client %d reached dp-target-epsilon = %g (ε = %.3f); it "
                         "trains no more", server_round, client, cfg.dp_target_epsilon,
                         self.client_epsilon(client))
        self.stopped.update(stopped)
        return self.sample_fields()

    def uploads(self) -> Any:
        """The strategy's UploadLedger under dp='sample' (None: its clients upload nothing more)."""
        run = getattr(self, "run", None)
        return getattr(getattr(run, "strategy", None), "sample_uploads", None)

    def take_uploads(self) -> None:
        """Add the noised uploads the strategy has charged since the last call to the ledger."""
        uploads = self.uploads()
        if uploads is None:
            return
        for client, entries in uploads.take().items():
            self.ledger[client] = merged([*self.ledger.get(client, []), *entries])
        uploads.record_ledger(self.ledger)  # the target's view of every client's spending

    def sample_fields(self) -> dict[str, Any]:
        cfg = self.cfg
        per_client = [self.client_epsilon(c) for c in range(cfg.num_clients)]
        trained = [per_client[c] for c in self.ledger]
        return {"privacy": {"epsilon-max": max(trained, default=0.0),
                            "epsilon-mean": sum(trained) / max(len(trained), 1),
                            "delta": cfg.dp_delta, "stopped-clients": len(self.stopped),
                            "epsilon-per-client": per_client}}

    def round_fields(self, server_round: int) -> dict[str, Any]:
        """ε after the round, every phase of it included (a method's exchanges after the
        aggregation upload too): dp='client', and dp='sample' for a method with noised uploads."""
        if self.cfg.dp == "sample" and self.uploads() is not None:
            self.take_uploads()  # the uploads of the round's later phases (e.g. split learning)
            fields = self.sample_fields()
            fields["privacy"]["uploads"] = self.uploads().uploads
            if self.cfg.dp_target_epsilon > 0:  # clients the target keeps from releasing more
                fields["privacy"]["withheld-clients"] = len(self.uploads().withheld or ())
            return fields
        if self.cfg.dp != "client":
            return {}
        from strategies.shared.private_aggregation import accountant  # dp='client' only

        layer = accountant(self.run.strategy)
        return {} if layer is None else {"privacy": layer.round_fields()}

    def run_finished(self, summary: dict[str, Any]) -> None:
        cfg = self.cfg
        if cfg.dp == "off":
            return
        fields: dict[str, Any] = {"mode": cfg.dp, "delta": cfg.dp_delta,
                                  "noise-multiplier": cfg.dp_noise_multiplier,
                                  "target-epsilon": cfg.dp_target_epsilon or None}
        if cfg.dp == "client":
            from strategies.shared.private_aggregation import accountant

            layer = accountant(self.run.strategy)
            if layer is not None:
                fields.update(layer.summary_fields())
            per_client = getattr(layer, "client_epsilons", dict)()  # per-client aggregates
            for client in summary.get("clients", []) if per_client else []:
                client["epsilon"] = per_client.get(client["client-id"], 0.0)
        else:
            self.take_uploads()
            per_client = {c: self.client_epsilon(c) for c in range(cfg.num_clients)}
            fields.update({"epsilon-max": max(per_client.values(), default=0.0),
                           "stopped-clients": sorted(self.stopped)})
            if self.uploads() is not None:
                fields.update({"uploads": self.uploads().uploads,
                               "upload-noise-multiplier": cfg.dp_upload_noise_multiplier})
                if cfg.dp_target_epsilon > 0:
                    fields["withheld-clients"] = sorted(self.uploads().withheld or ())
            for client in summary.get("clients", []):
                client["epsilon"] = per_client.get(client["client-id"], 0.0)
        summary["privacy"] = fields

    def state(self) -> dict[str, Any]:
        return {"ledger": self.ledger, "stopped": self.stopped}

    def restore(self, state: dict[str, Any]) -> None:
        self.ledger, self.stopped = state["ledger"], state["stopped"]
