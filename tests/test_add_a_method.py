"""A method added from this file alone (the README's "Add a method" example): its settings and message
contract, its server step, its client step, and one `register` call. It runs, reads its own settings
section, and its client receives its typed config.

`proxpull`: FedProx-like — a global model averaged as FedAvg does; clients add (μ/2)·||θ − w||².
"""

import json

import pytest
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from pydantic import Field

from client_app.app import install
from client_app.local_update import train_and_reply
from client_app.runtime import client_runtime
from client_app.training import proximal_penalty
from server_app.harness.simulate import simulate
from strategies.contracts.base import ConfigError, MethodSettings
from strategies.contracts.run import RunConfig
from strategies.messages import CONFIG, GLOBAL, METRICS, MODEL, TrainInstructions
from strategies.personalized import PersonalizedStrategy
from strategies.registry import METHODS, Method, register

pytestmark = pytest.mark.federation


# 1. contract: the settings (`proxpull.*` run-config keys) and the train message's typed config
class ProxPullSettings(MethodSettings):
    mu: float = Field(0.01, ge=0.0)


class ProxPullTrain(TrainInstructions):
    mu: float = Field(ge=0.0)  # required: a message without it is rejected by the client


TRAIN_PROXPULL = "train.proxpull"


# 2. server step
class ProxPull(PersonalizedStrategy):
    train_message_type = TRAIN_PROXPULL

    def __init__(self, num_clients: int, fraction_train: float, mu: float) -> None:
        super().__init__(num_clients, fraction_train)
        self.mu = mu
        self.updates: list[tuple] = []

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        ins = ProxPullTrain(**TrainInstructions.read(config).model_dump(), mu=self.mu)
        return RecordDict({GLOBAL: arrays, CONFIG: ins.config()})

    def absorb(self, client: int, content: RecordDict) -> None:
        self.updates.append((self.layout.row(content[MODEL]),
                             float(content[METRICS]["num-examples"])))

    def after_train(self, server_round: int) -> ArrayRecord | None:
        import torch

        rows = torch.stack([row for row, _ in self.updates])
        weights = torch.tensor([n for _, n in self.updates])
        self.updates = []
        return self.layout.arrays(self.global_mean(rows, weights))

    def evaluate_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({GLOBAL: arrays, CONFIG: config})


# 3. client step
RECEIVED: list[float] = []


def train(message, context):
    rt = client_runtime(message, context)
    ins = ProxPullTrain.read(message.content[CONFIG])
    RECEIVED.append(ins.mu)
    model = rt.model(message.content[GLOBAL])
    return train_and_reply(message, rt, ins, model, MODEL, proximal_penalty(model, ins.mu))


# 4. registry line (here done by the fixture, and undone after the test)
PROXPULL = Method("proxpull", lambda cfg: ProxPull(cfg.num_clients, cfg.fraction_train,
                                                   cfg.proxpull.mu),
                  section="proxpull", settings=ProxPullSettings, client={TRAIN_PROXPULL: train})


@pytest.fixture
def proxpull():
    register(PROXPULL)
    install(PROXPULL)  # the client app's routes (done at import for the built-in methods)
    RECEIVED.clear()
    yield PROXPULL
    METHODS.pop(PROXPULL.name)


def test_a_method_registered_from_a_test_file_runs_with_its_own_settings(proxpull, tiny_run,
                                                                          tmp_path):
    summary = simulate({**tiny_run, "method": "proxpull", "proxpull.mu": 0.5, "num-rounds": 3})
    assert summary["method"] == "proxpull"
    assert summary["final"]["global-accuracy"] > summary["round-0"]["global-accuracy"] + 20
    assert RECEIVED == [0.5] * (3 * tiny_run["num-clients"])  # every client got μ, every round
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["proxpull.mu"] == 0.5


def test_its_settings_are_validated_like_any_other(proxpull):
    assert RunConfig(method="proxpull").proxpull.mu == 0.01  # the settings model's default
    with pytest.raises(ConfigError, match=r"proxpull\.mu.*-1.*greater than or equal to 0"):
        RunConfig.from_flower({"method": "proxpull", "proxpull.mu": -1.0})
    with pytest.raises(ConfigError, match=r"unknown key 'proxpull\.nu'; allowed keys: mu"):
        RunConfig.from_flower({"method": "proxpull", "proxpull.nu": 1.0})


def test_an_unregistered_method_and_its_section_are_unknown():
    assert "proxpull" not in METHODS
    with pytest.raises(ConfigError, match="key 'method' = 'proxpull' is invalid: allowed values"):
        RunConfig.from_flower({"method": "proxpull"})
    with pytest.raises(ConfigError, match="unknown key 'proxpull'"):
        RunConfig.from_flower({"proxpull.mu": 0.1})


def test_a_train_message_without_its_required_field_is_rejected():
    common = dict(server_round=1, lr=0.1, momentum=0.0, local_epochs=1, batch_size=8, seed=0)
    with pytest.raises(ValueError, match="mu"):
        ProxPullTrain.read(TrainInstructions(**common).config())
    assert ProxPullTrain.read(ProxPullTrain(**common, mu=0.2).config()).mu == 0.2


def test_the_methods_page_finds_every_registered_method_in_files_that_exist():
    """The Methods table (docs/methods/overview.md) lists each registered method with its contract,
    server and client modules; every path it names exists."""
    import re
    from pathlib import Path

    from strategies.registry import method_names

    repo = Path(__file__).resolve().parent.parent
    text = (repo / "docs" / "methods" / "overview.md").read_text()
    table = text[text.index("| method | kind | settings + messages | server | client |"):]
    table = table[:table.index("\n\n")]
    rows = {re.match(r"\| `([^`]+)` \|", line).group(1): line
            for line in table.splitlines()[2:]}
    assert sorted(rows) == sorted(n for n in method_names() if n != "proxpull")
    for method, line in rows.items():
        paths = re.findall(r"`((?:strategies|client_app)/[\w/]+\.py)`", line)
        assert len(paths) >= 2, method
        assert all((repo / path).is_file() for path in paths), (method, paths)
