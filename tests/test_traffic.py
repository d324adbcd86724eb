"""Traffic forecasting: the synthetic road network, METR-LA layout reader, windows and z-score, the
GRU/RNN forecasters, masked regression metrics, and whole regression federations through compare."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.sparse.csgraph import shortest_path
from torch import nn

from client_app.training import (
    evaluate, forecast_errors, masked_mae, seeded_generator, task_loss, task_of, train_epochs,
)
from datasets.federated import DataSpec, load_client_data, load_partition
from datasets.partition import PartitionSpec
from datasets.sources import SOURCE_INFO, DataNotFoundError, dataset_task, load_source
from datasets.traffic import (
    HORIZON, INPUT_STEPS, STEPS_PER_DAY, TrafficSource, load_traffic, read_pandas_h5, road_graph,
    sensor_split, split_bounds, synthetic_traffic, windows,
)
from models import build_model
from strategies.shared.settings import ConfigError
from strategies.shared.run_config import RunConfig
from server_app.metrics import regression_summary
from server_app.summary_table import console_table
from strategies.shared.messages import EvaluateReply

SPAN = INPUT_STEPS + HORIZON - 1  # time steps a part loses to windowing


# --- synthetic generator --------------------------------------------------------------------------


def test_generator_is_deterministic_by_seed():
    a, b = synthetic_traffic(10, 2 * STEPS_PER_DAY, seed=3), synthetic_traffic(10, 2 * STEPS_PER_DAY, seed=3)
    np.testing.assert_array_equal(a.speeds, b.speeds)
    np.testing.assert_array_equal(a.adjacency, b.adjacency)
    c = synthetic_traffic(10, 2 * STEPS_PER_DAY, seed=4)
    assert not np.allclose(a.speeds, c.speeds)
    assert a.speeds.shape == (2 * STEPS_PER_DAY, 10) and a.speeds.dtype == np.float32
    assert (a.speeds > 0).all()  # 0 would mean "missing"
    np.testing.assert_allclose(a.time_of_day[:3] * STEPS_PER_DAY, [0, 1, 2], atol=1e-4)


def test_adjacency_is_a_thresholded_gaussian_kernel_with_self_loops():
    source = synthetic_traffic(40, STEPS_PER_DAY)
    adj = source.adjacency
    np.testing.assert_array_equal(adj, adj.T)
    np.testing.assert_array_equal(np.diag(adj), np.ones(40))
    off = adj[~np.eye(40, dtype=bool)]
    assert ((off == 0) | ((off >= 0.1) & (off <= 1.0))).all()
    degree = (adj > 0).sum(axis=1) - 1
    assert 3.0 <= degree.mean() <= 9.0  # a sparse road-like graph


def test_neighbouring_sensors_are_more_correlated_than_far_ones():
    source = synthetic_traffic(30, 7 * STEPS_PER_DAY)
    corr = np.corrcoef(source.speeds.T)
    hops = shortest_path((source.adjacency > 0).astype(float), unweighted=True)
    adjacent, far = hops == 1, (hops >= 3) & np.isfinite(hops)
    assert adjacent.sum() >= 30 and far.sum() >= 30
    assert corr[adjacent].mean() > corr[far].mean() + 0.15


def test_road_graph_is_the_sources_adjacency():
    graph = road_graph("traffic-synthetic", None, 12)
    assert graph.shape == (12, 12) and graph.dtype == np.float32
    np.testing.assert_array_equal(graph, load_traffic("traffic-synthetic", None, 12).adjacency)
    with pytest.raises(ValueError, match="unknown traffic data set 'mnist'"):
        road_graph("mnist", None, 3)


# --- windows, split, z-score ----------------------------------------------------------------------


def test_windows_are_consecutive_readings():
    x, y = windows(np.arange(30.0))
    assert x.shape == (30 - SPAN, 12) and y.shape == (30 - SPAN, 12)
    np.testing.assert_array_equal(x[2], np.arange(2, 14))
    np.testing.assert_array_equal(y[2], np.arange(14, 26))
    with pytest.raises(ValueError, match="too short"):
        windows(np.arange(23.0))


def test_split_sizes_are_exact_and_chronological():
    days = 3
    spec = DataSpec("traffic-synthetic", None, PartitionSpec("sensors", 6), traffic_days=days)
    steps = days * STEPS_PER_DAY  # 864
    train_end, val_end = split_bounds(steps)
    assert (train_end, val_end) == (605, 691)  # round(0.7·864), round(0.8·864)
    data = load_client_data(spec, 2)
    assert data.train_x.shape == (train_end - SPAN, 12, 2) and data.train_y.shape == (train_end - SPAN, 12)
    assert data.test_x.shape == (steps - val_end - SPAN, 12, 2) and data.test_y.shape == (steps - val_end - SPAN, 12)
    assert data.task == "regression" and data.input_shape == (12, 2) and data.num_classes == 12
    split = sensor_split(load_traffic("traffic-synthetic", None, 6, days), 2)
    assert split.train_steps == (0, train_end) and split.test_steps == (val_end, steps)
    assert split.train_steps[1] < split.test_steps[0]  # the validation part separates them
    # window j of each part: inputs are steps start+j .. start+j+11, targets the next 12 steps
    series = load_traffic("traffic-synthetic", None, 6, days).speeds[:, 2].astype(np.float64)
    scaled = (series - split.mean) / split.std
    np.testing.assert_allclose(data.train_x[5, :, 0].numpy(), scaled[5:17], atol=1e-5)
    np.testing.assert_allclose(data.train_y[5].numpy(), scaled[17:29], atol=1e-5)
    np.testing.assert_allclose(data.test_y[-1].numpy(), scaled[-12:], atol=1e-5)
    np.testing.assert_allclose(data.test_x[0, :, 0].numpy(), scaled[val_end:val_end + 12], atol=1e-5)
    np.testing.assert_allclose(data.test_x[0, :, 1].numpy() * STEPS_PER_DAY % STEPS_PER_DAY,
                               np.arange(val_end, val_end + 12) % STEPS_PER_DAY, atol=1e-3)
    # the partition's indices are the first target step of every window
    _, partition = load_partition(spec)
    assert partition.num_clients == 6 and partition.cluster_ids is None
    assert partition.train_indices[0][[0, -1]].tolist() == [12, train_end - 12]
    assert partition.test_indices[0][[0, -1]].tolist() == [val_end + 12, steps - 12]


def _source(series: np.ndarray) -> TrafficSource:
    steps = len(series)
    return TrafficSource("traffic-synthetic", series[:, None].astype(np.float32),
                         (np.arange(steps) % STEPS_PER_DAY / STEPS_PER_DAY).astype(np.float32),
                         ("s0",), np.ones((1, 1), dtype=np.float32))


def test_zscore_uses_training_readings_only_and_masks_missing_ones():
    rng = np.random.default_rng(0)
    steps = 1000
    train_end, val_end = split_bounds(steps)
    series = np.concatenate([rng.normal(50.0, 5.0, train_end), rng.normal(100.0, 5.0, steps - train_end)])
    series[[10, 20, 30]] = 0.0  # missing training readings: excluded from the statistics
    series[val_end + 40] = 0.0  # a missing test reading
    split = sensor_split(_source(series), 0)
    observed = np.delete(series[:train_end], [10, 20, 30])
    assert split.mean == pytest.approx(observed.mean()) and split.std == pytest.approx(observed.std())
    assert abs(split.mean - 50.0) < 1.0  # the test part (mean 100) did not leak in
    assert abs(np.nanmean(split.test_y) - (100.0 - split.mean) / split.std) < 0.3
    # a missing target is NaN, a missing input is 0 (the training mean after scaling)
    assert np.isnan(split.train_y[8, 0]) and np.isnan(split.train_y[8, 10])  # window 8 targets steps 20..31
    assert np.isnan(split.train_y[8]).sum() == 2
    assert split.train_x[0, 10, 0] == 0.0  # window 0 inputs steps 0..11
    assert np.isnan(split.test_y).sum() == 12  # step val_end+40 is a target of 12 test windows
    assert not np.isnan(split.train_x).any() and not np.isnan(split.test_x).any()


# --- model ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "recurrent"), [("gru", 3 * (2 * 64 + 64 * 64 + 2 * 64)),
                                                 ("rnn", 2 * 64 + 64 * 64 + 2 * 64)])
def test_forecasters_split_into_features_and_horizon_head(name, recurrent):
    torch.manual_seed(0)
    model = build_model(name, (12, 2), 12)
    out = model(torch.randn(5, 12, 2))
    assert out.shape == (5, 12) and model.features(torch.randn(5, 12, 2)).shape == (5, 64)
    assert model.feature_dim == 64
    assert all(k.startswith(("features.", "head.")) for k in model.state_dict())
    assert sum(p.numel() for p in model.features.parameters()) == recurrent
    assert sum(p.numel() for p in model.head.parameters()) == 64 * 12 + 12
    with pytest.raises(ValueError, match=r"'gru'.*\(steps, features\)"):
        build_model("gru", (1, 28, 28), 12)


def test_forecaster_loads_received_weights_on_the_meta_device():
    torch.manual_seed(1)
    trained = build_model("gru", (12, 2), 12)
    state = {k: v.clone() for k, v in trained.state_dict().items()}
    with torch.device("meta"):
        fresh = build_model("gru", (12, 2), 12)
    fresh.load_state_dict(state, assign=True)
    x = torch.randn(3, 12, 2)
    torch.testing.assert_close(fresh.to("cpu")(x), trained(x))


# --- loss and metrics -----------------------------------------------------------------------------


def test_task_follows_target_dtype_and_masked_mae_skips_nan():
    assert task_of(torch.tensor([1, 2])) == "classification" and task_of(torch.tensor([1.0])) == "regression"
    prediction = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    target = torch.tensor([[2.0, float("nan")], [3.0, 1.0]])
    assert masked_mae(prediction, target).item() == pytest.approx((1 + 0 + 4) / 3)
    assert task_loss(prediction, target).item() == pytest.approx(5 / 3)
    assert masked_mae(prediction, torch.full((2, 2), float("nan"))).item() == 0.0
    per_sample = masked_mae(prediction, target, reduction="sample")  # the safeguard's per-sample error
    assert per_sample.tolist() == pytest.approx([1.0, 2.0])  # sample 1: |1−2|; sample 2: (0 + 4) / 2
    with pytest.raises(ValueError, match="unknown task 'ranking'"):
        task_loss(prediction, target, "ranking")


def test_forecast_errors_on_a_hand_made_example():
    prediction = torch.tensor([[10.0, 22.0, 30.0], [44.0, 50.0, 9.0]])
    target = torch.tensor([[12.0, 20.0, 0.0], [40.0, float("nan"), 10.0]])  # 0 and NaN = missing
    errors = forecast_errors(prediction, target)
    absolute = np.array([2.0, 2.0, 4.0, 1.0])  # valid entries: 10|12, 22|20, 44|40, 9|10
    truth = np.array([12.0, 20.0, 40.0, 10.0])
    assert errors.mae == pytest.approx(absolute.mean())
    assert errors.mape == pytest.approx((absolute / truth).mean())
    assert errors.rmse == pytest.approx(np.sqrt((absolute ** 2).mean()))
    # the last horizon step: only 9|10 is valid
    assert (errors.mae_h12, errors.mape_h12, errors.rmse_h12) == pytest.approx((1.0, 0.1, 1.0))
    nothing = forecast_errors(prediction[:, :1], torch.zeros(2, 1))
    assert np.isnan(nothing.mae) and np.isnan(nothing.rmse)


class _Constant(nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full((len(x), 2), self.value)


def test_evaluate_denormalises_with_the_client_scale():
    y = torch.tensor([[1.0, -1.0], [float("nan"), 0.5]])  # z-scored; NaN = missing
    result = evaluate(_Constant(0.0), torch.zeros(2, 3, 2), y, batch_size=1, scale=(60.0, 10.0))
    assert result.loss == pytest.approx((1 + 1 + 0.5) / 3)  # masked MAE in z units
    assert result.correct == 0 and result.num_examples == 2
    truth = np.array([70.0, 50.0, 65.0])
    assert result.errors.mae == pytest.approx(np.abs(truth - 60.0).mean())
    assert result.errors.mape == pytest.approx((np.abs(truth - 60.0) / truth).mean())
    assert result.errors.mae_h12 == pytest.approx(np.mean([10.0, 5.0]))
    assert evaluate(_Constant(0.0), torch.zeros(2, 3, 2), y, batch_size=1).errors is None


def test_regression_training_lowers_the_masked_mae():
    data = load_client_data(DataSpec("traffic-synthetic", None, PartitionSpec("sensors", 4), traffic_days=3), 1)
    torch.manual_seed(0)
    model = build_model("gru", data.input_shape, data.num_classes)
    before = evaluate(model, data.test_x, data.test_y, 64, data.target_scale)
    train_epochs(model, data.train_x, data.train_y, epochs=3, batch_size=32, lr=0.05, momentum=0.9,
                 generator=seeded_generator(0, 1, 1))
    after = evaluate(model, data.test_x, data.test_y, 64, data.target_scale)
    assert after.loss < 0.6 * before.loss and after.errors.mae < 0.6 * before.errors.mae


def test_regression_summary_averages_over_clients():
    mae = np.arange(1.0, 23.0)
    mape = np.full(22, 0.1)
    rmse = mae + 1
    mae[3] = np.nan  # a client without valid targets is left out: 21 remain → ⌈5%·21⌉ = 2 per tail
    summary = regression_summary(mae, mape, rmse, (mae * 2, mape, rmse))
    assert summary["mae"] == pytest.approx(np.nanmean(mae))
    assert summary["mape"] == pytest.approx(10.0) and summary["rmse"] == pytest.approx(rmse.mean())
    assert summary["worst-5%-mae"] == pytest.approx(21.5) and summary["best-5%-mae"] == pytest.approx(1.5)
    assert summary["mae-h12"] == pytest.approx(2 * np.nanmean(mae))


def test_evaluate_reply_carries_accuracy_or_errors():
    assert EvaluateReply(num_examples=3, correct=0, loss=0.2, mae=1.5, mape=0.1, rmse=2.0).mae == 1.5
    assert EvaluateReply(num_examples=3, correct=1, loss=0.2, accuracy=1 / 3).accuracy == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="exactly one of 'accuracy'"):
        EvaluateReply(num_examples=3, correct=0, loss=0.2)


# --- configuration --------------------------------------------------------------------------------


def test_task_mapping_and_config_cross_checks():
    assert dataset_task("metr-la") == "regression" and dataset_task("mnist") == "classification"
    assert SOURCE_INFO["pems-bay"] == ((INPUT_STEPS, 2), HORIZON)
    cfg = RunConfig.from_flower({"dataset": "traffic-synthetic", "partition": "sensors", "model": "gru",
                                 "traffic-days": 3})
    assert cfg.data_spec.traffic_days == 3 and cfg.data_spec.partition.scheme == "sensors"
    with pytest.raises(ConfigError, match="partition='sensors'"):
        RunConfig.from_flower({"dataset": "metr-la", "model": "gru"})
    with pytest.raises(ConfigError, match="model 'cnn' does not fit dataset 'metr-la'.*gru, rnn"):
        RunConfig.from_flower({"dataset": "metr-la", "partition": "sensors", "model": "cnn"})
    with pytest.raises(ConfigError, match="partition 'sensors' is for the traffic data sets"):
        RunConfig.from_flower({"dataset": "mnist", "partition": "sensors"})
    with pytest.raises(ValueError, match="traffic data set"):
        load_source("metr-la")


# --- METR-LA / PEMS-BAY layout --------------------------------------------------------------------


def _write_pandas_frame(path: Path, values: np.ndarray, columns: list[str], start: str) -> None:
    """A DataFrame as pandas' fixed format writes it (df.to_hdf(path, key='df')), via h5py."""
    import h5py

    index = (np.datetime64(start, "ns") + np.arange(len(values)) * np.timedelta64(5, "m")).astype(np.int64)
    names = np.array([c.encode() for c in columns])
    with h5py.File(path, "w") as handle:
        group = handle.create_group("df")
        group.attrs.update({"pandas_type": b"frame", "ndim": 2, "nblocks": 1,
                            "axis0_variety": b"regular", "axis1_variety": b"regular"})
        group.create_dataset("axis0", data=names).attrs["kind"] = b"string"
        group.create_dataset("axis1", data=index).attrs["kind"] = b"datetime64"
        group.create_dataset("block0_items", data=names).attrs["kind"] = b"string"
        group.create_dataset("block0_values", data=values).attrs["transposed"] = True


