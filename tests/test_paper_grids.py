"""The papers' experiment grids: their models (MobileNet-v2, LEAF's CelebA CNN, the character LSTM),
data sets (LEAF Shakespeare and CelebA, EMNIST's structured non-IID partition), FLT's encoder from a
checkpoint, and one config per paper table run by benchmarks.compare on small generated data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from datasets.sources import SHAKESPEARE_LETTERS, DataNotFoundError, load_source
from models import build_model

# --- generated LEAF data ------------------------------------------------------------------------


def write_shakespeare(root: Path, users: int = 3, train: int = 9, test: int = 3, seed: int = 0) -> None:
    """LEAF Shakespeare JSON (users = speaking roles; x = 80-character windows, y = the next character)
    under <root>/shakespeare/data/{train,test}/. Each role speaks a repeated phrase of its own."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("test", test)):
        user_data = {}
        for user in range(users):
            text = f"role {user} says: " + "abcdefgh"[user % 8] * 3 + "! " * (user + 1)
            text = text * (200 // len(text) + 2)
            starts = rng.integers(0, len(text) - 81, count)
            user_data[f"PLAY_ROLE{user}"] = {"x": [text[s:s + 80] for s in starts],
                                             "y": [text[s + 80] for s in starts]}
        folder = root / "shakespeare" / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"all_data_niid_0_keep_0_{split}_9.json").write_text(json.dumps(
            {"users": list(user_data), "num_samples": [count] * users, "user_data": user_data}))


