"""Differential privacy across a resume (docs/privacy.md, server_app/callbacks.py `Checkpointing`):
a run cut after round 1 and resumed from its checkpoint reports the same ε in every round, the same
privacy summary and the same final metrics as the run left alone. Under `dp = 'sample'` FLT's ledger
has three parts that must all come back: the run's DP-SGD ledger (the `privacy` component), the
strategy's `UploadLedger` (the autoencoder phase's steps and the noised centroids, checkpointed with
the strategy) and the upload noise's draw counter (the seeds of later noised records); with a
target, FedSKA's copy of the ledger, its clients' train sizes and the clients the target withheld.
Under `dp = 'client'` FedSKA's per-client accountant (every noised aggregate and upload, in the strategy's
layer) must come back, and FedAvg's one-average accountant (the `ClientLevelDP` wrapper)."""

from __future__ import annotations

import json

import pytest

from server_app.harness.simulate import simulate

SAMPLE = {"dataset": "digits", "model": "mclr", "partition": "label-clusters", "num-clusters": 2,
          "labels-per-cluster": 5, "num-clients": 4, "num-rounds": 3, "local-epochs": 1,
          "batch-size": 32, "lr": 0.05, "max-samples-per-client": 60, "finetune-epochs": 0,
          "checkpoint-every": 1, "seed": 3, "safeguard": "off", "dp": "sample", "dp-delta": 1e-3,
          "dp-noise-multiplier": 1.1, "dp-max-grad-norm": 1.0, "dp-upload-noise-multiplier": 3.0,
          "dp-upload-clip-norm": 2.0}
FLT = {"method": "flt", "flt.ae-rounds": 1, "flt.ae-epochs": 1, "flt.ae-batch-size": 32,
       "flt.ae-lr": 0.01, "flt.latent-dim": 16, "flt.k": 2, "flt.umap-neighbors": 3,
       "flt.no-structure": "keep"}
CLIENT = {**{k: v for k, v in SAMPLE.items() if k not in ("dp-max-grad-norm",)}, "dp": "client",
          "dp-noise-multiplier": 1.0, "dp-clip-norm": 0.5, "dp-upload-noise-multiplier": 1.0}
FEDSKA = {"method": "fedska", "fedska.k": 1, "fedska.structure-steps": 2, "fedska.encoder-steps": 2}


def _rounds(directory) -> list[dict]:
    return [json.loads(line) for line in (directory / "rounds.jsonl").read_text().splitlines()]


def _cut_and_resumed(tmp_path, settings: dict) -> tuple[dict, dict, list[dict], list[dict]]:
    """(uninterrupted summary, resumed summary, their round records)."""
    full = simulate({**settings, "output-dir": str(tmp_path / "full"), "run-name": "run"})
    simulate({**settings, "num-rounds": 1, "output-dir": str(tmp_path / "cut"), "run-name": "run"})
    resumed = simulate({**settings, "resume": True, "output-dir": str(tmp_path / "cut"),
                        "run-name": "run"})
    return full, resumed, _rounds(tmp_path / "full" / "run"), _rounds(tmp_path / "cut" / "run")


@pytest.mark.federation
@pytest.mark.parametrize("name, settings", [
    ("flt-sample", {**SAMPLE, **FLT}),
    # a target that withholds round 3 from every client (tests/test_privacy_target.py): the ledger's
    # copy in the strategy, the train sizes and the withheld clients come back too
    ("fedska-sample-target", {**SAMPLE, **FEDSKA, "fedska.schedule": "separate",
                              "dp-target-epsilon": 10.0}),
    ("fedska-client", {**CLIENT, **FEDSKA}),
    ("fedavg-client", {**CLIENT, "method": "fedavg", "fraction-train": 0.5}),
])
def test_a_resumed_dp_run_reports_the_epsilon_of_an_uninterrupted_one(tmp_path, name, settings):
    full, resumed, full_rows, rows = _cut_and_resumed(tmp_path, settings)
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    spent = [r["privacy"] for r in full_rows if r["round"] > 0]
    assert [r["privacy"] for r in rows if r["round"] > 0] == spent  # every round's ε, exactly
    key = "epsilon-max" if settings["dp"] == "sample" else "epsilon"
    if settings.get("dp-target-epsilon"):  # round 3 withheld: nothing more charged
        assert 0 < spent[0][key] < spent[1][key] == spent[2][key] <= settings["dp-target-epsilon"]
        assert resumed["privacy"]["withheld-clients"] == full["privacy"]["withheld-clients"] != []
    else:
        assert 0 < spent[0][key] < spent[1][key] < spent[2][key]  # rounds 2 and 3 were charged
    if settings["method"] in ("flt", "fedska"):  # noised uploads were charged before and after
        assert spent[0]["uploads"] > 0 and resumed["privacy"]["uploads"] == full["privacy"]["uploads"]
    assert resumed["privacy"] == full["privacy"]
    assert resumed["final"] == full["final"]  # bit-identical on this deterministic CPU backend
