"""SCAFFOLD and FedAtt: the math against hand-computed values (a client step, the control-variate
update, the server steps, FedAtt's attention), short federations that learn, and a SCAFFOLD resume
that restores c and every c_i."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch.nn import functional as F

from client_app.methods import scaffold as scaffold_client
from client_app.runtime import client_runtime
from models import build_model
from server_app.checkpoint import CheckpointStore
from server_app.harness.local_grid import set_task_identity
from server_app.harness.simulate import simulate
from strategies.methods.fedatt.server import FedAtt, attention, attentive_step, noise_seed
from strategies.methods.fedatt.settings import FedAttSection
from strategies.methods.scaffold.server import Scaffold, server_step
from strategies.methods.scaffold.settings import (
    CLIENT_CONTROL, CONTROL, TRAIN_SCAFFOLD, ScaffoldSection, ScaffoldTrain,
)
from strategies.shared.messages import (
    CLIENT, CONFIG, GLOBAL, METRICS, MODEL, ClientAddress, TrainReply,
)
from strategies.shared.run_config import default_run_config
from tests.builders import train_config

set_task_identity()


class _Grid:
    """The reachable train clients (all of them), which is all `configure_train` reads."""

    def __init__(self, n: int) -> None:
        self.n = n

    def get_node_ids(self) -> list[int]:
        return list(range(self.n))


def _record(**arrays: list[float]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v, dtype=np.float32)) for k, v in arrays.items()})


def _reply(request: Message, examples: int = 10, **records: ArrayRecord) -> Message:
    metrics = TrainReply(num_examples=examples, train_loss=0.5).metrics()
    return Message(RecordDict({**records, METRICS: metrics}), reply_to=request)


# --- SCAFFOLD: the client ------------------------------------------------------------------------
def _client_context() -> Context:
    run_config = {**default_run_config(), "method": "scaffold", "dataset": "digits", "model": "mclr",
                  "num-clients": 2, "partition": "iid", "max-samples-per-client": 40}
    return Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 2},
                   state=RecordDict(), run_config=run_config)


def test_one_scaffold_client_step_is_sgd_on_the_corrected_gradient():
    """One local step (a batch as large as the data: K = 1): y = x − η·(g(x) − c_i + c), and option
    II then gives c_i⁺ = c_i − c + (x − y)/η = g(x), the client's full gradient at x."""
    context = _client_context()
    address = ClientAddress(client_id=0).config()
    rt = client_runtime(Message(RecordDict({CLIENT: address}), dst_node_id=7, message_type="train"),
                        context)
    torch.manual_seed(0)
    template = build_model("mclr", rt.data.input_shape, rt.data.num_classes)
    x = {k: v.detach().clone() for k, v in template.state_dict().items()}
    c = {k: 0.1 * torch.randn_like(v) for k, v in x.items()}
    c_i = {k: 0.1 * torch.randn_like(v) for k, v in x.items()}
    lr = 0.5
    config = ScaffoldTrain.extending(train_config(lr=lr, batch_size=1000)).config()
    request = Message(RecordDict({
        GLOBAL: ArrayRecord({k: v.clone() for k, v in x.items()}),
        CONTROL: ArrayRecord({k: v.clone() for k, v in c.items()}),
        CLIENT_CONTROL: ArrayRecord({k: v.clone() for k, v in c_i.items()}),
        CLIENT: address, CONFIG: config,
    }), dst_node_id=7, message_type=TRAIN_SCAFFOLD)

    reply = scaffold_client.train(request, context)

    # the hand computation: the full-batch gradient of the client's loss at x
    data, target = rt.tensors("train")
    assert len(target) < 1000  # one batch, one step
    F.cross_entropy(template(data), target).backward()
    grad = {k: p.grad for k, p in template.named_parameters()}
    assert set(grad) == set(x)  # every entry is a parameter (mclr has no buffers)
    y = reply.content[MODEL].to_torch_state_dict()
    updated = reply.content[CLIENT_CONTROL].to_torch_state_dict()
    for k in x:
        assert not torch.allclose(c[k], c_i[k])  # the correction is not zero
        torch.testing.assert_close(y[k], x[k] - lr * (grad[k] - c_i[k] + c[k]), rtol=0, atol=1e-6)
        torch.testing.assert_close(updated[k], grad[k], rtol=0, atol=2e-5)
    assert int(reply.content[METRICS]["num-examples"]) == len(target)