def write_celeba(root: Path, users: int = 3, train: int = 5, test: int = 2, seed: int = 0,
                 suffix: str = ".jpg") -> None:
    """LEAF CelebA JSON (users = celebrities; x = image file names, y = smiling) and small images of
    another size than 84×84 in <root>/celeba/data/raw/img_align_celeba/ (smiling ones are brighter)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = root / "celeba" / "data" / "raw" / "img_align_celeba"
    images.mkdir(parents=True, exist_ok=True)
    number = 0
    for split, count in (("train", train), ("test", test)):
        user_data = {}
        for user in range(users):
            names, labels = [], []
            for _ in range(count):
                number += 1
                label = int(rng.integers(0, 2))
                pixels = (rng.integers(0, 60, (40, 30, 3)) + 150 * label).astype(np.uint8)
                name = f"{number:06d}{suffix}"
                Image.fromarray(pixels).save(images / name)
                names.append(name)
                labels.append(label)
            user_data[f"celebrity_{user}"] = {"x": names, "y": labels}
        folder = root / "celeba" / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"all_data_{split}.json").write_text(json.dumps(
            {"users": list(user_data), "num_samples": [count] * users, "user_data": user_data}))


# --- models ---------------------------------------------------------------------------------------


def test_mobilenet_v2_is_torchvisions_adapted_to_32x32() -> None:
    torch.manual_seed(0)
    model = build_model("mobilenet-v2", (3, 32, 32), 10).eval()
    body = model.features[0]
    assert body[0][0].stride == (1, 1)  # stride-1 first conv
    with torch.no_grad():
        x = torch.rand(2, 3, 32, 32)
        assert body(x).shape == (2, 1280, 4, 4)  # 8× downsampling, not 32×
        assert model.features(x).shape == (2, 1280) and model.feature_dim == 1280
        assert model(x).shape == (2, 10)
    assert isinstance(model.head[-1], nn.Linear) and model.head[-1].in_features == 1280
    gray = build_model("mobilenet-v2", (1, 28, 28), 47)
    assert gray(torch.rand(1, 1, 28, 28)).shape == (1, 47)


def test_celeba_cnn_is_leafs() -> None:
    model = build_model("celeba-cnn", (3, 84, 84), 2)
    convs = [m for m in model.features if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == \
        [(3, 32, (3, 3))] + [(32, 32, (3, 3))] * 3
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.features) == 4
    assert model.features(torch.rand(2, 3, 84, 84)).shape == (2, 1568)
    assert (model.head.in_features, model.head.out_features) == (1568, 2)
    with pytest.raises(ValueError, match="celeba-cnn.*84x84"):
        build_model("celeba-cnn", (3, 32, 32), 2)


def test_char_lstm_predicts_the_next_character() -> None:
    model = build_model("char-lstm", (80,), 80)
    encoder = model.features
    assert (encoder.embedding.num_embeddings, encoder.embedding.embedding_dim) == (80, 8)
    assert (encoder.lstm.num_layers, encoder.lstm.hidden_size) == (1, 256)
    assert (model.head.in_features, model.head.out_features) == (256, 80)
    x = torch.randint(0, 80, (5, 80))
    assert model(x).shape == (5, 80)
    with pytest.raises(TypeError, match="int64 character indices"):
        model(x.float())
    with pytest.raises(ValueError, match=r"char-lstm.*\(steps,\)"):
        build_model("char-lstm", (3, 32, 32), 80)


@pytest.mark.parametrize("name,shape,classes", [("mobilenet-v2", (3, 32, 32), 10),
                                                ("celeba-cnn", (3, 84, 84), 2),
                                                ("char-lstm", (80,), 80)])
def test_new_models_split_for_partial_methods(name: str, shape: tuple[int, ...], classes: int) -> None:
    """FedPer shares features.*, LG-FedAvg head.*, FedSKA pulls features: both parts are non-empty."""
    from flwr.app import ArrayRecord

    from strategies.shared.params import ParameterLayout
    from strategies.shared.partial import shared_columns

    layout = ParameterLayout.of(ArrayRecord(build_model(name, shape, classes).state_dict()))
    features, head = shared_columns(layout, "features"), shared_columns(layout, "head")
    assert features.any() and head.any() and not (features & head).any()
    assert bool((features | head).all())


def test_generic_loop_trains_char_lstm_and_counts_characters() -> None:
    """The generic loop takes int64 windows [n, 80] and int64 targets [n]; accuracy is the share of
    correctly predicted next characters."""
    from client_app.training import evaluate, seeded_generator, train_epochs

    torch.manual_seed(0)
    model = build_model("char-lstm", (80,), 80)
    x = torch.randint(0, 80, (24, 80))
    y = x[:, -1].clone()  # learnable: the next character repeats the last one
    before = evaluate(model, x, y, batch_size=8)
    train_epochs(model, x, y, epochs=30, batch_size=8, lr=0.5, momentum=0.9,
                 generator=seeded_generator(0, 0, 1))
    after = evaluate(model, x, y, batch_size=8)
    assert after.num_examples == 24 and after.loss < before.loss
    manual = int((model.eval()(x).argmax(1) == y).sum())
    assert after.correct == manual and after.accuracy == manual / 24


# --- loaders --------------------------------------------------------------------------------------


def test_shakespeare_from_leaf_json(tmp_path: Path) -> None:
    write_shakespeare(tmp_path, users=2, train=4, test=2)
    source = load_source("shakespeare", str(tmp_path))
    assert source.images.shape == (12, 80) and source.images.dtype == np.int64
    assert source.labels.dtype == np.int64 and source.num_classes == 80
    np.testing.assert_array_equal(source.groups, [0] * 4 + [1] * 4 + [0] * 2 + [1] * 2)
    shard = json.loads((tmp_path / "shakespeare/data/train/all_data_niid_0_keep_0_train_9.json").read_text())
    first = shard["user_data"]["PLAY_ROLE0"]
    assert "".join(SHAKESPEARE_LETTERS[i] for i in source.images[0]) == first["x"][0]
    assert SHAKESPEARE_LETTERS[source.labels[0]] == first["y"][0]


def test_shakespeare_errors_and_unknown_characters(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=r"shakespeare/data/train/\*\.json.*preprocess"):
        load_source("shakespeare", str(tmp_path))
    with pytest.raises(DataNotFoundError, match="shakespeare.*data-root"):
        load_source("shakespeare")
    folder = tmp_path / "shakespeare" / "data" / "train"
    folder.mkdir(parents=True)
    window = "é" + "a" * 79  # outside the vocabulary: read as a space
    (folder / "a.json").write_text(json.dumps({"users": ["u"], "num_samples": [1],
                                               "user_data": {"u": {"x": [window], "y": ["b"]}}}))
    source = load_source("shakespeare", str(tmp_path))
    assert SHAKESPEARE_LETTERS[source.images[0, 0]] == " "
    bad = tmp_path / "bad"
    (bad / "shakespeare" / "data" / "train").mkdir(parents=True)
    (bad / "shakespeare/data/train/a.json").write_text(json.dumps(
        {"users": ["u"], "num_samples": [1], "user_data": {"u": {"x": ["short"], "y": ["b"]}}}))
    with pytest.raises(ValueError, match="a.json: user 'u' sample 0: x must be a string of 80"):
        load_source("shakespeare", str(bad))


def test_celeba_from_leaf_json_reads_images_by_name(tmp_path: Path) -> None:
    write_celeba(tmp_path, users=2, train=3, test=1, suffix=".png")
    source = load_source("celeba", str(tmp_path))
    assert source.images.shape == (8, 3, 84, 84) and len(source) == 8
    np.testing.assert_array_equal(source.groups, [0, 0, 0, 1, 1, 1, 0, 1])
    batch = source.images[np.array([0, 1, 5])]
    assert batch.shape == (3, 3, 84, 84) and batch.dtype == np.float32
    assert 0.0 <= batch.min() and batch.max() <= 1.0
    bright = source.images[np.arange(8)].mean(axis=(1, 2, 3)) > 0.5
    np.testing.assert_array_equal(bright, source.labels == 1)  # smiling images were made brighter


def test_celeba_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=r"celeba/data/train/\*\.json.*img_align_celeba"):
        load_source("celeba", str(tmp_path))
    write_celeba(tmp_path, users=1, train=2, test=1)
    (tmp_path / "celeba/data/raw/img_align_celeba/000002.jpg").unlink()
    with pytest.raises(DataNotFoundError, match="1 image.*missing.*000002.jpg"):
        load_source("celeba", str(tmp_path / "."))  # another spelling of the root: not cached


def test_run_config_fits_models_to_data() -> None:
    from strategies.shared.run_config import RunConfig, default_run_config
    from strategies.shared.settings import ConfigError

    def config(**overrides):
        return RunConfig.from_flower({**default_run_config(), **overrides})

    config(dataset="shakespeare", model="char-lstm", partition="natural")
    with pytest.raises(ConfigError, match="model 'mlp' does not fit dataset 'shakespeare'.*char-lstm"):
        config(dataset="shakespeare", model="mlp", partition="natural")
    with pytest.raises(ConfigError, match="model 'char-lstm' does not fit dataset 'mnist'"):
        config(model="char-lstm")
    with pytest.raises(ConfigError, match="partition 'domains'.*text"):
        config(dataset="shakespeare", model="char-lstm", partition="domains")


# --- short federations ----------------------------------------------------------------------------


def _simulate(tmp_path: Path, **overrides):
    from server_app.harness.simulate import simulate

    return simulate({"num-rounds": 1, "partition": "natural", "data-root": str(tmp_path / "data"),
                     "output-dir": str(tmp_path / "out"), "batch-size": 4, **overrides})


def test_fedavg_on_shakespeare(tmp_path: Path) -> None:
    write_shakespeare(tmp_path / "data")
    summary = _simulate(tmp_path, method="fedavg", dataset="shakespeare", model="char-lstm",
                        **{"num-clients": 3, "run-name": "shakespeare"})
    final = summary["final"]
    assert 0.0 <= final["personalized"]["mean"] <= 100.0 and final["global-accuracy"] is not None
    rounds = (tmp_path / "out" / "shakespeare" / "rounds.jsonl").read_text().splitlines()
    assert json.loads(rounds[-1])["round"] == 1


def test_fedavg_and_fedcg_on_celeba(tmp_path: Path) -> None:
    """FedCG runs on LEAF's CelebA CNN with its domain classifier (the teacher labels every image)."""
    write_celeba(tmp_path / "data")
    for method, extra in (("fedavg", {}),
                          ("fedcg", {"num-rounds": 2, "fedcg.domains": 2, "fedcg.teacher-period": 1,
                                     "fedcg.adj-warmup": 1})):
        summary = _simulate(tmp_path, method=method, dataset="celeba", model="celeba-cnn",
                            **{"num-clients": 3, "run-name": method, **extra})
        assert 0.0 <= summary["final"]["personalized"]["mean"] <= 100.0
    fedcg = json.loads((tmp_path / "out" / "fedcg" / "summary.json").read_text())["fedcg"]
    assert fedcg["layers"] == ["features.12"]  # the last conv of the CelebA CNN is the FedCG layer
    assert fedcg["settings"]["clustering"] == "clf"  # domains from the domain classifier
    # the teacher labelled every train image: 3 celebrities × 7 images, 1 of each held out for testing
    assert sum(fedcg["balance"]["hard-histogram"]) == 18


