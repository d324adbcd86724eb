"""TensorBoard event files beside a run's results: read back with TensorBoard's own reader, every
scalar equals the rounds.jsonl field it was written from, the accuracies come first (under
`accuracy/`), the client graph is an image with a colour bar written when it changes, and the hparams
hold the settings that apply to the run only, with its final metrics."""

import json
import math

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from server_app.callbacks import graph_image, scalar_tags
from server_app.harness.simulate import simulate


def read_events(directory):
    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def hparams_of(acc):
    """The session-start hparams (name → value) TensorBoard's HParams plugin reads."""
    content = acc.PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    out = {}
    for name, value in data.session_start_info.hparams.items():
        kind = value.WhichOneof("kind")
        out[name] = getattr(value, kind)
    return out


def rounds_of(directory):
    return [json.loads(line) for line in (directory / "rounds.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    """An SFL run and a FedAvg run on one split, in one output folder (as benchmarks.compare does)."""
    out = tmp_path_factory.mktemp("tb")
    base = {"dataset": "digits", "model": "mclr", "partition": "label-clusters", "num-clusters": 2,
            "num-clients": 4, "num-rounds": 2, "max-samples-per-client": 120, "finetune-epochs": 0,
            "output-dir": str(out)}
    for method in ("sfl", "fedavg"):
        simulate({**base, "method": method, "run-name": method})
    return out


@pytest.mark.parametrize("method", ["sfl", "fedavg"])
def test_every_scalar_equals_its_rounds_jsonl_field(comparison, method):
    directory = comparison / method
    acc = read_events(directory)
    rounds = rounds_of(directory)
    expected = {}
    for record in rounds:
        for tag, value in scalar_tags(record).items():
            expected.setdefault(tag, []).append((record["round"], value))
    assert {"accuracy/personalized/mean", "seconds", "bytes-down"} <= set(expected)
    written = set(acc.Tags()["scalars"])
    assert set(expected) <= written
    for tag, values in expected.items():
        events = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in events] == [s for s, _ in values], tag
        for (_, got), (_, want) in zip(events, values):
            assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6), (tag, got, want)


@pytest.mark.parametrize("method", ["sfl", "fedavg"])
def test_hparams_hold_the_methods_settings_and_final_metrics(comparison, method):
    directory = comparison / method
    acc = read_events(directory)
    hparams = hparams_of(acc)
    config = json.loads((directory / "config.json").read_text())
    assert hparams["method"] == method and hparams["num-clients"] == 4
    own = {k for k in hparams if "." in k}
    if method == "sfl":
        assert own == {k for k in config if k.startswith("sfl.")}
        assert "safeguard" in hparams and "aggregation" not in hparams  # a graph method
    else:
        assert own == set()  # FedAvg has no section: no other method's settings
        assert "aggregation" in hparams and "safeguard" not in hparams
    assert "num-clusters" in hparams and not any(k.startswith("domain") for k in hparams)
    summary = json.loads((directory / "summary.json").read_text())
    final = acc.Scalars("final/personalized/mean")
    assert len(final) == 1 and final[0].step == summary["final"]["round"]
    assert math.isclose(final[0].value, summary["final"]["personalized"]["mean"], rel_tol=1e-6)


def test_the_client_graph_is_an_image_when_the_method_has_one(comparison):
    sfl, fedavg = read_events(comparison / "sfl"), read_events(comparison / "fedavg")
    assert "client-graph" not in fedavg.Tags()["images"]
    images = sfl.Images("client-graph")
    assert [i.step for i in images] == [0]  # the given label-sharing graph never changes
    assert (images[0].width, images[0].height) == (400, 340)  # the heatmap with its colour bar
    assert np.load(comparison / "sfl" / "graph.npy").shape == (4, 4)


def test_the_accuracies_are_the_first_section(comparison):
    """TensorBoard orders its sections by the tag's first part, alphabetically: `accuracy` first."""
    tags = read_events(comparison / "sfl").Tags()["scalars"]
    sections = sorted({tag.split("/")[0] for tag in tags})
    assert sections[0] == "accuracy"
    assert {"accuracy/personalized/mean", "accuracy/personalized/worst-5%"} <= set(tags)
    assert not any(tag.startswith(("personalized/", "finetuned/")) for tag in tags)


def heat_colour(image: np.ndarray) -> tuple[int, ...]:
    """The colour inside the heatmap's area (left of the colour bar, below the title)."""
    height, width, _ = image.shape
    return tuple(int(c) for c in image[int(height * 0.5), int(width * 0.4)])


def test_graph_image_draws_the_matrix_with_a_colour_bar():
    image = graph_image(np.array([[0.0, 1.0], [1.0, 0.0]]))
    assert image.shape == (340, 400, 3) and image.dtype == np.uint8
    assert len({tuple(p) for p in image.reshape(-1, 3)}) > 50  # heatmap, colour bar, labels
    # a constant matrix is drawn by its value: ones in the top colour, zeros in the bottom one
    ones, zeros = graph_image(np.ones((3, 3))), graph_image(np.zeros((3, 3)))
    viridis_top, viridis_bottom = (253, 231, 37), (68, 1, 84)
    assert np.abs(np.subtract(heat_colour(ones), viridis_top)).max() <= 3
    assert np.abs(np.subtract(heat_colour(zeros), viridis_bottom)).max() <= 3
    assert not (ones == zeros).all()
