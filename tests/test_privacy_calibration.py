"""The benchmark runner's noise calibration under `dp = 'sample'` for a method whose clients release
more than DP-SGD steps (docs/privacy.md, benchmarks/compare.py `calibrated_noise`): the one σ (upload
σ_u = σ) found over the method's declared releases (`Method.sample_releases`) brings a small run's
reported ε to the target, from below, with no client withheld."""

from __future__ import annotations

import json

import pytest

from server_app.harness.simulate import simulate

SAMPLE = {"dataset": "digits", "model": "mclr", "partition": "label-clusters", "num-clusters": 2,
          "labels-per-cluster": 5, "num-clients": 4, "num-rounds": 3, "local-epochs": 1,
          "batch-size": 32, "lr": 0.05, "max-samples-per-client": 60, "finetune-epochs": 0,
          "checkpoint-every": 0, "seed": 3, "safeguard": "off", "dp": "sample", "dp-delta": 1e-3,
          "dp-max-grad-norm": 1.0, "dp-upload-clip-norm": 2.0, "dp-target-epsilon": 6.0}
FLT = {"method": "flt", "flt.ae-rounds": 1, "flt.ae-epochs": 1, "flt.ae-batch-size": 32,
       "flt.ae-lr": 0.01, "flt.latent-dim": 16, "flt.k": 2, "flt.umap-neighbors": 3,
       "flt.no-structure": "keep"}
FEDSKA = {"method": "fedska", "fedska.k": 1, "fedska.structure-steps": 2, "fedska.encoder-steps": 2}


@pytest.mark.federation
@pytest.mark.parametrize("settings", [{**SAMPLE, **FLT}, {**SAMPLE, **FEDSKA},
                                      {**SAMPLE, **FEDSKA, "fedska.schedule": "separate"}],
                         ids=["flt", "fedska-fused", "fedska-separate"])
def test_the_calibrated_noise_brings_a_graph_method_to_its_target(tmp_path, settings):
    from benchmarks.compare import calibrate_noise, calibrated_noise
    from strategies.shared.run_config import RunConfig, default_run_config

    method = settings["method"]
    calibrated = calibrate_noise(settings, [method])
    sigma = calibrated["dp-noise-multiplier"]
    assert calibrated["dp-upload-noise-multiplier"] == sigma
    # the releases count: σ is above the σ of the DP-SGD steps alone (Opacus' for the schedule)
    alone = RunConfig.from_flower({**default_run_config(), **settings, "method": "local"})
    assert sigma > calibrated_noise(alone) * 1.05
    summary = simulate({**calibrated, "output-dir": str(tmp_path), "run-name": "run"})
    privacy = summary["privacy"]
    target = settings["dp-target-epsilon"]
    assert privacy["withheld-clients"] == [] and not privacy.get("stopped-clients")
    assert privacy["uploads"] > 0
    assert target * 0.99 <= privacy["epsilon-max"] <= target  # the whole schedule lands at it
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds if r["round"] > 0] == [1, 2, 3]
    assert all(not r["privacy"].get("withheld-clients") for r in rounds if r["round"] > 0)
    # a smaller σ (the upload noise with it) would pass the target: the calibration is tight
    lower = {**calibrated, "dp-noise-multiplier": sigma * 0.97, "dp-upload-noise-multiplier": sigma * 0.97}
    over = simulate({**lower, "output-dir": str(tmp_path / "lower"), "run-name": "run"})
    assert over["privacy"]["withheld-clients"] != [] or over["privacy"].get("stopped-clients")


def test_a_cell_whose_methods_need_different_noise_is_refused():
    from benchmarks.compare import calibrate_noise

    with pytest.raises(ValueError, match="different noise multipliers.*own cell"):
        calibrate_noise({**SAMPLE, **FLT}, ["local", "flt"])
