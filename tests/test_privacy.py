"""Differential privacy (docs/privacy.md): the accountant against Opacus' own, DP-SGD's noise and
per-example clipping bound in what leaves a client, ε reported and enforced, the clear errors of
bad settings, client-level DP's aggregate, and a DP federation's determinism."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, Message, RecordDict
from torch import nn

from client_app.privacy import PrivacyError, check_model, dp_train_epochs, schedule
from client_app.training import LOCAL_TRAINER, seeded_generator, train_epochs
from server_app.harness.local_grid import set_task_identity
from server_app.harness.simulate import simulate
from strategies.shared.privacy import (PrivacyInstructions, epsilon, ledger_fields, merged,
                                       steps_within)
from strategies.shared.private_aggregation import ClientLevelDP
from strategies.shared.run_config import RunConfig, default_run_config
from strategies.shared.settings import ConfigError

SMALL = {"dataset": "mnist", "partition": "label-clusters", "num-clients": 3, "num-clusters": 3,
         "labels-per-cluster": 2, "max-samples-per-client": 60, "num-rounds": 2,
         "checkpoint-every": 0, "finetune-epochs": 0}


# --- the accountant -------------------------------------------------------------------------------
def test_epsilon_equals_opacus_rdp_accountant_stepped_one_step_at_a_time():
    from opacus.accountants import RDPAccountant

    reference = RDPAccountant()
    for _ in range(300):
        reference.step(noise_multiplier=1.1, sample_rate=0.05)
    for _ in range(120):
        reference.step(noise_multiplier=0.8, sample_rate=0.2)
    expected = reference.get_epsilon(delta=1e-5)
    # the ledger as the server keeps it: rounds merged per (noise, rate)
    rounds = [(1.1, 0.05, 100)] * 3 + [(0.8, 0.2, 60)] * 2
    assert merged(rounds) == [(1.1, 0.05, 300), (0.8, 0.2, 120)]
    assert epsilon(merged(rounds), 1e-5) == pytest.approx(expected, rel=1e-12)
    assert epsilon(rounds, 1e-5) == pytest.approx(expected, rel=1e-12)
    assert epsilon([], 1e-5) == 0.0


def test_calibrated_noise_reaches_the_target_epsilon_after_the_run():
    """The noise multiplier calibrated for a target ε (Opacus' get_noise_multiplier): the binding
    schedule ends within 0.01 below the target, every other one below it; DP-SGD's schedule is the
    client's (client_app.privacy.schedule), client-level DP's one aggregate a round."""
    from strategies.shared.privacy import noise_for_epsilon, run_schedules, sample_schedule

    assert sample_schedule(100, 32, 2) == schedule(100, 32, 2)
    cfg = RunConfig.from_flower({**default_run_config(), **SMALL, "method": "fedavg", "dp": "sample",
                                 "num-rounds": 10, "batch-size": 32})
    schedules = run_schedules(cfg, [100, 160, 160])
    assert schedules == [(0.25, 40), (0.2, 50)]
    sigma = noise_for_epsilon(4.0, 1e-5, schedules)
    reached = [epsilon([(sigma, q, k)], 1e-5) for q, k in schedules]
    assert max(reached) <= 4.0 and max(reached) == pytest.approx(4.0, abs=0.011)
    assert epsilon([(sigma * 0.95, 0.25, 40)], 1e-5) > 4.0  # no smaller σ would do
    client = RunConfig.from_flower({**default_run_config(), **SMALL, "method": "fedavg",
                                    "dp": "client", "dp-delta": 1e-3, "num-rounds": 7})
    assert run_schedules(client) == [(1.0, 7)]
    with pytest.raises(ValueError, match="positive"):
        noise_for_epsilon(0.0, 1e-5, schedules)


def test_a_grid_with_calibrate_noise_sets_each_dp_runs_noise_multiplier():
    from benchmarks.compare import calibrate_noise, calibrated_noise

    settings = {**SMALL, "dp": "client", "dp-delta": 1e-3, "dp-target-epsilon": 2.0}
    calibrated = calibrate_noise(settings, "fedavg")
    cfg = RunConfig.from_flower({**default_run_config(), **calibrated, "method": "fedavg"})
    assert calibrated["dp-noise-multiplier"] >= calibrated_noise(cfg) > 0
    assert epsilon([(cfg.dp_noise_multiplier, 1.0, 2)], 1e-3) <= 2.0
    for untouched in ({**SMALL, "dp": "off"}, {**SMALL, "dp": "client", "dp-delta": 1e-3}):
        assert calibrate_noise(untouched, "fedavg") == untouched  # no DP, or no target


def test_the_graph_sample_cells_run_with_their_own_calibrated_noise_and_the_target():
    """privacy.toml's FLT / FedSKA dp = 'sample' cells, one method each: σ (and upload σ) calibrated
    over every release the method declares (larger than the other methods' σ at that ε, which
    covers DP-SGD steps alone), the cell's dp-target-epsilon kept."""
    from pathlib import Path

    from benchmarks.compare import grid_runs, load_grid

    toml = Path(__file__).resolve().parent.parent / "benchmarks" / "experiments" / "privacy.toml"
    grid = {**load_grid(toml), "seeds": [0]}
    (_, base_methods, base), (_, flt, flt_run), (_, fedska, fedska_run) = grid_runs(
        grid, "t", {}, ["label-clusters-sample-eps4", "label-clusters-sample-graph-flt-eps4",
                        "label-clusters-sample-graph-fedska-eps4"])
    assert (flt, fedska) == (["flt"], ["fedska"]) and "flt" not in base_methods
    assert base["dp-target-epsilon"] == flt_run["dp-target-epsilon"] == fedska_run["dp-target-epsilon"] == 4.0
    assert 0 < base["dp-noise-multiplier"] < flt_run["dp-noise-multiplier"] < fedska_run["dp-noise-multiplier"]
    for run in (base, flt_run, fedska_run):
        assert run["dp-upload-noise-multiplier"] == run["dp-noise-multiplier"]


def test_ledger_travels_per_client_and_steps_within_keep_the_target():
    ledger = {2: [(1.0, 0.1, 50)], 0: [(1.0, 0.1, 20), (1.0, 0.1, 20)]}
    ins = PrivacyInstructions(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5,
                              **ledger_fields(ledger))
    again = PrivacyInstructions.read(ins.config())
    assert again.history(0) == [(1.0, 0.1, 40)] and again.history(2) == [(1.0, 0.1, 50)]
    assert again.history(1) == []
    history, target = [(1.0, 0.1, 40)], 9.0
    k = steps_within(history, 1.0, 0.1, 1000, 1e-5, target)
    assert 0 < k < 1000
    assert epsilon([*history, (1.0, 0.1, k)], 1e-5) <= target
    assert epsilon([*history, (1.0, 0.1, k + 1)], 1e-5) > target
    assert steps_within(history, 1.0, 0.1, 10, 1e-5, 0.0) == 10  # no target


# --- DP-SGD in local training ---------------------------------------------------------------------
def _data(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 10, generator=g) * 5, torch.randint(0, 3, (n,), generator=g)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _dp(model, x, y, noise, clip=1.0, lr=0.5, epochs=1, batch=16, target=0.0, prior=(), seed=3):
    ins = PrivacyInstructions(noise_multiplier=noise, max_grad_norm=clip, delta=1e-5,
                              target_epsilon=target)
    spent: list = []
    loss = dp_train_epochs(model, x, y, epochs=epochs, batch_size=batch, lr=lr, momentum=0.0,
                           generator=seeded_generator(seed), ins=ins, prior=list(prior), spent=spent)
    return loss, spent


def test_dp_sgd_update_is_noisy_and_within_the_per_example_clipping_bound():
    x, y = _data()
    start = _flat(_model())
    plain = _model()
    train_epochs(plain, x, y, epochs=1, batch_size=16, lr=0.5, momentum=0.0,
                 generator=seeded_generator(3))
    # (almost) no noise: each step moves at most lr · C · |batch| / E, E = n·q the expected batch
    quiet = _model()
    _, spent = _dp(quiet, x, y, noise=1e-9, clip=0.01)
    rate, steps = schedule(64, 16, 1)
    assert spent == [(1e-9, rate, steps)] and steps == 4
    moved = float((_flat(quiet) - start).norm())
    # Poisson batches hold at most n examples each
    assert 0 < moved <= steps * 0.5 * 0.01 * 64 / 16 + 1e-6
    assert moved < float((_flat(plain) - start).norm())  # clipping bit: plain SGD moved further
    # with noise: the update differs from the noiseless one by about lr·σ·C/E per step
    noisy = _model()
    _dp(noisy, x, y, noise=1.0, clip=0.01)
    gap = float((_flat(noisy) - _flat(quiet)).norm())
    per_step = 0.5 * 1.0 * 0.01 / 16 * math.sqrt(start.numel())
    assert 0.5 * per_step < gap < 4 * per_step
    # the same seed draws the same batches and noise
    again = _model()
    _dp(again, x, y, noise=1.0, clip=0.01)
    assert torch.equal(_flat(again), _flat(noisy))
    # the model is plain again: no Opacus hooks or per-example gradients left on it
    assert not any(hasattr(p, "grad_sample") and p.grad_sample is not None
                   for p in noisy.parameters())


def test_dp_sgd_takes_a_constant_penalty_as_no_gradient():
    """SFL's pulls with reg-grad off are constants (the reference code): DP-SGD trains as with no
    penalty, as the plain loop does."""
    x, y = _data()
    none, constant = _model(), _model()
    _dp(none, x, y, noise=1.0)
    ins = PrivacyInstructions(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
    dp_train_epochs(constant, x, y, epochs=1, batch_size=16, lr=0.5, momentum=0.0,
                    generator=seeded_generator(3), ins=ins, prior=[], spent=[],
                    penalty=lambda m: torch.linalg.vector_norm(_flat(m)).detach())
    assert torch.equal(_flat(constant), _flat(none))


def test_local_trainer_swaps_in_only_while_set():
    x, y = _data()
    calls = []
    token = LOCAL_TRAINER.set(lambda *a, **k: calls.append(k["epochs"]) or 0.25)
    try:
        assert train_epochs(_model(), x, y, epochs=2, batch_size=8, lr=0.1, momentum=0.0,
                            generator=seeded_generator(0)) == 0.25
    finally:
        LOCAL_TRAINER.reset(token)
    assert calls == [2]
    assert train_epochs(_model(), x, y, epochs=1, batch_size=8, lr=0.1, momentum=0.0,
                        generator=seeded_generator(0)) > 0


def test_target_epsilon_stops_local_training_when_spent():
    x, y = _data()
    rate, _ = schedule(64, 16, 1)
    prior = [(1.0, rate, 30)]
    target = epsilon([*prior, (1.0, rate, 2)], 1e-5) + 1e-9  # room for two steps exactly
    model = _model()
    start = _flat(model)
    _, spent = _dp(model, x, y, noise=1.0, epochs=2, target=target, prior=prior)
    assert spent == [(1.0, rate, 2)]
    assert epsilon([*prior, *spent], 1e-5) <= target
    spent_model = _model()
    _, none = _dp(spent_model, x, y, noise=1.0, target=epsilon(prior, 1e-5), prior=prior)
    assert none == [(1.0, rate, 0)] and torch.equal(_flat(spent_model), start)


def test_batch_norm_and_delta_errors_name_the_layer_and_key():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4))
    with pytest.raises(PrivacyError, match=r"BatchNorm2d layer '1'.*GroupNorm.*ModuleValidator\.fix"):
        check_model(model)
    x, y = _data(n=64)
    with pytest.raises(PrivacyError, match=r"dp-delta = 0.05 must be below 1/n = 0.0156"):
        ins = PrivacyInstructions(noise_multiplier=1.0, max_grad_norm=1.0, delta=0.05)
        dp_train_epochs(_model(), x, y, epochs=1, batch_size=16, lr=0.1, momentum=0.0,
                        generator=seeded_generator(0), ins=ins, prior=[], spent=[])