def test_the_control_variate_update_is_option_ii():
    """c_i⁺ = c_i − c + (x − y)/(K·η) per parameter; K = epochs · ⌈n / batch⌉; a buffer's entry
    (not a parameter) keeps its c_i."""
    assert scaffold_client.local_steps(100, 2, 32) == 8
    assert scaffold_client.local_steps(96, 1, 32) == 3
    c_i = {"w": np.array([1.0, 2.0], np.float32), "running_mean": np.array([0.0], np.float32)}
    c = {"w": np.array([0.5, 0.5], np.float32), "running_mean": np.array([7.0], np.float32)}
    x, y = {"w": torch.tensor([1.0, 1.0])}, {"w": torch.tensor([0.0, 3.0])}
    out = scaffold_client.updated_control(c_i, c, x, y, steps=4, lr=0.5)
    # (x − y)/(K·η) = [1, −2]/2 = [0.5, −1]; c_i − c = [0.5, 1.5]
    np.testing.assert_allclose(out["w"], [1.0, 0.5])
    np.testing.assert_array_equal(out["running_mean"], [0.0])
    assert out["w"].dtype == np.float32


def test_the_correction_term_adds_c_minus_c_i_to_the_gradient():
    model = torch.nn.Linear(3, 2)
    correction = {"weight": torch.full((2, 3), 0.25), "bias": torch.tensor([1.0, -2.0])}
    scaffold_client.correction_term(correction)(model).backward()
    torch.testing.assert_close(model.weight.grad, correction["weight"])
    torch.testing.assert_close(model.bias.grad, correction["bias"])


# --- SCAFFOLD: the server ------------------------------------------------------------------------
def test_the_scaffold_server_step_by_hand():
    x, c = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0])
    dy = torch.tensor([[1.0, 0.0], [3.0, -2.0]])
    dc = torch.tensor([[2.0, 2.0], [0.0, 4.0]])
    new_x, new_c = server_step(x, c, dy, dc, server_lr=0.5, population=4)
    torch.testing.assert_close(new_x, torch.tensor([1.0 + 0.5 * 2.0, 2.0 + 0.5 * -1.0]))
    torch.testing.assert_close(new_c, torch.tensor([0.0 + 2.0 / 4, 1.0 + 6.0 / 4]))  # Σ Δc / N


