"""A target ε for FLT and FedSKA under `dp = 'sample'` (docs/privacy.md): the target covers everything
a client releases, its DP-SGD steps (FLT's autoencoder steps included) and its noised uploads
(FLT's centroids; FedSKA's descriptor, slot features and gradients), all in one ledger. The reported
ε never exceeds the target, and a client the target has spent sends nothing more that depends on its
data: FLT's spent client takes no step and sends back the model it received, and is not asked for
centroids its budget cannot pay; FedSKA's is sent no more training or queries (its rows stay what
the server had, as for a client that left)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from server_app.clients import ClientGrid
from server_app.harness.simulate import simulate
from strategies.shared.messages import PERSONAL
from strategies.shared.privacy import PRIVACY, PrivacyReport

RUN = {"dataset": "digits", "model": "mclr", "partition": "label-clusters", "num-clusters": 2,
       "labels-per-cluster": 5, "num-clients": 4, "num-rounds": 3, "local-epochs": 1,
       "batch-size": 32, "lr": 0.05, "max-samples-per-client": 60, "finetune-epochs": 0,
       "checkpoint-every": 0, "fuse-evaluate": False, "seed": 3, "safeguard": "off", "dp": "sample",
       "dp-delta": 1e-3, "dp-noise-multiplier": 1.1, "dp-max-grad-norm": 1.0,
       "dp-upload-noise-multiplier": 3.0, "dp-upload-clip-norm": 2.0}
FLT = {"method": "flt", "flt.ae-rounds": 1, "flt.ae-epochs": 1, "flt.ae-batch-size": 32,
       "flt.ae-lr": 0.01, "flt.latent-dim": 16, "flt.k": 2, "flt.umap-neighbors": 3,
       "flt.no-structure": "keep"}
FEDSKA = {"method": "fedska", "fedska.k": 1, "fedska.structure-steps": 2, "fedska.encoder-steps": 2,
          "fedska.schedule": "separate"}


def _recorded(monkeypatch) -> list[tuple[str, int, object, object]]:
    """Every exchange of the run: (message type, client, request, reply or None)."""
    seen: list[tuple[str, int, object, object]] = []
    original = ClientGrid.exchange

    def exchange(self, messages, timeout, phase):
        replies = dict(original(self, messages, timeout, phase))
        for message in messages:
            client = message.metadata.dst_node_id
            seen.append((message.metadata.message_type, client, message, replies.get(client)))
        return sorted(replies.items())

    monkeypatch.setattr(ClientGrid, "exchange", exchange)
    return seen


def _run(tmp_path, settings: dict) -> tuple[dict, list[dict]]:
    summary = simulate({**settings, "output-dir": str(tmp_path), "run-name": "t"})
    rows = [json.loads(line) for line in (tmp_path / "t" / "rounds.jsonl").read_text().splitlines()]
    return summary, [r for r in rows if r["round"] > 0]


def _within(rows: list[dict], summary: dict, target: float) -> None:
    for row in rows:
        assert max(row["privacy"]["epsilon-per-client"]) <= target
    assert 0 < summary["privacy"]["epsilon-max"] <= target
    assert summary["privacy"]["target-epsilon"] == target


@pytest.mark.federation
def test_flt_target_stops_its_dp_sgd_steps_and_a_spent_client_returns_what_it_received(
        tmp_path, monkeypatch):
    """Without a target ε is 5.26, 6.25, 7.13 after rounds 1-3 (tests/test_privacy_resume.py's
    run): at 6.5 round 3's steps would pass it, so every client takes none and sends back the
    classifier it was sent."""
    seen = _recorded(monkeypatch)
    summary, rows = _run(tmp_path, {**RUN, **FLT, "dp-target-epsilon": 6.5})
    _within(rows, summary, 6.5)
    assert [r["privacy"]["stopped-clients"] for r in rows] == [0, 0, 4]
    assert rows[2]["privacy"]["epsilon-per-client"] == rows[1]["privacy"]["epsilon-per-client"]
    assert summary["privacy"]["uploads"] == 4 and summary["privacy"]["withheld-clients"] == []
    spent: set[int] = set()
    for kind, client, request, reply in seen:
        if kind != "train.local" or reply is None:
            continue
        report = PrivacyReport.read(reply.content[PRIVACY])
        if sum(report.steps) == 0:
            spent.add(client)
        if client in spent:  # nothing it sends depends on its data
            assert sum(report.steps) == 0 < report.planned_steps
            sent, back = request.content[PERSONAL], reply.content[PERSONAL]
            for key in sent.keys():
                np.testing.assert_array_equal(back[key].numpy(), sent[key].numpy())
    assert spent == {0, 1, 2, 3}


@pytest.mark.federation
def test_flt_target_below_the_centroids_cost_asks_for_no_centroids(tmp_path, monkeypatch):
    """The autoencoder's DP-SGD steps bring each client to ε = 2.34 (before round 1); the noised
    centroids would take it past 2.5, so no client is asked for them and none trains after."""
    seen = _recorded(monkeypatch)
    summary, rows = _run(tmp_path, {**RUN, **FLT, "num-rounds": 2, "dp-target-epsilon": 2.5})
    _within(rows, summary, 2.5)
    assert not [kind for kind, *_ in seen if kind == "query.flt_embed"]
    assert summary["privacy"]["uploads"] == 0
    assert summary["privacy"]["withheld-clients"] == [0, 1, 2, 3]
    assert all(r["privacy"]["stopped-clients"] == 4 for r in rows)


@pytest.mark.federation
def test_fedska_target_covers_its_uploads_and_a_spent_client_is_sent_nothing_more(
        tmp_path, monkeypatch):
    """Without a target ε is 6.21 and 9.49 after rounds 1 and 2, a round costing its DP-SGD steps
    and four noised records (descriptor, slot features, two gradients): round 3 would pass 10, so
    no client is sent its training or queries, and ε stays where round 2 left it."""
    seen = _recorded(monkeypatch)
    summary, rows = _run(tmp_path, {**RUN, **FEDSKA, "dp-target-epsilon": 10.0})
    _within(rows, summary, 10.0)
    assert [r["clients-trained"] for r in rows] == [4, 4, 0]
    assert rows[2]["privacy"]["epsilon-per-client"] == rows[1]["privacy"]["epsilon-per-client"]
    assert rows[2]["privacy"]["uploads"] == rows[1]["privacy"]["uploads"] == 32
    assert summary["privacy"]["withheld-clients"] == [0, 1, 2, 3]
    # every request that asks for data-dependent replies: rounds 1 and 2 only (four clients each:
    # the training, one slot-features query and two gradient queries), none in round 3
    asked = {}
    for kind, client, *_ in seen:
        if not kind.startswith("evaluate") and kind != "query.identify":
            asked[kind] = asked.get(kind, 0) + 1
    assert asked == {"train.fedska": 8, "query.ska_embed": 8, "query.ska_grad": 16}
    last = max(i for i, (kind, *_) in enumerate(seen) if kind in asked)
    assert {kind for kind, *_ in seen[last + 1:]} <= {"evaluate"}  # round 3: evaluation only


def test_a_target_is_taken_with_flt_and_fedska_under_sample():
    from strategies.methods.fedska.server import build_fedska
    from strategies.methods.flt.server import build_flt
    from strategies.shared.run_config import RunConfig, default_run_config

    fedska = build_fedska(RunConfig.from_flower({**default_run_config(), **RUN, **FEDSKA,
                                                 "dp-target-epsilon": 5.0}))
    assert fedska.sample_uploads.target_epsilon == 5.0 and fedska.sample_schedule == (1.1, 32, 1)
    flt = build_flt(RunConfig.from_flower({**default_run_config(), **RUN, **FLT,
                                           "dp-target-epsilon": 5.0}))
    assert flt.sample_training["target_epsilon"] == 5.0
    assert flt.sample_uploads.target_epsilon == 5.0