# --- bad settings, before any client is contacted ----------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    ({"dp": "sample", "dp-noise-multiplier": 0}, "dp-noise-multiplier' = 0 is invalid"),
    ({"dp": "sample", "dp-noise-multiplier": -1.5}, "dp-noise-multiplier' = -1.5 is invalid"),
    ({"dp": "sample", "dp-target-epsilon": -1}, "dp-target-epsilon' = -1 is invalid"),
    ({"dp": "sample", "dp-delta": 0.01}, "dp-delta = 0.01 must be below 1/n"),
    ({"dp": "client", "dp-delta": 0.2, "num-clients": 10}, "below 1/num-clients = 0.1"),
    ({"dp": "sample", "method": "flt"}, "method 'flt''s safeguard chooses its mix on raw held-out data"),
    ({"dp": "client", "method": "ifca"}, "method 'ifca' is not one of them (its server keeps"),
    ({"dp": "client", "method": "sfl"}, "dp = 'client' with safeguard = 'mix'"),
    ({"dp": "sample", "method": "sfl"}, "set safeguard='off'"),
    ({"dp": "sample", "model": "resnet9"}, "BatchNorm2d layer 'features.0.1'"),
    ({"dp": "laplace"}, "'dp'"),
])
def test_bad_settings_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({**default_run_config(), "method": "fedavg", **overrides})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bouquet_check_reports_a_bad_dp_setting(capsys):
    from server_app import cli
    from tests.conftest import REPO

    assert cli.main(["check", str(REPO), "--no-data", "-c",
                     "dp='sample' dp-noise-multiplier=0"]) == cli.INVALID
    captured = capsys.readouterr()
    assert "dp-noise-multiplier" in captured.out + captured.err


