"""Sample-level DP (`dp = 'sample'`) of a graph method whose clients upload more than a model
(docs/privacy.md): FedSKA's local training runs under DP-SGD, its descriptor, slot features and
slot-loss gradients leave each client clipped and noised by the `dp-upload` layer, and each client's
ε, reported every round, is Opacus' RDP of its DP-SGD steps plus its uploads' Gaussian mechanisms,
added order by order (here computed independently of the run's ledger). FLT's autoencoder phase
trains by DP-SGD stepped by Adam and its centroids leave noised, all in the same ledger; IFCA
supports the mode."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from server_app.harness.simulate import simulate
from strategies.shared.run_config import RunConfig, default_run_config
from tests.upload_noise import counting_uploads

RUN = {"dataset": "digits", "model": "mclr", "partition": "label-clusters", "num-clusters": 2,
       "labels-per-cluster": 5, "num-clients": 4, "num-rounds": 2, "local-epochs": 1,
       "batch-size": 32, "lr": 0.05, "max-samples-per-client": 60, "finetune-epochs": 0,
       "checkpoint-every": 0, "seed": 3, "safeguard": "off", "dp": "sample", "dp-delta": 1e-3,
       "dp-noise-multiplier": 1.1, "dp-max-grad-norm": 1.0, "dp-upload-noise-multiplier": 3.0,
       "dp-upload-clip-norm": 2.0, "fedska.k": 1, "fedska.structure-steps": 2,
       "fedska.encoder-steps": 2, "fedska.schedule": "separate", "method": "fedska"}
ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))  # Opacus' default orders


def test_fedska_under_sample_dp_composes_dp_sgd_and_noised_uploads_in_rdp(tmp_path, monkeypatch):
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    from client_app import layers
    from datasets.federated import load_partition

    seen: dict[int, int] = {}
    noise: list[float] = []
    layers._wrapper("client_app.private_upload:around")
    monkeypatch.setitem(layers._WRAPPERS, "client_app.private_upload:around",
                        counting_uploads(seen, noise))
    summary = simulate({**RUN, "output-dir": str(tmp_path), "run-name": "s"})
    rows = [json.loads(line) for line in (tmp_path / "s" / "rounds.jsonl").read_text().splitlines()]
    assert all(r["clients-trained"] == 4 for r in rows if r["round"] > 0)  # round 2: with L_S
    per_round = [r["privacy"]["epsilon-per-client"] for r in rows if r["round"] > 0]
    assert len(per_round) == 2 and all(0 < a < b for a, b in zip(*per_round))

    # every client's final ε: DP-SGD (Poisson rate 1/⌈n/B⌉, ⌈n/B⌉ steps an epoch, every round) and
    # its noised upload records (Gaussian, rate 1), RDP added per order, then converted
    cfg = RunConfig.from_flower({**default_run_config(), **RUN})
    _, partition = load_partition(cfg.data_spec)
    assert sum(seen.values()) == summary["privacy"]["uploads"] > 0
    for client, indices in enumerate(partition.train_indices):
        per_epoch = math.ceil(len(indices) / RUN["batch-size"])
        rdp = compute_rdp(q=1.0 / per_epoch, noise_multiplier=RUN["dp-noise-multiplier"],
                          steps=per_epoch * RUN["num-rounds"], orders=ORDERS)
        # an upload: std σ_u·C_u, sensitivity 2·C_u to one example (any two points of the clipping
        # ball), so noise multiplier σ_u / 2
        rdp = rdp + compute_rdp(q=1.0, noise_multiplier=RUN["dp-upload-noise-multiplier"] / 2,
                                steps=seen[client], orders=ORDERS)
        expected, _ = get_privacy_spent(orders=ORDERS, rdp=rdp, delta=RUN["dp-delta"])
        assert per_round[-1][client] == pytest.approx(expected, rel=1e-9)
    written = json.loads((tmp_path / "s" / "summary.json").read_text())["privacy"]
    assert written["mode"] == "sample" and written["epsilon-max"] == pytest.approx(max(per_round[-1]))

    # what left the clients carries Gaussian noise of std σ_u·C_u = 6
    assert len(noise) > 500 and np.std(noise) == pytest.approx(6.0, rel=0.1)
    assert abs(np.mean(noise)) < 0.5


def test_dp_sgd_adds_a_data_reading_penalty_to_each_examples_loss_before_clipping():
    """With every example in the batch (rate 1), no clipping and no noise to speak of, DP-SGD's step
    is plain SGD's on the task loss + FedSKA's structure pull: the pull's gradient is in it."""
    import copy

    import torch

    from client_app.methods.fedska import StructurePenalty, StructurePull
    from client_app.privacy import dp_train_epochs
    from client_app.training import train_epochs
    from models import build_model
    from strategies.shared.privacy import PrivacyInstructions

    torch.manual_seed(0)
    model = build_model("mclr", (1, 8, 8), 10)
    x, y = torch.randn(24, 1, 8, 8), torch.randint(0, 10, (24,))
    targets, has = torch.randn(24, model.feature_dim), torch.arange(24) % 3 > 0
    trained = []
    for private in (False, True):
        pull = StructurePull(copy.deepcopy(model), x, targets, has, lambda_s=5.0)
        common = dict(epochs=1, batch_size=24, lr=0.5, momentum=0.0,
                      generator=torch.Generator().manual_seed(1), penalty=StructurePenalty(pull))
        if private:
            ins = PrivacyInstructions(noise_multiplier=1e-12, max_grad_norm=1e4, delta=1e-3)
            dp_train_epochs(pull, torch.arange(24), y, ins=ins, prior=[], spent=[], **common)
        else:
            train_epochs(pull, torch.arange(24), y, **common)
        trained.append(torch.cat([p.detach().ravel() for p in pull.model.parameters()]))
        assert pull.mean_structure_loss is not None
    without = StructurePull(copy.deepcopy(model), x, targets, has, lambda_s=0.0)
    train_epochs(without, torch.arange(24), y, epochs=1, batch_size=24, lr=0.5, momentum=0.0,
                 generator=torch.Generator().manual_seed(1))
    plain = torch.cat([p.detach().ravel() for p in without.model.parameters()])
    torch.testing.assert_close(trained[1], trained[0], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(trained[0], plain, atol=1e-4)  # the pull moved the model


FLT_RUN = {**{k: v for k, v in RUN.items() if not k.startswith("fedska.")}, "method": "flt",
           "flt.ae-rounds": 1, "flt.ae-epochs": 1, "flt.ae-batch-size": 32, "flt.ae-lr": 0.01,
           "flt.latent-dim": 16, "flt.k": 2, "flt.umap-neighbors": 3, "flt.no-structure": "keep"}


def test_flt_under_sample_dp_charges_dp_adam_autoencoder_steps_classifier_steps_and_centroids(
        tmp_path, monkeypatch):
    """FLT under dp='sample': the autoencoder phase (train.flt_ae) trains by DP-SGD stepped by Adam
    and its steps reach the ledger, the classifier trains by DP-SGD in the shared loop, and the
    centroids leave each client noised (σ_u·C_u) and are charged at σ_u/2: each round's ε per
    client is Opacus' RDP of that schedule, computed here from the partition alone."""
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    from client_app import layers
    from datasets.federated import load_partition

    seen: dict[int, int] = {}
    noise: list[float] = []
    layers._wrapper("client_app.private_upload:around")
    monkeypatch.setitem(layers._WRAPPERS, "client_app.private_upload:around",
                        counting_uploads(seen, noise))
    summary = simulate({**FLT_RUN, "output-dir": str(tmp_path), "run-name": "f"})
    rows = [json.loads(line) for line in (tmp_path / "f" / "rounds.jsonl").read_text().splitlines()]
    per_round = [r["privacy"]["epsilon-per-client"] for r in rows if r["round"] > 0]
    assert len(per_round) == 2 and all(r["clients-trained"] == 4 for r in rows if r["round"] > 0)
    assert seen == {c: 1 for c in range(4)} and summary["privacy"]["uploads"] == 4

    cfg = RunConfig.from_flower({**default_run_config(), **FLT_RUN})
    _, partition = load_partition(cfg.data_spec)
    for client, indices in enumerate(partition.train_indices):
        n = len(indices)
        ae_epoch = math.ceil(n / FLT_RUN["flt.ae-batch-size"])
        per_epoch = math.ceil(n / RUN["batch-size"])
        for rounds, reported in enumerate(per_round, start=1):
            rdp = compute_rdp(q=1.0 / ae_epoch, noise_multiplier=RUN["dp-noise-multiplier"],
                              steps=ae_epoch * FLT_RUN["flt.ae-epochs"], orders=ORDERS)
            rdp = rdp + compute_rdp(q=1.0 / per_epoch, noise_multiplier=RUN["dp-noise-multiplier"],
                                    steps=per_epoch * rounds, orders=ORDERS)
            rdp = rdp + compute_rdp(q=1.0, noise_multiplier=RUN["dp-upload-noise-multiplier"] / 2,
                                    steps=1, orders=ORDERS)
            expected, _ = get_privacy_spent(orders=ORDERS, rdp=rdp, delta=RUN["dp-delta"])
            assert reported[client] == pytest.approx(expected, rel=1e-9)
    written = json.loads((tmp_path / "f" / "summary.json").read_text())["privacy"]
    assert written["mode"] == "sample" and written["epsilon-max"] == pytest.approx(max(per_round[-1]))

    # the centroids ([k, e] = [2, 16] per client) left with Gaussian noise of std σ_u·C_u = 6
    assert len(noise) == 4 * 2 * 16 and np.std(noise) == pytest.approx(6.0, rel=0.2)


def test_the_autoencoder_phase_runs_dp_sgd_with_adam_and_reports_its_steps():
    """`train.flt_ae` with a `privacy` record: the handler trains through DP-SGD with Adam (no noise
    and no clipping to speak of: Adam's step on the mean reconstruction loss of the sampled batch)
    and the reply reports (σ, q, steps) of the autoencoder's schedule."""
    import torch
    from flwr.app import Context, Message, RecordDict

    from client_app.privacy import dp_train_epochs
    from models.autoencoder import ConvAutoencoder
    from strategies.shared.privacy import PrivacyInstructions

    torch.manual_seed(0)
    x = torch.rand(20, 1, 28, 28)
    model = ConvAutoencoder((1, 28, 28), latent_dim=8)
    before = [p.detach().clone() for p in model.parameters()]
    spent: list = []
    ins = PrivacyInstructions(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-3)
    loss = dp_train_epochs(model, x, x, epochs=2, batch_size=8, lr=0.01, momentum=0.0,
                           generator=torch.Generator().manual_seed(1), task="reconstruction",
                           optimizer="adam", ins=ins, prior=[], spent=spent)
    assert spent == [(1.0, 1.0 / 3, 6)] and 0.0 < loss < 1.0
    assert all(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="optimizer = 'rmsprop'"):
        dp_train_epochs(model, x, x, epochs=1, batch_size=8, lr=0.01, momentum=0.0,
                        generator=torch.Generator().manual_seed(1), task="reconstruction",
                        optimizer="rmsprop", ins=ins, prior=[], spent=[])


def test_ifca_fedska_and_flt_take_sample_dp():
    """(A target ε with FLT and FedSKA, which covers their noised uploads too, is
    tests/test_privacy_target.py's.)"""
    for method in ("ifca", "fedska"):
        assert RunConfig.from_flower({**default_run_config(), **RUN, "method": method}).dp == "sample"
    assert RunConfig.from_flower({**default_run_config(), **FLT_RUN}).dp == "sample"
