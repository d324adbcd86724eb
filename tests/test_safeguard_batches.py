"""`safeguard-batches`: by default (`whole-split`) a client's local update over its train split less the
held-out slice makes the batches an epoch over the whole split makes, each less its held-out samples
(the slice costs samples, not steps); `slice-free` batches the slice-free part itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from client_app import safeguard
from client_app.training import seeded_generator, task_loss, train_epochs
from strategies.shared.messages import METRICS, PERSONAL, TrainInstructions
from strategies.shared.run_config import RunConfig, default_run_config
from tests.builders import safeguard_component, train_config
from tests.test_safeguard import GUARD, _held, _model, _runtime, _train, node  # noqa: F401


def _data(n: int = 23):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _net() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Linear(4, 3)


def test_keep_trains_on_the_whole_splits_batches_less_the_left_out_samples():
    x, y = _data()
    keep = torch.ones(len(y), dtype=torch.bool)
    keep[[0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 21]] = False
    model = _net()
    train_epochs(model, x, y, epochs=2, batch_size=8, lr=0.1, momentum=0.0,
                 generator=torch.Generator().manual_seed(3), keep=keep)
    # by hand: each epoch's permutation of all 23 samples in batches of 8, the left-out ones dropped
    by_hand, steps = _net(), 0
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(3)
    for _ in range(2):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), 8):
            idx = order[start:start + 8]
            idx = idx[keep[idx]]
            if len(idx) == 0:
                continue
            optimizer.zero_grad()
            task_loss(by_hand(x[idx]), y[idx]).backward()
            optimizer.step()
            steps += 1
    assert steps >= 4  # up to 3 batches per epoch, none of them all left out by construction
    for a, b in zip(model.parameters(), by_hand.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # it is not training on the kept part with its own batches
    part = _net()
    train_epochs(part, x[keep], y[keep], epochs=2, batch_size=8, lr=0.1, momentum=0.0,
                 generator=torch.Generator().manual_seed(3))
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), part.parameters()))


def test_keeping_every_sample_is_training_without_a_mask():
    x, y = _data()
    a, b = _net(), _net()
    train_epochs(a, x, y, epochs=1, batch_size=5, lr=0.1, momentum=0.9,
                 generator=torch.Generator().manual_seed(2))
    train_epochs(b, x, y, epochs=1, batch_size=5, lr=0.1, momentum=0.9,
                 generator=torch.Generator().manual_seed(2), keep=torch.ones(len(y), dtype=torch.bool))
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_a_whole_split_local_update_trains_the_slice_free_samples_in_the_whole_splits_batches(node):
    cfg, context = node
    start = _model(cfg, 1)
    reply = _train(context, start, **GUARD)  # the default
    rt = _runtime(context)
    n = len(rt.data.train_y)
    assert int(reply.content[METRICS]["num-examples"]) == n - _held(context)  # the slice is still out
    ins = TrainInstructions.read(train_config())
    guard = safeguard.SafeguardInstructions(holdout=GUARD["safeguard_holdout"], grid=5)
    x, y = rt.tensors("train")
    keep = torch.zeros(n, dtype=torch.bool)
    keep[safeguard.train_index(rt, ins, guard)] = True
    expected = rt.model(start)
    torch.manual_seed(0)
    train_epochs(expected, x, y, epochs=ins.local_epochs, batch_size=ins.batch_size, lr=ins.lr,
                 momentum=ins.momentum, generator=seeded_generator(ins.seed, 0, ins.server_round),
                 keep=keep)
    sent = reply.content[PERSONAL].to_torch_state_dict()
    for key, value in expected.state_dict().items():  # mclr: no dropout, the global draws do not matter
        np.testing.assert_array_equal(sent[key].numpy(), value.numpy())
    fresh = Context(run_id=1, node_id=context.node_id, node_config=context.node_config,
                    state=RecordDict(), run_config=context.run_config)
    free = _train(fresh, start, **GUARD, safeguard_batches="slice-free")  # the part's own batches
    assert any(not np.array_equal(free.content[PERSONAL][k].numpy(), sent[k].numpy()) for k in sent)


def test_the_server_sends_the_batching_only_when_it_is_not_the_default():
    assert "batches" not in dict(safeguard_component("sfl").request_records("train", 2)["safeguard"])
    records = safeguard_component("sfl", **{"safeguard-batches": "slice-free"}).request_records("train", 2)
    assert dict(records["safeguard"])["batches"] == "slice-free"
    with pytest.raises(ValueError, match="safeguard-batches"):
        RunConfig.from_flower({**default_run_config(), "safeguard-batches": "equal"})
