"""`fedavg`: Flower's built-in message-API strategy, configured for Bouquet (FedProx builds on it).

It runs over a `ClientGrid`, whose node ids are stable client ids, so Flower's sampling and
weighted aggregation are used unchanged. The global model travels as the ArrayRecord `global`.
`aggregation='median'` / `'trimmed-mean'` swaps the weighted mean for Flower's FedMedian /
FedTrimmedAvg aggregation (FedProx keeps its proximal term and takes the robust aggregation).
With whole test clients held out (`domain-test-clients` > 0) the runner offers them only the train
clients for training (`server_app.clients.TrainClients`), as every strategy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING


from flwr.serverapp.strategy import FedAvg, FedMedian, FedTrimmedAvg


from strategies.shared.messages import GLOBAL

if TYPE_CHECKING:
    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


def flower_settings(fraction_train: float) -> dict:
    # Bouquet waits for every client before round 1 (ClientGrid); Flower need not wait again.
    return dict(
        fraction_train=fraction_train,
        fraction_evaluate=1.0,
        min_train_nodes=1,
        min_evaluate_nodes=1,
        min_available_nodes=1,
        arrayrecord_key=GLOBAL,
    )


def build_fedavg(fraction_train: float, aggregation: str = "mean",
                 trim_fraction: float = 0.2) -> FedAvg:
    """FedAvg (McMahan et al., 2017): θ ← Σ_k n_k θ_k / Σ_k n_k, or Flower's FedMedian /
    FedTrimmedAvg with `aggregation='median'` / `'trimmed-mean'`."""
    if aggregation == "median":
        return FedMedian(**flower_settings(fraction_train))
    if aggregation == "trimmed-mean":
        return FedTrimmedAvg(**flower_settings(fraction_train), beta=trim_fraction)
    return FedAvg(**flower_settings(fraction_train))


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> FedAvg:
    """The strategy of a run (its `Method` builder, `strategies.methods.fedavg.server:build`)."""
    return build_fedavg(cfg.fraction_train, cfg.aggregation, cfg.trim_fraction)  # keeps no client matrix
