"""Client-level DP of the graph methods' per-client aggregates and of their non-model uploads
(docs/privacy.md, strategies/shared/private_aggregation.py `AggregateNoise`, client_app/private_upload.py):
each aggregate's noise is calibrated to its own sensitivity (C times its largest weight), zero noise
gives the aggregate of the clipped updates, the noise depends on the seed, uploads leave a client
clipped and noised, and a short federation of each graph method reports ε per round."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from server_app.harness.local_grid import set_task_identity
from server_app.harness.simulate import simulate
from strategies.shared.messages import METRICS, MODEL
from strategies.shared.params import ParameterLayout
from strategies.shared.privacy import DP_UPLOAD, epsilon
from strategies.shared.private_aggregation import AggregateNoise, use_private
from strategies.shared.run_config import RunConfig, default_run_config


def _layer(noise=1.0, clip=1.0, seed=0, num_clients=4, target=0.0) -> AggregateNoise:
    return AggregateNoise(noise_multiplier=noise, clip_norm=clip, upload_noise_multiplier=2.0,
                          upload_clip_norm=0.5, delta=1e-3, target_epsilon=target,
                          num_clients=num_clients, seed=seed)


# --- sensitivity and accounting ---------------------------------------------------------------------
def test_each_aggregates_noise_is_its_largest_weight_on_a_sensitive_client():
    weights = torch.tensor([[0.5, 0.3, 0.2, 0.0],
                            [0.1, 0.1, 0.0, 0.8],
                            [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    sensitive = torch.tensor([True, True, True, False])  # client 3's row is an earlier release
    layer = _layer(noise=2.0, clip=0.5)
    std, rho = layer.cost(weights, sensitive)
    # per aggregate: σ·C·max over the sensitive clients (0.5, 0.1, none)
    np.testing.assert_allclose(std.numpy(), [2.0 * 0.5 * 0.5, 2.0 * 0.5 * 0.1, 0.0])
    # per client: Σ_r (W_rk / m_r)² / σ²
    expected = [(1.0 + 1.0) / 4, ((0.3 / 0.5) ** 2 + 1.0) / 4, (0.2 / 0.5) ** 2 / 4, 0.0]
    np.testing.assert_allclose(rho.numpy(), expected)


def test_epsilon_is_the_rdp_accountants_for_the_composed_gaussian_and_targets_withhold():
    from opacus.accountants import RDPAccountant

    layer = _layer(noise=1.5, num_clients=2)
    rows = torch.zeros(1, 10)
    assert layer.noised(1, rows, torch.tensor([[0.5, 0.5]]), torch.tensor([True, True]))
    layer.charge_uploads([0])  # one upload at σ_u = 2
    reference = RDPAccountant()  # one aggregate at σ and one upload at σ_u, composed step by step
    reference.step(noise_multiplier=1.5, sample_rate=1.0)
    reference.step(noise_multiplier=2.0, sample_rate=1.0)
    assert layer.epsilon() == pytest.approx(reference.get_epsilon(1e-3), rel=1e-9)
    assert layer.epsilons()[1] == pytest.approx(epsilon([(1.5, 1.0, 1)], 1e-3), rel=1e-9)
    # a target below the next aggregate's cost: withheld, rows untouched, training stops
    capped = _layer(noise=1.0, num_clients=2, target=epsilon([(1.0, 1.0, 1)], 1e-3) * 1.01)
    assert capped.begin_round(1)
    assert capped.noised(1, rows, torch.tensor([[1.0, 0.0]]), torch.tensor([True, True]))
    before = rows.clone()
    assert not capped.noised(2, rows, torch.tensor([[1.0, 0.0]]), torch.tensor([True, True]))
    assert torch.equal(rows, before) and capped.stopped_at == 2 and not capped.begin_round(3)
    assert capped.epsilon() <= capped.target_epsilon


# --- SFL's aggregates: zero noise = the clipped aggregate, noise per row, seeds ----------------------
def _sfl(private: AggregateNoise | None, start_rows: torch.Tensor, uploads: dict[int, torch.Tensor]):
    from strategies.methods.sfl.server import SFL

    cfg = RunConfig.from_flower({**default_run_config(), "method": "sfl", "num-clients": 4,
                                 "sfl.rows": "all", "sfl.alpha": 0.7, "sfl.hops": 1})
    graph = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]], dtype=np.float32)
    strategy = SFL(4, 1.0, cfg.sfl, prior=graph)
    if private is not None:
        use_private(strategy, private)
    arrays = ArrayRecord({"w": Array(np.zeros(start_rows.shape[1], dtype=np.float32))})
    strategy.bind(arrays)
    strategy.layout = ParameterLayout.of(arrays)
    strategy.aggregated[:] = start_rows
    strategy.personal[:] = start_rows
    for client, row in uploads.items():
        strategy.last_trained[client] = 1
        strategy.absorb(client, RecordDict({
            MODEL: strategy.layout.arrays(row),
            METRICS: MetricRecord({"num-examples": 10, "train-loss": 0.0})}))
    strategy.after_train(1)
    return strategy


def test_sfl_zero_noise_equals_the_aggregate_of_clipped_updates_and_noise_follows_the_seed():
    size = 20_000
    generator = torch.Generator().manual_seed(0)
    starts = torch.randn(4, size, generator=generator) * 0.01
    uploads = {0: starts[0] + 3.0 * torch.randn(size, generator=generator) / math.sqrt(size),
               2: starts[2] + 0.2 * torch.randn(size, generator=generator) / math.sqrt(size)}
    clipped = {0: starts[0] + (uploads[0] - starts[0]) / float((uploads[0] - starts[0]).norm()),
               2: uploads[2]}  # norms ≈ 3 (clipped to 1) and ≈ 0.2 (kept)
    plain = _sfl(None, starts, clipped)
    quiet = _sfl(_layer(noise=1e-9, seed=0), starts, uploads)
    np.testing.assert_allclose(quiet.aggregated.numpy(), plain.aggregated.numpy(), atol=1e-6)
    np.testing.assert_allclose(quiet.personal.numpy(), plain.personal.numpy(), atol=1e-6)
    assert quiet.private.aggregates == 4  # every row: clients 0 and 2 reach all of them

    noisy = _sfl(_layer(noise=1.0, seed=0), starts, uploads)
    again = _sfl(_layer(noise=1.0, seed=0), starts, uploads)
    other = _sfl(_layer(noise=1.0, seed=1), starts, uploads)
    assert torch.equal(noisy.aggregated, again.aggregated)
    assert not torch.allclose(noisy.aggregated, other.aggregated)
    # each row's noise std is σ·C·(its largest weight on a trained client): rows 0..3 of W
    operator = plain.propagation.operator.double()
    largest = operator[:, [0, 2]].max(dim=1).values
    spread = (noisy.aggregated - plain.aggregated).double().std(dim=1)
    np.testing.assert_allclose(spread.numpy(), largest.numpy(), rtol=0.05)
    _, rho = noisy.private.cost(operator, torch.tensor([True, False, True, False]))
    assert noisy.private.epsilon() == pytest.approx(
        epsilon([(1 / math.sqrt(float(rho.max())), 1.0, 1)], 1e-3))


@pytest.mark.parametrize("fresh_only", [False, True])
def test_flt_noises_each_distinct_neighbourhood_aggregate_by_its_sensitivity(fresh_only):
    from strategies.methods.flt.neighbourhood import NeighbourhoodModels
    from strategies.methods.flt.server import FLT
    from strategies.methods.flt.settings import FLTSection

    size = 20_000
    held = torch.zeros(3, size)
    held[2] = 1.0
    trained = held.clone()
    trained[1] = 5.0 / math.sqrt(size)  # client 1 trained: update of norm 5, clipped to C = 1
    graph = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=np.float32)  # {0, 1}, {2}

    def run(private):
        flt = FLT(3, 0.5, FLTSection(fresh_only=fresh_only), input_shape=(1, 28, 28))
        flt.models = NeighbourhoodModels(held[0], 3)
        flt.models.aggregate(held, [0, 1, 2], torch.ones(3))  # every client holds its row
        flt.models.set_graph(graph)
        if private is not None:
            use_private(flt, private)
        flt.personal = trained.clone()
        flt.num_examples = torch.tensor([1.0, 3.0, 1.0])
        flt.personal[1] = (private.clip(trained[1], held[1]) if private is not None
                           else trained[1] / 5.0)  # absorb's clipping
        flt._trained = [1]
        flt.after_train(1)
        return flt

    plain, quiet, noisy = run(None), run(_layer(noise=1e-9, num_clients=3)), run(_layer(num_clients=3))
    for client in range(3):
        torch.testing.assert_close(quiet.models.model(client), plain.models.model(client))
    # the group {0, 1}: one aggregate, client 1's weight 1 (fresh-only) or 3/4; {2} holds a release
    weight = 1.0 if fresh_only else 0.75
    spread = (noisy.models.model(0) - plain.models.model(0)).double().std()
    assert float(spread) == pytest.approx(weight, rel=0.05)
    assert torch.equal(noisy.models.model(0), noisy.models.model(1))  # one release for the group
    torch.testing.assert_close(noisy.models.model(2), plain.models.model(2))  # nothing new: no noise
    assert noisy.private.aggregates == 1
    assert noisy.private.epsilon() == pytest.approx(epsilon([(1.0, 1.0, 1)], 1e-3))


# --- the non-model uploads leave the client clipped and noised ----------------------------------------
def _upload_reply(message: Message, context: Context) -> Message:
    values = np.full(5000, 0.1, dtype=np.float32)  # norm 7.07: clipped to 0.5
    return Message(RecordDict({"centroids": ArrayRecord({"mu": Array(values)}),
                               "metrics": MetricRecord({"num-examples": 7})}), reply_to=message)


def _request(layer: AggregateNoise, records: list[str]) -> Message:
    set_task_identity()
    return Message(RecordDict({DP_UPLOAD: layer.upload_instructions(records),
                               "config": ConfigRecord({})}), dst_node_id=1,
                   message_type="query.flt_embed")


def test_uploads_are_clipped_and_noised_on_the_client_with_the_servers_seed():
    from client_app.layers import layered

    handler = layered(_upload_reply)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    quiet = _layer(seed=0)
    quiet.upload_noise_multiplier = 1e-9
    got = handler(_request(quiet, ["centroids"]), context).content["centroids"]["mu"].numpy()
    np.testing.assert_allclose(got, np.full(5000, 0.5 / math.sqrt(5000)), atol=1e-6)  # clipped
    first = handler(_request(_layer(seed=0), ["centroids"]), context)
    second = handler(_request(_layer(seed=0), ["centroids"]), context)
    third = handler(_request(_layer(seed=5), ["centroids"]), context)
    mu = first.content["centroids"]["mu"].numpy()
    assert np.std(mu) == pytest.approx(2.0 * 0.5, rel=0.05)  # σ_u·C_u
    np.testing.assert_array_equal(mu, second.content["centroids"]["mu"].numpy())
    assert not np.allclose(mu, third.content["centroids"]["mu"].numpy())
    assert first.content["metrics"]["num-examples"] == 7  # records not named are left as they are
    unlisted = handler(_request(_layer(seed=0), ["descriptor"]), context)
    np.testing.assert_array_equal(unlisted.content["centroids"]["mu"].numpy(), np.full(5000, 0.1,
                                                                                       np.float32))


# --- short federations --------------------------------------------------------------------------
BASE = {"dataset": "digits", "model": "mclr", "partition": "label-clusters", "num-clusters": 2,
        "labels-per-cluster": 5, "num-clients": 4, "num-rounds": 2, "local-epochs": 1,
        "batch-size": 32, "lr": 0.05, "max-samples-per-client": 60, "finetune-epochs": 0,
        "checkpoint-every": 0, "seed": 3, "safeguard": "off", "dp": "client", "dp-delta": 1e-3,
        "dp-clip-norm": 0.5, "dp-upload-clip-norm": 2.0}
CASES = {
    "sfl": {},
    "sfl-star": {"sfl.gl-k": 1, "sfl.gl-steps": 3},
    "flt": {"flt.ae-epochs": 1, "flt.ae-rounds": 1, "flt.latent-dim": 8, "flt.umap-neighbors": 3,
            "flt.no-structure": "keep"},
    "fedska": {"fedska.k": 1, "fedska.structure-steps": 2, "fedska.encoder-steps": 2},
}


@pytest.mark.parametrize("method", sorted(CASES))
def test_a_graph_method_under_client_dp_reports_epsilon_every_round(method, tmp_path):
    summary = simulate({**BASE, **CASES[method], "method": method, "output-dir": str(tmp_path),
                        "run-name": "dp"})
    rows = [json.loads(line) for line in (tmp_path / "dp" / "rounds.jsonl").read_text().splitlines()]
    spent = [r["privacy"]["epsilon"] for r in rows if r["round"] > 0]
    assert len(spent) == 2 and 0 < spent[0] < spent[1]
    assert all(r["privacy"]["delta"] == 1e-3 for r in rows if r["round"] > 0)
    written = json.loads((tmp_path / "dp" / "summary.json").read_text())["privacy"]
    assert written["mode"] == "client" and written["epsilon"] == pytest.approx(spent[-1])
    assert summary["privacy"]["aggregates"] > 0
    if method in ("flt", "fedska"):  # centroids; descriptors, slot features, gradients
        assert summary["privacy"]["uploads"] > 0
        assert 0 < summary["privacy"]["epsilon-uploads"] < summary["privacy"]["epsilon"]
    import csv

    with open(tmp_path / "dp" / "clients.csv") as handle:
        final = [float(row["epsilon"]) for row in csv.DictReader(handle)]
    assert max(final) == pytest.approx(spent[-1])


def test_a_target_epsilon_stops_a_graph_methods_training_before_it_is_passed(tmp_path):
    # ε after rounds 1, 2, 3 without a target: 3.77, 5.79, 7.49; a round costs about what the last did
    summary = simulate({**BASE, "method": "sfl", "num-rounds": 3, "dp-target-epsilon": 6.5,
                        "output-dir": str(tmp_path), "run-name": "t"})
    rows = [json.loads(line) for line in (tmp_path / "t" / "rounds.jsonl").read_text().splitlines()]
    spent = [r["privacy"]["epsilon"] for r in rows if r["round"] > 0]
    assert spent[-1] == spent[-2] and all(e <= 6.5 for e in spent)  # round 3 trained nobody
    assert rows[-1]["clients-trained"] == 0
    assert summary["privacy"]["stopped-round"] == 3 and summary["privacy"]["epsilon"] <= 6.5


def test_a_per_client_strategy_that_does_not_opt_in_is_refused_and_off_changes_nothing():
    from strategies.shared.personalized import PersonalizedStrategy
    from strategies.shared.private_aggregation import wrap
    from strategies.shared.settings import ConfigError

    cfg = RunConfig.from_flower({**default_run_config(), "method": "fedavg", "dp": "client",
                                 "num-clients": 4, "dp-delta": 1e-3})
    with pytest.raises(ConfigError, match="does not opt into per-client aggregate noise"):
        wrap(cfg, PersonalizedStrategy(4, 1.0))
    off = RunConfig.from_flower({**default_run_config(), "method": "sfl", "num-clients": 4})
    strategy = _sfl(None, torch.zeros(4, 3), {})
    assert wrap(off, strategy) is strategy and type(strategy).__name__ == "SFL"


def test_with_dp_off_the_layer_is_neither_imported_nor_run():
    """With dp off the per-client aggregate layer is absent: a run of SFL, and the server, client
    and method modules of SFL, FLT and FedSKA, load neither it nor the client's upload layer."""
    import subprocess
    import sys
    from pathlib import Path

    run = {**BASE, "method": "sfl", "dp": "off", "num-rounds": 1}
    code = ("import json, sys, tempfile\n"
            "import server_app.app, client_app.app\n"
            "import strategies.methods.sfl.server, strategies.methods.flt.server\n"
            "import strategies.methods.fedska.server\n"
            "from server_app.harness.simulate import simulate\n"
            f"simulate({{**{run!r}, 'output-dir': tempfile.mkdtemp(), 'run-name': 'off'}})\n"
            "print(json.dumps(sorted(m for m in sys.modules if m in ("
            "'strategies.shared.private_aggregation', 'client_app.private_upload'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