# --- EMNIST balanced, FLT's structured non-IID -----------------------------------------------------


def write_emnist(root: Path, train_per_class: int = 8, test_per_class: int = 2, seed: int = 0) -> None:
    """EMNIST balanced IDX files (47 classes) in torchvision's layout <root>/EMNIST/raw/; each image's
    brightness encodes its class, so models can learn it."""
    rng = np.random.default_rng(seed)
    raw = root / "EMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, per in (("train", train_per_class), ("test", test_per_class)):
        labels = rng.permutation(np.repeat(np.arange(47), per)).astype(np.uint8)
        images = (rng.integers(0, 40, (len(labels), 28, 28)) + labels[:, None, None] * 4).astype(np.uint8)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
            (raw / f"emnist-balanced-{split}-{kind}-ubyte").write_bytes(header + array.tobytes())


def test_structured_sizes_follow_flts_power_law() -> None:
    from datasets.partition import structured_sizes

    sizes = structured_sizes(12_000, 240)  # the paper: 5 classes × 2,400 images, 240 clients
    assert sizes.sum() == 12_000 and len(sizes) == 240
    assert (np.diff(sizes[1:]) >= 0).all() and sizes[1] == 12_000 // 480 + 1  # ⌊F + exp(x)⌋, F = 25
    assert sizes[-1] > 8 * sizes[1]  # quantity skew
    assert structured_sizes(4_800, 240).sum() == 4_800  # the last cluster's 2 classes


