"""Partial sharing: one part of the model shared (the weighted mean over the round's clients), the
other part personal, on the `features.` / `head.` split of `models.backbones.Backbone` (every
state-dict key starts with one of the two). A subclass names its shared part (`shared_part`):

- `features`: shared feature extractor, personal head. Client i receives the global `features.*`
  with its own `head.*`; the server averages `features.*` only.
- `head`: personal feature extractor ("local representation"), shared head. The reverse: the server
  averages `head.*` only.

Client i's model is row i of V [N, P] (`PersonalizedStrategy`); the shared part is the columns of the
shared keys, held once as the shared row g. What client i trains and is evaluated with is
`where(shared, g, V_i)`: one vector expression per message, no loop over parameters. The round's
shared part is the num-examples-weighted mean of the trained clients' shared columns (FedAvg rule);
personal columns of V change only when their own client trains. Clients are stateless (Flower
simulation and deployment alike), so the down-link carries the whole model; the client half is
`train.local` (train the received model, send it back).

Under secure aggregation (`secure-aggregation = 'secagg+'`, strategies/shared/secure_sum.py) the
server learns only the weighted sum of the shared part: a client's reply carries its shared columns
masked (`secure_part`, the keys the protocol sums) and nothing of its personal part, which stays on
the client (client_app/secagg.py keeps it and trains and evaluates with it); the wrapper hands the
unmasked mean to `take_secure_mean`. V's personal columns then keep the initial model, which is what
the down-link carries there and each client replaces with its own.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.messages import CONFIG, PERSONAL, TRAIN_LOCAL
from strategies.shared.params import ParameterLayout
from strategies.shared.personalized import PersonalizedStrategy
from strategies.shared.secure_aggregation import SECAGG

PARTS: tuple[str, ...] = ("features", "head")


def shared_columns(layout: ParameterLayout, part: str) -> torch.Tensor:
    """Boolean mask [P] of the flat columns that belong to `part` (`features` or `head`)."""
    if part not in PARTS:
        raise ValueError(f"unknown model part {part!r}; allowed: {', '.join(PARTS)}")
    stray = [k for k in layout.keys if not k.startswith(tuple(f"{p}." for p in PARTS))]
    if stray:
        raise ValueError(f"partial sharing needs every model key to start with 'features.' or "
                         f"'head.'; found {stray[:3]}")
    mask = torch.zeros(layout.size, dtype=torch.bool)
    for i, key in enumerate(layout.keys):  # one slice per state-dict entry (a handful)
        if key.startswith(f"{part}."):
            mask[layout.offsets[i]:layout.offsets[i + 1]] = True
    if not mask.any():
        raise ValueError(f"the model has no '{part}.*' entries to share")
    return mask


class PartialSharing(PersonalizedStrategy):
    """Shares the model part `shared_part` (the weighted mean over the round's clients); the rest is
    personal."""

    train_message_type = TRAIN_LOCAL
    shared_part: str

    def __init__(self, num_clients: int, fraction_train: float, aggregation: str = "mean",
                 trim_fraction: float = 0.2, *, matrix_storage: ClientMatrixStorage | None = None) -> None:
        super().__init__(num_clients, fraction_train, aggregation, trim_fraction,
                         matrix_storage=matrix_storage)
        self.mask: torch.Tensor | None = None  # [P] True where shared
        self.shared: torch.Tensor | None = None  # g [P] (only the masked columns are used)
        self._trained: list[tuple[int, float]] = []

    def bind(self, arrays: ArrayRecord) -> None:
        first = self.layout is None
        super().bind(arrays)
        if first:
            self.mask = shared_columns(self.layout, self.shared_part)
            self.shared = self.layout.row(arrays).clone()

    def personal_arrays(self, client: int) -> ArrayRecord:
        """Client i's model: shared columns from g, personal columns from V_i."""
        return self.layout.arrays(torch.where(self.mask, self.shared, self.personal[client]))

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({PERSONAL: self.personal_arrays(client), CONFIG: config})

    @property
    def secure_part(self) -> str:
        """The key prefix of the arrays secure aggregation sums: the shared part's."""
        return f"{self.shared_part}."

    def absorb(self, client: int, content: RecordDict) -> None:
        if SECAGG in content:  # secure aggregation: the shared part masked, no personal part
            return  # the sum arrives through take_secure_mean
        super().absorb(client, content)  # V_i ← the trained model (both parts)
        self._trained.append((client, float(self.num_examples[client])))

    def take_secure_mean(self, mean: ArrayRecord) -> None:
        """g[shared] ← the weighted mean of the round's shared part that secure aggregation
        unmasked (`mean`: the arrays of `secure_part`; integer buffers are not in V)."""
        row = self.shared.clone()
        for i, key in enumerate(self.layout.keys):
            if key in mean:
                value = np.asarray(mean[key].numpy(), dtype=np.float32).reshape(-1)
                row[self.layout.offsets[i]:self.layout.offsets[i + 1]] = torch.from_numpy(value)
        self.shared = torch.where(self.mask, row, self.shared)

    def after_train(self, server_round: int) -> ArrayRecord | None:
        """g[shared] ← Σ_k n_k·V_k[shared] / Σ_k n_k over the clients trained this round."""
        if not self._trained:
            return None
        clients = torch.tensor([c for c, _ in self._trained])
        weights = torch.tensor([n for _, n in self._trained])
        self._trained = []
        if float(weights.sum()) <= 0:
            weights = torch.ones_like(weights)
        mean = self.global_mean(self.personal.index_select(0, clients), weights)
        self.shared = torch.where(self.mask, mean, self.shared)
        return None  # no global model: each client uses its own combination
