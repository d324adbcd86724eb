"""`scaffold`: SCAFFOLD (Karimireddy et al., ICML 2020), Algorithm 1 with option II.

The server keeps the global model x, the server control variate c and every client's control variate
c_i (all zero at the start). Each round, a sampled client i receives x, c and c_i, runs its K local
steps y ← y − η·(g_i(y) − c_i + c) from y = x, and sends back y and
c_i⁺ = c_i − c + (x − y)/(K·η) (`client_app/methods/scaffold.py`). The server then takes
Δy_i = y_i − x and Δc_i = c_i⁺ − c_i and sets

    x ← x + η_g · mean_{i∈S}(Δy_i),    c ← c + (|S|/N) · mean_{i∈S}(Δc_i),    c_i ← c_i⁺ (i ∈ S),

N the clients training samples from this round (the reachable train clients). Means are unweighted,
as in the paper.

Where c_i lives: in the paper each client keeps its own c_i. A deployed ClientApp is a fresh process
per message and keeps nothing between rounds, and node state is lost when a run resumes on new nodes,
so the server keeps every c_i as a row of one [N, P] matrix (`ClientMatrixStorage`, memory-mapped
above `client-matrix-mmap-bytes`) and sends c_i with c and x. The strategy object, c_i rows included,
is what a checkpoint saves, so a resumed run continues with the same control variates. The cost: a
train message carries three model-sized records (x, c, c_i) instead of the paper's two (x, c), and a
reply two (y, c_i⁺) where the paper's client uploads (Δy, Δc).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from strategies.methods.scaffold.settings import (
    CLIENT_CONTROL, CONTROL, TRAIN_SCAFFOLD, ScaffoldSection, ScaffoldTrain,
)
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.messages import CONFIG, GLOBAL, MODEL
from strategies.shared.params import ParameterLayout
from strategies.shared.personalized import PersonalizedStrategy

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig


def server_step(x: torch.Tensor, control: torch.Tensor, model_deltas: torch.Tensor,
                control_deltas: torch.Tensor, server_lr: float, population: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """SCAFFOLD's server update from the [|S|, P] client deltas Δy and Δc:
    (x + η_g·mean(Δy), c + (|S|/N)·mean(Δc)) = (…, c + Σ Δc / N)."""
    sampled = model_deltas.shape[0]
    new_x = x + server_lr * model_deltas.mean(dim=0)
    new_c = control + (sampled / population) * control_deltas.mean(dim=0)
    return new_x, new_c


class Scaffold(PersonalizedStrategy):
    train_message_type = TRAIN_SCAFFOLD

    def __init__(self, num_clients: int, fraction_train: float, settings: ScaffoldSection, *,
                 matrix_storage: ClientMatrixStorage | None = None) -> None:
        super().__init__(num_clients, fraction_train, matrix_storage=matrix_storage)
        self.server_lr = settings.server_lr
        self.control: torch.Tensor | None = None  # c [P]
        self.client_controls: torch.Tensor | None = None  # c_i as rows of [num_clients, P]
        self.population = num_clients  # N of the running round: the clients sampling draws from
        self._x: torch.Tensor | None = None  # this round's global model x as a row
        self._control_record: ArrayRecord | None = None  # c as sent this round
        self._deltas: list[tuple[torch.Tensor, torch.Tensor]] = []  # (Δy_i, Δc_i) of this round

    def bind(self, arrays: ArrayRecord) -> None:
        """On first use: the layout, c = 0 and c_i = 0 for every client (no personal models)."""
        if self.layout is None:
            self.layout = ParameterLayout.of(arrays)
            self.control = torch.zeros(self.layout.size, dtype=torch.float32)
            self.client_controls = self.matrix_storage.empty(self.num_clients, self.layout.size)
            self.client_controls.zero_()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.bind(arrays)
        self.population = max(len(grid.get_node_ids()), 1)
        self._x = self.layout.row(arrays)
        self._control_record = self.layout.arrays(self.control)
        self._deltas = []
        return super().configure_train(server_round, arrays, config, grid)

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({
            GLOBAL: arrays,
            CONTROL: self._control_record,
            CLIENT_CONTROL: self.layout.arrays(self.client_controls[client]),
            CONFIG: ScaffoldTrain.extending(config).config(),
        })

    def absorb(self, client: int, content: RecordDict) -> None:
        trained = self.layout.row(content[MODEL])
        updated = self.layout.row(content[CLIENT_CONTROL])
        self._deltas.append((trained - self._x, updated - self.client_controls[client]))
        self.client_controls[client] = updated

    def after_train(self, server_round: int) -> ArrayRecord | None:
        if not self._deltas:
            return None
        model_deltas = torch.stack([dy for dy, _ in self._deltas])
        control_deltas = torch.stack([dc for _, dc in self._deltas])
        self._deltas = []
        x, self.control = server_step(self._x, self.control, model_deltas, control_deltas,
                                      self.server_lr, self.population)
        return self.layout.arrays(x)

    def evaluate_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({GLOBAL: arrays, CONFIG: config})

    def round_report(self, server_round: int) -> dict[str, Any]:
        if self.control is None:
            return {}
        return {"scaffold-control-norm": float(self.control.norm())}


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Scaffold:
    """The strategy of a run (its `Method` builder, `strategies.methods.scaffold.server:build`)."""
    return Scaffold(cfg.num_clients, cfg.fraction_train, cfg.scaffold, matrix_storage=storage)