def test_emnist_structured_partition(tmp_path: Path) -> None:
    from datasets.federated import DataSpec, load_partition
    from datasets.partition import PartitionSpec

    write_emnist(tmp_path)
    spec = DataSpec("emnist", str(tmp_path), PartitionSpec("structured", num_clients=20, num_clusters=10,
                                                           labels_per_cluster=5))
    source, partition = load_partition(spec)
    assert source.train_count == 47 * 8
    np.testing.assert_array_equal(partition.cluster_ids, np.repeat(np.arange(10), 2))
    is_test = np.arange(len(source.labels)) >= source.train_count
    for cluster in range(10):
        classes = set(range(5 * cluster, min(5 * cluster + 5, 47)))
        members = [2 * cluster, 2 * cluster + 1]
        trained = np.concatenate([partition.train_indices[m] for m in members])
        assert len(set(trained.tolist())) == len(trained)  # disjoint train sets
        assert set(source.labels[trained].tolist()) == classes and not is_test[trained].any()
        assert len(trained) == 8 * len(classes)  # every train image of the cluster's classes
        all_test = np.flatnonzero(np.isin(source.labels, list(classes)) & is_test)
        for member in members:  # every client tests on all test images of its cluster's classes
            np.testing.assert_array_equal(partition.test_indices[member], all_test)
        first = partition.train_indices[members[0]]  # classes in order: the first client's come first
        assert source.labels[first].max() <= source.labels[partition.train_indices[members[1]]].min()
    assert len(partition.test_indices[-1]) == 2 * 2  # the last cluster holds 2 classes (45, 46)
    with pytest.raises(ValueError, match="structured.*official train/test split"):
        load_partition(DataSpec("digits", None, PartitionSpec("structured", num_clients=4,
                                                              num_clusters=2)))


def test_emnist_absent_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=r"EMNIST balanced files not found.*split='balanced'"):
        load_source("emnist", str(tmp_path))


# --- FLT: an encoder from elsewhere ---------------------------------------------------------------


def _flt_config(**overrides):
    from strategies.shared.run_config import RunConfig, default_run_config

    return RunConfig.from_flower({**default_run_config(), "method": "flt", "dataset": "digits",
                                  "num-clients": 4, "partition": "iid", **overrides})


def test_flt_starts_its_autoencoder_from_a_checkpoint(tmp_path: Path) -> None:
    from strategies.methods.flt.server import build_flt
    from models.autoencoder import build_autoencoder

    torch.manual_seed(123)
    pretrained = build_autoencoder((1, 28, 28), 128)
    path = tmp_path / "ae.pt"
    torch.save(pretrained.state_dict(), path)
    strategy = build_flt(_flt_config(**{"flt.encoder-checkpoint": str(path), "flt.ae-rounds": 0}))
    steps = strategy._train_autoencoder([])  # no autoencoder round: the encoder is the checkpoint's
    with pytest.raises(StopIteration) as done:
        next(steps)
    encoder = done.value.value
    for key, value in pretrained.encoder.state_dict().items():
        np.testing.assert_array_equal(encoder[key].numpy(), value.numpy())
    seeded = build_flt(_flt_config(**{"flt.ae-rounds": 0}))._train_autoencoder([])
    with pytest.raises(StopIteration) as other:
        next(seeded)
    assert not np.array_equal(other.value.value["0.weight"].numpy(), encoder["0.weight"].numpy())