# --- client-level DP's aggregate --------------------------------------------------------------------
class _Mean:
    """The aggregate_train of a FedAvg-type strategy, for the wrapper's metrics."""

    def aggregate_train(self, server_round, replies):
        return None, MetricRecord({"train-loss": 1.0})


def _reply(values: np.ndarray, examples: int) -> Message:
    set_task_identity()
    content = RecordDict({"model": ArrayRecord({"w": Array(values.astype(np.float32))}),
                          "metrics": MetricRecord({"num-examples": examples})})
    return Message(content, dst_node_id=1, message_type="train")


def test_client_level_dp_clips_updates_weights_them_equally_and_noises_the_aggregate():
    sent = ArrayRecord({"w": Array(np.zeros(4000, dtype=np.float32))})
    far, near = np.full(4000, 1.0), np.full(4000, 0.001)  # norms 63.2 (clipped to 1) and 0.063
    wrapper = ClientLevelDP(_Mean(), noise_multiplier=1e-9, clip_norm=1.0, delta=1e-5,
                            target_epsilon=0.0, num_clients=10, num_sampled=2, seed=0)
    wrapper.sent = sent
    arrays, metrics = wrapper.aggregate_train(1, [_reply(far, 1000), _reply(near, 1)])
    got = arrays["w"].numpy()
    expected = (far / np.linalg.norm(far) + near) / 2  # equal weights despite 1000 vs 1 examples
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert metrics["train-loss"] == 1.0 and wrapper.releases == 1
    noisy = ClientLevelDP(_Mean(), noise_multiplier=2.0, clip_norm=1.0, delta=1e-5,
                          target_epsilon=0.0, num_clients=10, num_sampled=2, seed=0)
    noisy.sent = sent
    noise = noisy.aggregate_train(1, [_reply(far, 1000), _reply(near, 1)])[0]["w"].numpy() - got
    assert np.std(noise) == pytest.approx(2.0 * 1.0 / 2, rel=0.05)  # σ·C/m
    from opacus.accountants import RDPAccountant

    reference = RDPAccountant()
    reference.step(noise_multiplier=2.0, sample_rate=0.2)
    assert noisy.epsilon() == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)


