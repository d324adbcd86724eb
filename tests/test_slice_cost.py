"""benchmarks.studies.slice_cost replays Local's training exactly: on the whole train split it gives
the `local` method's own number to the digit, so its other two columns differ from Local only by
the held-out slice and how it is batched."""

from __future__ import annotations

import json

import pytest

from benchmarks.studies import slice_cost

LIST = """[common]
dataset = "digits"
model = "mlp"
num-rounds = 3
local-epochs = 1
batch-size = 16
lr = 0.05
finetune-epochs = 0
checkpoint-every = 0

[[settings]]
name = "tiny"
structure = "label skew"
seed = 5
set = { "partition" = "shards", "shards-per-client" = 2, "num-clients" = 3, "max-samples-per-client" = 45, "fraction-train" = 1.0 }
"""


def test_the_replay_on_the_whole_split_is_the_local_methods_number(tmp_path):
    from benchmarks.compare import compare
    from benchmarks.studies.untuned import load

    path = tmp_path / "list.toml"
    path.write_text(LIST)
    assert slice_cost.main(["--name", "sc", "--only", "tiny", "--list", str(path),
                            "--results-dir", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "sc.json").read_text())["rows"][0]
    common, settings = load(path)
    summary = compare(["local"], {**common, **settings[0]["set"], "seed": 5}, "tiny",
                      results_dir=tmp_path / "r", runs_dir=tmp_path / "runs")[0]
    assert row["means"]["whole split"] == pytest.approx(summary["final"]["personalized"]["mean"],
                                                        abs=1e-9)
    assert row["means"]["slice-free"] != row["means"]["whole split"]  # the slice moved something
    assert "| tiny | 5 |" in (tmp_path / "sc.md").read_text()


def test_a_setting_with_partial_participation_is_refused(tmp_path):
    path = tmp_path / "list.toml"
    path.write_text(LIST.replace('"fraction-train" = 1.0', '"fraction-train" = 0.5'))
    with pytest.raises(ValueError, match="fraction-train is 0.5"):
        slice_cost.main(["--only", "tiny", "--list", str(path), "--results-dir", str(tmp_path)])