def _fake_metr_la(root: Path, steps: int = 600) -> tuple[np.ndarray, list[str]]:
    """metr-la.h5 with columns in a different order than adj_mx.pkl's sensor ids, some zeros."""
    pytest.importorskip("h5py")
    ids = ["773869", "767541", "767542", "717447"]
    rng = np.random.default_rng(0)
    speeds = rng.uniform(20.0, 70.0, size=(steps, len(ids)))
    speeds[100:110, 1] = 0.0  # missing readings of sensor 767541
    order = [2, 0, 3, 1]  # file columns: 767542, 773869, 717447, 767541
    _write_pandas_frame(root / "metr-la.h5", speeds[:, order], [ids[j] for j in order], "2012-03-01T00:05")
    adj = np.eye(4, dtype=np.float32)
    adj[0, 1] = adj[1, 0] = 0.5
    (root / "sensor_graph").mkdir()
    with open(root / "sensor_graph" / "adj_mx.pkl", "wb") as handle:
        pickle.dump((ids, {s: i for i, s in enumerate(ids)}, adj), handle, protocol=2)
    return speeds, ids


def test_metr_la_reader_in_the_standard_layout(tmp_path):
    speeds, ids = _fake_metr_la(tmp_path)
    values, columns, stamps = read_pandas_h5(tmp_path / "metr-la.h5")
    assert columns == ["767542", "773869", "717447", "767541"] and values.shape == (600, 4)
    source = load_traffic("metr-la", str(tmp_path), 3)
    assert source.sensor_ids == tuple(ids[:3])  # adjacency order, first K sensors
    np.testing.assert_allclose(source.speeds, speeds[:, :3], rtol=1e-6)
    assert source.time_of_day[0] == pytest.approx(5 / 1440)  # 00:05
    graph = road_graph("metr-la", str(tmp_path), 3)
    np.testing.assert_array_equal(graph, [[1, 0.5, 0], [0.5, 1, 0], [0, 0, 1]])
    spec = DataSpec("metr-la", str(tmp_path), PartitionSpec("sensors", 3))
    data = load_client_data(spec, 1)
    assert data.train_x.shape == (420 - SPAN, 12, 2) and data.test_x.shape == (600 - 480 - SPAN, 12, 2)
    # missing steps 100..109: targets (j+12..j+23) of windows 77..97, last inputs (j+11) of 89..98 → 0
    assert torch.isnan(data.train_y).any(dim=1).nonzero().flatten().tolist() == list(range(77, 98))
    assert (data.train_x[89:99, -1, 0] == 0).all() and not torch.isnan(data.train_x).any()
    assert data.target_mean == pytest.approx(np.delete(speeds[:420, 1], np.s_[100:110]).mean(), rel=1e-5)
    with pytest.raises(ValueError, match="num_clients=5: metr-la has 4 sensors"):
        load_traffic("metr-la", str(tmp_path), 5)
    assert load_traffic("metr-la", str(tmp_path), 4, days=1).num_steps == STEPS_PER_DAY


