"""`lg-fedavg`: personal feature extractor, shared head (`server.py`, on the partial-sharing base
`strategies.shared.partial`); clients run the generic `train.local` step. Under `secure-aggregation`
the server learns only the weighted sum of `head.*` and each feature extractor stays on its client."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.shared.method import Method

if TYPE_CHECKING:
    from flwr.serverapp.strategy import Strategy

    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> Strategy:
    from strategies.methods.lg_fedavg.server import LGFedAvg
    return LGFedAvg(cfg.num_clients, cfg.fraction_train, cfg.aggregation, cfg.trim_fraction,
                    matrix_storage=storage)


METHODS = (Method("lg-fedavg", build, robust=True, secure_aggregation=True,
           summary="LG-FedAvg: personal feature extractor, shared head",
           client_step="client_app/methods/local.py", privacy=("sample",)),)
