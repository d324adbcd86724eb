"""`fedprox`: Flower's FedProx on FedAvg's Bouquet settings (`strategies.methods.fedavg.server`);
`aggregation='median'` / `'trimmed-mean'` keeps the proximal term and takes FedMedian's /
FedTrimmedAvg's server rule."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.serverapp.strategy import FedMedian, FedProx, FedTrimmedAvg

from strategies.methods.fedavg.server import flower_settings

if TYPE_CHECKING:
    from strategies.shared.client_matrix import ClientMatrixStorage
    from strategies.shared.run_config import RunConfig


class FedProxMedian(FedProx):
    """FedProx clients, FedMedian's coordinate-wise median on the server."""

    aggregate_train = FedMedian.aggregate_train


class FedProxTrimmedAvg(FedProx):
    """FedProx clients, FedTrimmedAvg's coordinate-wise trimmed mean on the server."""

    aggregate_train = FedTrimmedAvg.aggregate_train

    def __init__(self, *, beta: float = 0.2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.beta = beta


def build_fedprox(fraction_train: float, mu: float, aggregation: str = "mean",
                  trim_fraction: float = 0.2) -> FedProx:
    """FedProx (Li et al., 2020): FedAvg whose clients add (μ/2)·||θ − θ_global||² to their loss."""
    if aggregation == "median":
        return FedProxMedian(**flower_settings(fraction_train), proximal_mu=mu)
    if aggregation == "trimmed-mean":
        return FedProxTrimmedAvg(**flower_settings(fraction_train), proximal_mu=mu, beta=trim_fraction)
    return FedProx(**flower_settings(fraction_train), proximal_mu=mu)


def build(cfg: RunConfig, storage: ClientMatrixStorage) -> FedProx:
    """The strategy of a run (its `Method` builder, `strategies.methods.fedprox.server:build`)."""
    return build_fedprox(cfg.fraction_train, cfg.fedprox.mu, cfg.aggregation,
                         cfg.trim_fraction)  # keeps no client matrix