def test_missing_traffic_files_name_what_to_get(tmp_path):
    with pytest.raises(DataNotFoundError, match="needs data-root holding pems-bay.h5 and adj_mx_bay.pkl"):
        load_traffic("pems-bay", None, 3)
    with pytest.raises(DataNotFoundError) as err:
        load_traffic("metr-la", str(tmp_path), 3)
    message = str(err.value)
    assert "metr-la.h5" in message and "adj_mx.pkl" in message and str(tmp_path) in message
    assert "DCRNN" in message
    with pytest.raises(DataNotFoundError, match="adj_mx.pkl"):
        road_graph("metr-la", str(tmp_path), 3)


# --- whole federations ----------------------------------------------------------------------------


def test_fedavg_and_local_learn_to_forecast_and_compare_reports_errors(tmp_path):
    from benchmarks.compare import REGRESSION_COLUMNS, compare

    overrides = {
        "dataset": "traffic-synthetic", "partition": "sensors", "model": "gru", "num-clients": 8,
        "num-rounds": 2, "traffic-days": 3, "lr": 0.05, "momentum": 0.9, "finetune-epochs": 1,
    }
    fedavg, local = compare(["fedavg", "local"], overrides, "traffic-tiny", nodes=2,
                            results_dir=tmp_path, runs_dir=tmp_path / "runs")
    for summary in (fedavg, local):
        assert summary["task"] == "regression"
        assert summary["final"]["regression"]["mae"] < 0.7 * summary["round-0"]["regression"]["mae"]
        assert 0 < summary["final"]["regression"]["mape"] < 100
    assert "global-regression" in fedavg["final"] and "finetuned-regression" in fedavg["final"]
    assert "global-regression" not in local["final"]
    assert fedavg["final"]["regression"]["mae"] == fedavg["final"]["global-regression"]["mae"]
    table = (tmp_path / "traffic-tiny.md").read_text()
    assert "| " + " | ".join(REGRESSION_COLUMNS) + " |" in table and "| fedavg |" in table
    assert "traffic-days 3" in table
    run = tmp_path / "runs" / "fedavg"
    rounds = [json.loads(line) for line in (run / "rounds.jsonl").open()]
    assert [r["round"] for r in rounds] == [0, 1, 2] and all("regression" in r for r in rounds)
    header = (run / "clients.csv").read_text().splitlines()[0].split(",")
    assert {"mae", "mape", "rmse", "mae-h12", "global-mae", "finetuned-mae"} <= set(header)
    assert (run / "accuracy.png").stat().st_size > 1000
    text = console_table(json.loads((run / "summary.json").read_text()))
    assert "MAE / MAPE (%) / RMSE" in text and "global + local epochs" in text