# --- federations ----------------------------------------------------------------------------------
def _rounds(directory) -> list[dict]:
    return [json.loads(line) for line in (directory / "rounds.jsonl").read_text().splitlines()]


def test_sample_dp_federation_reports_epsilon_and_is_deterministic(tmp_path):
    settings = {**SMALL, "method": "fedprox", "dp": "sample", "dp-noise-multiplier": 1.2,
                "dp-max-grad-norm": 0.5, "output-dir": str(tmp_path)}
    first = simulate({**settings, "run-name": "a"})
    second = simulate({**settings, "run-name": "b"})
    a, b = _rounds(tmp_path / "a"), _rounds(tmp_path / "b")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(a) == strip(b)
    eps = [r["privacy"]["epsilon-max"] for r in a if "privacy" in r]
    assert len(eps) == 2 and 0 < eps[0] < eps[1]
    # each client's final ε in clients.csv is the last round's
    import csv

    with open(tmp_path / "a" / "clients.csv") as handle:
        final = {int(row["client-id"]): float(row["epsilon"]) for row in csv.DictReader(handle)}
    last = a[-1]["privacy"]["epsilon-per-client"]
    assert final == {c: pytest.approx(e) for c, e in enumerate(last)}
    assert first["privacy"]["epsilon-max"] == pytest.approx(eps[-1])
    assert first["privacy"] == second["privacy"]


def test_sample_dp_target_epsilon_is_enforced_in_a_federation(tmp_path):
    summary = simulate({**SMALL, "method": "fedavg", "dp": "sample", "num-rounds": 3,
                        "dp-noise-multiplier": 0.8, "dp-target-epsilon": 9.0,
                        "output-dir": str(tmp_path), "run-name": "t"})
    rows = [r for r in _rounds(tmp_path / "t") if "privacy" in r]
    assert all(max(r["privacy"]["epsilon-per-client"]) <= 9.0 for r in rows)
    assert summary["privacy"]["epsilon-max"] <= 9.0
    assert summary["privacy"]["stopped-clients"]  # the target stopped someone's training


def test_client_dp_federation_noises_the_aggregate_and_stops_at_the_target(tmp_path):
    summary = simulate({**SMALL, "method": "fedavg", "dp": "client", "num-rounds": 3,
                        "dp-noise-multiplier": 1.0, "dp-clip-norm": 0.5, "dp-delta": 1e-3,
                        "dp-target-epsilon": 6.0, "output-dir": str(tmp_path), "run-name": "c"})
    rows = [r for r in _rounds(tmp_path / "c") if "privacy" in r]
    spent = [r["privacy"]["epsilon"] for r in rows]
    assert spent == sorted(spent) and all(e <= 6.0 for e in spent)
    assert summary["privacy"]["epsilon"] == pytest.approx(epsilon(
        [(1.0, 1.0, summary["privacy"]["aggregates"])], 1e-3))
    # ε after 1, 2, 3 aggregates: 3.5, 5.4, 7.0: the third round sends no training
    assert summary["privacy"]["aggregates"] == 2 and summary["privacy"]["stopped-round"] == 3