def test_scaffold_keeps_each_clients_control_variate_and_updates_c():
    """Round 1: every client gets c = c_i = 0; replies move x by η_g·mean(Δy), c by Σ Δc / N, and
    c_i to what each client sent; round 2 sends each sampled client its own c_i and the new c."""
    strategy = Scaffold(4, 0.5, ScaffoldSection(server_lr=2.0))
    arrays = _record(w=[1.0, 1.0], b=[0.0])
    messages = list(strategy.configure_train(1, arrays, train_config(), _Grid(4)))
    assert len(messages) == 2 and all(m.metadata.message_type == TRAIN_SCAFFOLD for m in messages)
    for m in messages:
        assert not np.any(m.content[CONTROL]["w"].numpy()) and not np.any(m.content[CLIENT_CONTROL]["w"].numpy())
        ScaffoldTrain.read(m.content[CONFIG])
    sent = {m.metadata.dst_node_id: m for m in messages}
    first, second = sorted(sent)
    replies = [
        (first, _reply(sent[first], model=_record(w=[2.0, 1.0], b=[1.0]),
                       **{CLIENT_CONTROL: _record(w=[1.0, 0.0], b=[0.0])})),
        (second, _reply(sent[second], model=_record(w=[0.0, 3.0], b=[1.0]),
                        **{CLIENT_CONTROL: _record(w=[3.0, 4.0], b=[0.0])})),
    ]
    new, _ = strategy.aggregate_train(1, replies)
    # Δy = [[1, 0, 1], [−1, 2, 1]] → mean [0, 1, 1]; x + 2·mean
    np.testing.assert_allclose(new["w"].numpy(), [1.0, 3.0])
    np.testing.assert_allclose(new["b"].numpy(), [2.0])
    torch.testing.assert_close(strategy.control, torch.tensor([1.0, 1.0, 0.0]))  # [4, 4, 0] / 4
    torch.testing.assert_close(strategy.client_controls[first], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(strategy.client_controls[second], torch.tensor([3.0, 4.0, 0.0]))
    others = [i for i in range(4) if i not in sent]
    assert not strategy.client_controls[others].any()

    strategy.fraction_train = 1.0
    round2 = {m.metadata.dst_node_id: m for m in strategy.configure_train(2, new, train_config(),
                                                                          _Grid(4))}
    for client, message in round2.items():
        np.testing.assert_allclose(message.content[CONTROL]["w"].numpy(), [1.0, 1.0])
        np.testing.assert_allclose(message.content[CLIENT_CONTROL]["w"].numpy(),
                                   strategy.client_controls[client][:2].numpy())


# --- FedAtt ------------------------------------------------------------------------------------
def test_fedatt_attention_and_step_by_hand():
    """Two layers (entries 0–1 and 2), two clients: α^l = softmax_k ‖w^l − w_k^l‖₂ and
    w^l ← w^l − ε·Σ_k α_k^l (w^l − w_k^l)."""
    server = torch.tensor([0.0, 0.0, 0.0])
    clients = torch.tensor([[3.0, 4.0, 1.0], [0.0, 0.0, 2.0]])
    offsets = (0, 2, 3)
    alpha = attention(server, clients, offsets)
    # layer 0: distances 5 and 0; layer 1: 1 and 2
    a0 = [math.exp(5) / (math.exp(5) + 1), 1 / (math.exp(5) + 1)]
    a1 = [math.exp(1) / (math.exp(1) + math.exp(2)), math.exp(2) / (math.exp(1) + math.exp(2))]
    np.testing.assert_allclose(alpha.numpy(), [a0, a1], rtol=1e-12)
    new, _ = attentive_step(server, clients, offsets, epsilon=1.2)
    expected = [1.2 * a0[0] * 3.0, 1.2 * a0[0] * 4.0, 1.2 * (a1[0] * 1.0 + a1[1] * 2.0)]
    np.testing.assert_allclose(new.numpy(), expected, rtol=1e-6)
    assert new.dtype == torch.float32


def test_fedatt_aggregates_the_replies_and_adds_seeded_noise_when_asked():
    arrays = _record(w=[0.0, 0.0], b=[0.0])
    models = [_record(w=[3.0, 4.0], b=[1.0]), _record(w=[0.0, 0.0], b=[2.0])]

    def run(noise: float, server_round: int = 1) -> np.ndarray:
        strategy = FedAtt(2, 1.0, FedAttSection(epsilon=1.2, noise=noise), seed=5)
        messages = list(strategy.configure_train(server_round, arrays, train_config(), _Grid(2)))
        assert [m.metadata.message_type for m in messages] == ["train", "train"]
        replies = [(m.metadata.dst_node_id, _reply(m, model=models[m.metadata.dst_node_id]))
                   for m in messages]
        new, _ = strategy.aggregate_train(server_round, replies)
        return np.concatenate([new["w"].numpy(), new["b"].numpy()])

    plain = run(0.0)
    expected, _ = attentive_step(torch.zeros(3), torch.tensor([[3.0, 4.0, 1.0], [0.0, 0.0, 2.0]]),
                                 (0, 2, 3), 1.2)
    np.testing.assert_allclose(plain, expected.numpy(), rtol=1e-6)
    noisy = run(0.01)
    noise = torch.randn(3, generator=torch.Generator().manual_seed(noise_seed(5, 1)),
                        dtype=torch.float32).numpy()
    np.testing.assert_allclose(noisy - plain, 0.01 * noise, atol=1e-6)
    np.testing.assert_array_equal(run(0.01), noisy)  # reproducible from (seed, round)
    assert not np.allclose(run(0.01, server_round=2), noisy)  # a new draw each round


def test_their_settings_are_validated():
    from strategies.shared.run_config import RunConfig
    from strategies.shared.settings import ConfigError

    cfg = RunConfig.from_flower({**default_run_config(), "method": "scaffold",
                                 "scaffold.server-lr": 0.5, "fedatt.epsilon": 0.3})
    assert cfg.scaffold.server_lr == 0.5 and cfg.fedatt.epsilon == 0.3 and cfg.fedatt.noise == 0.0
    for bad in ({"scaffold.server-lr": 0.0}, {"fedatt.epsilon": -1.0}, {"fedatt.noise": -0.1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            RunConfig.from_flower({**default_run_config(), **bad})


# --- federations -------------------------------------------------------------------------------
def _run(tmp_path, method: str, **extra) -> dict:
    return {"dataset": "digits", "model": "mclr", "partition": "label-clusters", "num-clusters": 2,
            "labels-per-cluster": 5, "num-clients": 6, "num-rounds": 5, "local-epochs": 1,
            "batch-size": 32, "lr": 0.05, "max-samples-per-client": 120, "fraction-train": 0.5,
            "finetune-epochs": 0, "client-threads": 1, "safeguard": "off", "seed": 3,
            "method": method, "output-dir": str(tmp_path), "run-name": "run", **extra}


@pytest.mark.federation
@pytest.mark.parametrize("method", ["scaffold", "fedatt"])
def test_a_short_federation_learns_digits(tmp_path, method):
    """Five rounds on non-IID digits (two label clusters, half the clients per round): the global
    model is far above chance (10 %)."""
    summary = simulate(_run(tmp_path, method))
    assert summary["final"]["global-accuracy"] > 40.0


@pytest.mark.federation
def test_a_resumed_scaffold_run_restores_c_and_every_c_i(tmp_path):
    """Cut after round 1, resume: the checkpoint holds c and the sampled clients' c_i, and the resumed
    run equals the uninterrupted one. Resuming from the same checkpoint with c and c_i zeroed gives
    other numbers, so the equality depends on restoring them."""
    extra = {"num-rounds": 3, "checkpoint-every": 1}
    full = simulate(_run(tmp_path / "full", "scaffold", **extra))
    simulate(_run(tmp_path / "cut", "scaffold", **{**extra, "num-rounds": 1}))
    store = CheckpointStore(tmp_path / "cut" / "run" / "checkpoints")
    state = store.load(1)
    strategy = state["parts"]["federation"]["strategy"]
    assert isinstance(strategy, Scaffold) and strategy.control.abs().sum() > 0
    trained = strategy.client_controls.abs().sum(dim=1) > 0
    assert int(trained.sum()) == 3  # fraction-train 0.5 of 6 clients
    resumed = simulate(_run(tmp_path / "cut", "scaffold", **extra, resume=True))
    assert resumed["final"] == full["final"]

    strategy.control.zero_()
    strategy.client_controls.zero_()
    state["config"]["output-dir"] = str(tmp_path / "forgetful")
    CheckpointStore(tmp_path / "forgetful" / "run" / "checkpoints").save(1, state)
    lost = simulate(_run(tmp_path / "forgetful", "scaffold", **extra, resume=True))
    assert lost["final"] != full["final"]