def test_flt_checkpoint_errors_name_the_key_and_shapes(tmp_path: Path) -> None:
    from strategies.methods.flt.server import build_flt
    from strategies.shared.settings import ConfigError
    from models.autoencoder import build_autoencoder

    with pytest.raises(ConfigError, match="flt.encoder-checkpoint.*is not a file"):
        build_flt(_flt_config(**{"flt.encoder-checkpoint": str(tmp_path / "none.pt")}))
    path = tmp_path / "ae64.pt"
    torch.save(build_autoencoder((1, 28, 28), 64).state_dict(), path)
    with pytest.raises(ConfigError, match=r"flt.encoder-checkpoint.*encoder.7.weight has shape \[64, 196\]"
                                          r".*needs \[128, 196\]"):
        build_flt(_flt_config(**{"flt.encoder-checkpoint": str(path)}))
    torch.save({"layer.weight": torch.zeros(2)}, path)
    with pytest.raises(ConfigError, match=r"keys \['layer.weight'\] are not FLT autoencoder keys"):
        build_flt(_flt_config(**{"flt.encoder-checkpoint": str(path)}))


# --- one config per paper table -------------------------------------------------------------------

PAPERS = Path(__file__).resolve().parent.parent / "benchmarks" / "papers"


def test_every_table_config_is_valid_for_every_cell() -> None:
    from benchmarks.compare import _check, grid_runs, load_grid

    configs = sorted(PAPERS.glob("*.toml"))
    assert {p.stem for p in configs} >= {"fedska-table1", "sfl-table1", "sfl-tables2-3", "flt-table1",
                                          "flt-table2", "fedcg-table5"}
    for path in configs:
        grid = load_grid(path)
        for name, methods, settings in grid_runs(grid, path.stem, {}):
            _check(methods, settings)  # every method of every cell is a valid run config
    runs = grid_runs(load_grid(PAPERS / "flt-table2.toml"), "t", {"num-rounds": 1})
    assert runs == [("t-structured-seed0", ["fedavg", "fedsem", "flt"], runs[0][2])]
    assert runs[0][2]["flt.k"] == 2 and runs[0][2]["num-rounds"] == 1  # dotted keys, --set on top


@pytest.mark.parametrize("config,cell,data,extra", [
    ("fedska-table1", "shakespeare", "shakespeare", ["num-clients=3"]),
    ("flt-table2", "structured", "emnist", ["num-clients=4", "num-clusters=2", "flt.ae-epochs=1",
                                            "local-epochs=1"]),
    ("fedcg-table5", "celeba", "celeba", ["num-clients=3", "fedcg.domains=2", "lr=0.01"]),
])
def test_a_table_runs_on_small_generated_data(tmp_path: Path, config: str, cell: str, data: str,
                                               extra: list[str]) -> None:
    from benchmarks.compare import main
    from models.autoencoder import build_autoencoder

    root = tmp_path / "data"
    {"shakespeare": write_shakespeare, "celeba": write_celeba, "emnist": write_emnist}[data](root)
    sets = [f"data-root={root}", "num-rounds=1", "fraction-train=1.0", *extra]
    if data == "emnist":  # an encoder from elsewhere, as the paper's (CIFAR-100) one
        torch.save(build_autoencoder((1, 28, 28), 128).state_dict(), tmp_path / "ae.pt")
        sets.append(f"flt.encoder-checkpoint={tmp_path / 'ae.pt'}")
    argv = ["--config", str(PAPERS / f"{config}.toml"), "--cells", cell, "--results-dir",
            str(tmp_path / "results"), "--runs-dir", str(tmp_path / "runs")]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 0
    result = json.loads((tmp_path / "results" / f"{config}-{cell}-seed0.json").read_text())
    import tomllib

    grid = tomllib.loads((PAPERS / f"{config}.toml").read_text())
    assert [s["method"] for s in result["summaries"]] == grid["methods"]
    for summary in result["summaries"]:
        assert 0.0 <= summary["final"]["personalized"]["mean"] <= 100.0
    assert result["settings"]["dataset"] == data
