"""Sample-level DP (`dp = 'sample'`) for FedCG (docs/privacy.md): its model (θ_a, the residual
branches' rows V, the GCN weights and λ) and its student train by DP-SGD with per-example gradients
from Opacus (FedCG layers through their registered grad sampler), the balance statistics leave each
client clipped and noised by the `dp-upload` layer, each client's ε every round is Opacus' RDP of
that schedule, a target ε stops training (and the balance queries it would not afford), and bad
combinations are refused in one line before any client is contacted."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from strategies.shared.run_config import RunConfig, default_run_config
from tests.upload_noise import counting_uploads

RUN = {"method": "fedcg", "dataset": "digits", "model": "cnn", "partition": "domains",
       "domain-family": "styles", "domains-per-client": 2, "num-clients": 4, "num-rounds": 2,
       "local-epochs": 1, "batch-size": 10, "lr": 0.05, "max-samples-per-client": 30,
       "finetune-epochs": 0, "checkpoint-every": 0, "seed": 3, "fraction-train": 1.0,
       "fedcg.domains": 2, "fedcg.teacher-period": 1, "fedcg.adj-warmup": 1,
       "fedcg.bottleneck": 8, "fedcg.sinkhorn-iters": 3, "fedcg.balance-sample": 4,
       "dp": "sample", "dp-delta": 1e-3, "dp-noise-multiplier": 1.1, "dp-max-grad-norm": 1.0,
       "dp-upload-noise-multiplier": 3.0, "dp-upload-clip-norm": 2.0}
ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))  # Opacus' default orders


def _model(residual: bool = True, use_w: bool = True):
    from models import build_model
    from models.fedcg import FedCGModel, FedCGSpec

    torch.manual_seed(0)
    spec = FedCGSpec(num_domains=3, layers="all", gcn_layers=2, bottleneck=4, use_w=use_w,
                     residual=residual, relu=True, gcn_init="scaled")
    model = FedCGModel(build_model("cnn", (1, 12, 12), 5), spec)
    model.set_adjacency(torch.tensor([[0.5, 0.3, 0.2], [0.3, 0.5, 0.2], [0.2, 0.2, 0.6]]))
    return model


@pytest.mark.parametrize("residual,use_w", [(True, True), (True, False), (False, True)])
def test_opacus_per_example_gradients_of_a_fedcg_model_are_autograds_one_example_at_a_time(
        residual, use_w):
    """Every parameter of a FedCG model (θ_a, V, the GCN weights, λ and the backbone's layers):
    Opacus' per-example gradients, FedCG layers through their grad sampler, equal the gradients
    of each example's loss alone, by plain autograd."""
    from opacus import GradSampleModule
    from torch.nn import functional as F

    from client_app.methods.fedcg import DomainInput
    from client_app.methods.fedcg_privacy import recording

    model = _model(residual, use_w)
    x = torch.randn(7, 1, 12, 12)
    y = torch.randint(0, 5, (7,))
    domains = torch.tensor([0, 2, 2, 1, 0, 2, 1])
    expected = []
    for i in range(7):
        model.zero_grad()
        F.cross_entropy(DomainInput(model, x, domains)(torch.tensor([i])), y[i:i + 1]).backward()
        expected.append({n: p.grad.clone() for n, p in model.named_parameters()
                         if p.grad is not None})
    wrapped = GradSampleModule(DomainInput(model, x, domains), batch_first=True,
                               loss_reduction="sum")
    with recording(model):
        F.cross_entropy(wrapped(torch.arange(7)), y, reduction="sum").backward()
    for name, p in model.named_parameters():
        assert p.grad_sample is not None, name
        assert p.grad_sample.shape == (7, *p.shape), name
        want = torch.stack([e[name] if name in e else torch.zeros_like(p) for e in expected])
        torch.testing.assert_close(p.grad_sample, want, atol=1e-6, rtol=1e-4, msg=name)
    wrapped._close()


def test_dp_sgd_on_a_fedcg_model_is_sgd_plus_gaussian_noise_on_every_parameter():
    """DP-SGD of a FedCG model at sampling rate 1 with no clipping to speak of: without noise, one
    step is plain SGD's on the batch (the per-example gradients sum to the batch's); with noise σ,
    every parameter the client sends (θ_a, V, the GCN weights, λ, the backbone) moves by lr times
    Gaussian noise of std σ·C / n more."""
    from client_app.methods.fedcg import DomainInput
    from client_app.methods.fedcg_privacy import recording
    from client_app.privacy import dp_train_epochs
    from client_app.training import train_epochs
    from strategies.shared.privacy import PrivacyInstructions

    x = torch.randn(12, 1, 12, 12)
    y = torch.randint(0, 5, (12,))
    domains = torch.tensor([0, 1, 2] * 4)
    common = dict(epochs=1, batch_size=12, lr=0.1, momentum=0.0)
    plain = _model()
    train_epochs(DomainInput(plain, x, domains), torch.arange(12), y,
                 generator=torch.Generator().manual_seed(1), **common)
    trained = {}
    for sigma in (1e-12, 1e-3):
        model = _model()
        ins = PrivacyInstructions(noise_multiplier=sigma, max_grad_norm=1e3, delta=1e-3)
        spent = []
        with recording(model):
            dp_train_epochs(DomainInput(model, x, domains), torch.arange(12), y, ins=ins, prior=[],
                            spent=spent, generator=torch.Generator().manual_seed(1), **common)
        assert spent == [(sigma, 1.0, 1)]
        trained[sigma] = dict(model.named_parameters())
    for name, p in plain.named_parameters():
        torch.testing.assert_close(trained[1e-12][name], p, atol=2e-6, rtol=1e-4, msg=name)
    moved = torch.cat([(trained[1e-3][n] - trained[1e-12][n]).detach().ravel() / 0.1
                       for n, _ in plain.named_parameters()])
    assert float(moved.std()) == pytest.approx(1e-3 * 1e3 / 12, rel=0.05)
    for name in ("features.0.V", "features.0.W1", "features.3.W2", "features.3.lambda",
                 "features.3.agnostic.weight"):  # the branches, the GCN and θ_a are noised too
        assert not torch.equal(trained[1e-3][name], trained[1e-12][name]), name


def _expected_epsilon(n: int, rounds: int, uploads: int) -> float:
    """Opacus' RDP of a FedCG client's schedule, from its train size alone: each round the model's
    and the student's DP-SGD (Poisson rate 1/⌈n/B⌉, ⌈n/B⌉ steps an epoch), and each noised balance
    reply a Gaussian mechanism at σ_u/2 (sensitivity 2·C_u to one example), RDP added per order."""
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    per_epoch = math.ceil(n / RUN["batch-size"])
    rdp = 2 * compute_rdp(q=1.0 / per_epoch, noise_multiplier=RUN["dp-noise-multiplier"],
                          steps=per_epoch * RUN["local-epochs"] * rounds, orders=ORDERS)
    rdp = rdp + compute_rdp(q=1.0, noise_multiplier=RUN["dp-upload-noise-multiplier"] / 2,
                            steps=uploads, orders=ORDERS)
    return get_privacy_spent(orders=ORDERS, rdp=rdp, delta=RUN["dp-delta"])[0]


def _rounds(directory) -> list[dict]:
    return [json.loads(line) for line in (directory / "rounds.jsonl").read_text().splitlines()]


def test_fedcg_under_sample_dp_reports_opacus_epsilon_of_its_schedule_and_noises_its_uploads(
        tmp_path, monkeypatch):
    """Two rounds, a new teacher each (so one balance query each): every round's ε per client is
    Opacus' RDP of 2 DP-SGD trainings a round plus one noised balance reply a round, computed here
    from the partition; the balance statistics left with noise of std σ_u·C_u = 6, the train
    replies without any count, and the noised statistics still gave a labelling."""
    from client_app import layers
    from datasets.federated import load_partition

    seen: dict[int, int] = {}
    noise: list[float] = []
    layers._wrapper("client_app.private_upload:around")
    monkeypatch.setitem(layers._WRAPPERS, "client_app.private_upload:around",
                        counting_uploads(seen, noise))
    summary = simulate_run(tmp_path, "s")
    rows = [r for r in _rounds(tmp_path / "s") if r["round"] > 0]
    assert [r["clients-trained"] for r in rows] == [4, 4]
    assert seen == {c: 2 for c in range(4)} and summary["privacy"]["uploads"] == 8
    cfg = RunConfig.from_flower({**default_run_config(), **RUN})
    _, partition = load_partition(cfg.data_spec)  # the partition the run used
    for rounds, row in enumerate(rows, start=1):
        for client, indices in enumerate(partition.train_indices):
            assert row["privacy"]["epsilon-per-client"][client] == pytest.approx(
                _expected_epsilon(len(indices), rounds, uploads=rounds), rel=1e-9)
        assert "domain-histogram" not in row["fedcg"] and "student-agreement" not in row["fedcg"]
        assert row["fedcg"]["balance"]["teacher-version"] == rounds - 1
    written = json.loads((tmp_path / "s" / "summary.json").read_text())["privacy"]
    assert written["mode"] == "sample" and written["epsilon-max"] == pytest.approx(
        max(rows[-1]["privacy"]["epsilon-per-client"]))
    # per reply: logit sums and squares / n (2 + 2 values) and 4 logit rows of 2 (8 values)
    assert len(noise) == 8 * 12 and np.std(noise) == pytest.approx(6.0, rel=0.2)


def simulate_run(tmp_path, name: str, **overrides):
    from server_app.harness.simulate import simulate

    return simulate({**RUN, **overrides, "output-dir": str(tmp_path), "run-name": name})


def test_a_target_epsilon_stops_fedcgs_dp_sgd_and_the_balance_queries_it_cannot_afford(tmp_path):
    """A target that round 2's balance reply fits in but not its whole DP-SGD: round 2's noised
    replies are charged before training, the ledger the clients get includes them, and every client
    stops its DP-SGD at the target. A third round's balance query would pass it, so it goes to no
    client (withheld). No client's ε ever exceeds the target."""
    from datasets.federated import load_partition

    cfg = RunConfig.from_flower({**default_run_config(), **RUN})
    _, partition = load_partition(cfg.data_spec)
    sizes = [len(i) for i in partition.train_indices]
    target = round(max(_expected_epsilon(n, 1, 2) for n in sizes) + 0.01, 3)
    assert target < min(_expected_epsilon(n, 2, 2) for n in sizes)  # round 2 cannot train it all
    summary = simulate_run(tmp_path, "t", **{"dp-target-epsilon": target, "num-rounds": 3})
    rows = [r for r in _rounds(tmp_path / "t") if r["round"] > 0]
    assert [r["privacy"]["uploads"] for r in rows] == [4, 8, 8]
    assert [r["privacy"]["stopped-clients"] for r in rows] == [0, 4, 4]
    assert [r["privacy"]["withheld-clients"] for r in rows] == [0, 0, 4]
    for row in rows:
        assert max(row["privacy"]["epsilon-per-client"]) <= target
    assert summary["privacy"]["stopped-clients"] == [0, 1, 2, 3]
    assert summary["privacy"]["epsilon-max"] <= target


@pytest.mark.parametrize("overrides, message", [
    ({"dp": "sample", "fedcg.clustering": "kmeans"},
     "dp = 'sample' with fedcg.clustering = 'kmeans'"),
    ({"dp": "client", "fedcg.clustering": "kmeans"},
     "dp = 'client' with fedcg.clustering = 'kmeans'"),
    ({"dp": "client", "dp-delta": 0.5}, "below 1/num-clients = 0.25"),
    ({"dp": "sample", "dp-delta": 0.05}, "dp-delta = 0.05 must be below 1/n"),
])
def test_fedcg_refuses_what_dp_does_not_cover_in_one_line_before_any_client(overrides, message):
    from strategies.shared.settings import ConfigError

    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({**default_run_config(), **RUN, **overrides})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_fedcg_declares_both_dp_modes():
    from strategies.shared import registry

    assert registry.METHODS["fedcg"].privacy == ("sample", "client")
    for mode in ("sample", "client"):  # accepted as they are
        cfg = RunConfig.from_flower({**default_run_config(), **RUN, "dp": mode})
        assert cfg.dp == mode and cfg.method == "fedcg"


# --- dp='client' -------------------------------------------------------------------------------------
# a small clipping norm keeps the noised model trainable at this size (noise std σ·C·max weight)
CLIENT_RUN = {**RUN, "dp": "client", "dp-clip-norm": 0.01, "dp-noise-multiplier": 2.0}


def test_client_level_dp_clips_fedcgs_joint_update_and_noises_its_mean(monkeypatch):
    """dp='client': each client's update of the model and the student together is clipped to C
    against what it was sent, and their n-weighted mean leaves the server with Gaussian noise of std
    σ·C·(the largest weight); each client is charged (its weight / the largest)² / σ²."""
    from flwr.app import ArrayRecord as Arrays

    from models import build_model
    from strategies.methods.fedcg.server import build_fedcg
    from strategies.shared.private_aggregation import AggregateNoise, use_private

    cfg = RunConfig.from_flower({**default_run_config(), **CLIENT_RUN, "dp-clip-norm": 0.5})
    strategy = use_private(build_fedcg(cfg), AggregateNoise.of(cfg))
    torch.manual_seed(0)
    strategy.bind(Arrays(build_model("cnn", (1, 28, 28), 10).state_dict()))
    model = strategy.model_layout.row(strategy.model).double()
    student = strategy.student_layout.row(strategy.student).double()
    start = torch.cat([model, student])
    updates = [torch.randn(len(start), dtype=torch.float64) * s for s in (1e-4, 1.0, 3.0)]
    weights = torch.tensor([10.0, 20.0, 30.0])
    assert strategy._private_mean(1, [0, 2, 3], [(start + u)[:len(model)].float() for u in updates],
                                  [(start + u)[len(model):].float() for u in updates], weights)
    clipped = [u * min(1.0, 0.5 / float(u.norm())) for u in updates]
    share = weights.double() / weights.sum()
    expected = start + sum(w * u for w, u in zip(share, clipped))
    released = torch.cat([strategy.model_layout.row(strategy.model).double(),
                          strategy.student_layout.row(strategy.student).double()])
    noise = released - expected
    assert float(noise.std()) == pytest.approx(2.0 * 0.5 * 0.5, rel=0.02)  # σ·C·(30/60)
    assert abs(float(noise.mean())) < 0.01
    rho = strategy.private.rho
    torch.testing.assert_close(rho, torch.tensor([(1 / 3) ** 2, 0.0, (2 / 3) ** 2, 1.0],
                                                 dtype=torch.float64) / 4.0)


def test_fedcg_under_client_dp_reports_each_clients_epsilon_of_its_aggregates_and_uploads(
        tmp_path, monkeypatch):
    """Two rounds, a new teacher each: every client's ε after round r is Opacus' RDP of one
    Gaussian whose ρ = r·(n_k / n_max)²/σ² (its weight in each noised mean) + r/σ_u² (its noised
    balance replies); the train replies carry no count, the balance statistics leave noised."""
    from client_app import layers
    from datasets.federated import load_partition
    from strategies.shared.privacy import epsilon

    seen: dict[int, int] = {}
    noise: list[float] = []
    layers._wrapper("client_app.private_upload:around")
    monkeypatch.setitem(layers._WRAPPERS, "client_app.private_upload:around",
                        counting_uploads(seen, noise))
    summary = simulate_run(tmp_path, "c", **{k: v for k, v in CLIENT_RUN.items() if k not in RUN
                                             or RUN[k] != v})
    rows = [r for r in _rounds(tmp_path / "c") if r["round"] > 0]
    assert [r["clients-trained"] for r in rows] == [4, 4]
    assert seen == {c: 2 for c in range(4)}
    cfg = RunConfig.from_flower({**default_run_config(), **CLIENT_RUN})
    _, partition = load_partition(cfg.data_spec)
    sizes = [len(i) for i in partition.train_indices]
    for rounds, row in enumerate(rows, start=1):
        assert row["privacy"]["aggregates"] == rounds and row["privacy"]["uploads"] == 4 * rounds
        for client, n in enumerate(sizes):
            rho = rounds * (n / max(sizes)) ** 2 / 2.0 ** 2 + rounds / 3.0 ** 2
            assert row["privacy"]["epsilon-per-client"][client] == pytest.approx(
                epsilon([(1.0 / math.sqrt(rho), 1.0, 1)], RUN["dp-delta"]), rel=1e-9)
        assert "domain-histogram" not in row["fedcg"] and "student-agreement" not in row["fedcg"]
    assert summary["privacy"]["mode"] == "client" and summary["privacy"]["aggregates"] == 2
    assert len(noise) == 8 * 12 and np.std(noise) == pytest.approx(6.0, rel=0.2)


def test_a_target_epsilon_stops_fedcg_under_client_dp_before_it_is_passed(tmp_path):
    """dp='client' with a target above round 1's ε but below what round 2 would add: round 2's
    balance replies fit and are charged, its training does not start (a round costing what the
    last did would pass the target), and no client's ε ever exceeds the target."""
    from datasets.federated import load_partition
    from strategies.shared.privacy import epsilon

    cfg = RunConfig.from_flower({**default_run_config(), **CLIENT_RUN})
    _, partition = load_partition(cfg.data_spec)
    first = 1.0 / 2.0 ** 2 + 1.0 / 3.0 ** 2  # the largest client's ρ after round 1
    target = round(epsilon([(1.0 / math.sqrt(1.5 * first), 1.0, 1)], RUN["dp-delta"]), 3)
    summary = simulate_run(tmp_path, "ct", **{k: v for k, v in CLIENT_RUN.items()
                                              if k not in RUN or RUN[k] != v},
                           **{"dp-target-epsilon": target})
    rows = [r for r in _rounds(tmp_path / "ct") if r["round"] > 0]
    assert [r["clients-trained"] for r in rows] == [4, 0]
    assert [r["privacy"]["aggregates"] for r in rows] == [1, 1]
    assert [r["privacy"]["uploads"] for r in rows] == [4, 8]
    for row in rows:
        assert row["privacy"]["epsilon"] <= target
    assert summary["privacy"]["stopped-round"] == 2 and summary["privacy"]["epsilon"] <= target
    assert len(partition.train_indices) == 4


@pytest.mark.parametrize("mode", ["sample", "client"])
def test_a_resumed_fedcg_dp_run_reports_the_epsilon_of_an_uninterrupted_one(tmp_path, mode):
    """A FedCG run under DP cut after round 1 and resumed from its checkpoint: every round's ε, the
    privacy summary and the final metrics are those of the run left alone (the balance replies'
    ledger and noise seeds, and under `client` the per-client accountant, travel with the strategy)."""
    from server_app.harness.simulate import simulate

    settings = {**(RUN if mode == "sample" else CLIENT_RUN), "num-rounds": 3, "checkpoint-every": 1}

    def run(directory, **more):
        simulate({**settings, **more, "output-dir": str(directory), "run-name": "run"})
        return _rounds(directory / "run"), json.loads((directory / "run" / "summary.json").read_text())

    full_rows, full = run(tmp_path / "full")
    run(tmp_path / "cut", **{"num-rounds": 1})
    rows, resumed = run(tmp_path / "cut", resume=True)
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    spent = [r["privacy"] for r in full_rows if r["round"] > 0]
    assert [r["privacy"] for r in rows if r["round"] > 0] == spent
    assert spent[0]["uploads"] < spent[2]["uploads"]  # balance replies charged after the resume
    assert resumed["privacy"] == full["privacy"] and resumed["final"] == full["final"]


def test_an_empty_poisson_batch_is_a_step_of_noise_alone(monkeypatch):
    """DP-SGD's Poisson sampling can draw no example: the FedCG model's step is then the noise
    alone (no crash in the FedCG layer or its grad sampler)."""
    from client_app import privacy
    from client_app.methods.fedcg import DomainInput
    from client_app.methods.fedcg_privacy import recording
    from strategies.shared.privacy import PrivacyInstructions

    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = torch.randn(4, 1, 12, 12), torch.randint(0, 5, (4,))
    monkeypatch.setattr(privacy.torch, "rand", lambda n, generator=None: torch.ones(n))  # none drawn
    spent = []
    with recording(model):
        privacy.dp_train_epochs(DomainInput(model, x, torch.tensor([0, 1, 2, 0])), torch.arange(4), y,
                                epochs=1, batch_size=2, lr=0.1, momentum=0.0,
                                generator=torch.Generator().manual_seed(0), prior=[], spent=spent,
                                ins=PrivacyInstructions(noise_multiplier=1.0, max_grad_norm=1.0,
                                                        delta=1e-3))
    assert spent == [(1.0, 0.5, 2)]
    moved = torch.cat([(p.detach() - before[n]).ravel() / 0.1 for n, p in model.named_parameters()])
    assert float(moved.std()) == pytest.approx(1.0 * 1.0 / 2 * math.sqrt(2), rel=0.05)
