"""`fedavg` and `fedprox`: Flower's built-in message-API strategies, configured for Bouquet.

They run over a `ClientGrid`, whose node ids are stable client ids, so Flower's sampling and
weighted aggregation are used unchanged. The global model travels as the ArrayRecord `global`.
`aggregation='median'` / `'trimmed-mean'` swaps the weighted mean for Flower's FedMedian /
FedTrimmedAvg aggregation (FedProx keeps its proximal term and takes the robust aggregation).
With whole test clients held out (`domain-test-clients` > 0) the runner offers them only the train
clients for training (`strategies.clients.TrainClients`), as every strategy.
"""

from __future__ import annotations


from flwr.serverapp.strategy import FedAvg, FedMedian, FedProx, FedTrimmedAvg


from strategies.messages import GLOBAL


def _common(fraction_train: float) -> dict:
    # Bouquet waits for every client before round 1 (ClientGrid); Flower need not wait again.
    return dict(
        fraction_train=fraction_train,
        fraction_evaluate=1.0,
        min_train_nodes=1,
        min_evaluate_nodes=1,
        min_available_nodes=1,
        arrayrecord_key=GLOBAL,
    )


class FedProxMedian(FedProx):
    """FedProx clients, FedMedian's coordinate-wise median on the server."""

    aggregate_train = FedMedian.aggregate_train


class FedProxTrimmedAvg(FedProx):
    """FedProx clients, FedTrimmedAvg's coordinate-wise trimmed mean on the server."""

    aggregate_train = FedTrimmedAvg.aggregate_train

    def __init__(self, *, beta: float = 0.2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.beta = beta


def build_fedavg(fraction_train: float, aggregation: str = "mean",
                 trim_fraction: float = 0.2) -> FedAvg:
    """FedAvg (McMahan et al., 2017): θ ← Σ_k n_k θ_k / Σ_k n_k, or Flower's FedMedian /
    FedTrimmedAvg with `aggregation='median'` / `'trimmed-mean'`."""
    if aggregation == "median":
        return FedMedian(**_common(fraction_train))
    if aggregation == "trimmed-mean":
        return FedTrimmedAvg(**_common(fraction_train), beta=trim_fraction)
    return FedAvg(**_common(fraction_train))


def build_fedprox(fraction_train: float, mu: float, aggregation: str = "mean",
                  trim_fraction: float = 0.2) -> FedProx:
    """FedProx (Li et al., 2020): FedAvg whose clients add (μ/2)·||θ − θ_global||² to their loss."""
    if aggregation == "median":
        return FedProxMedian(**_common(fraction_train), proximal_mu=mu)
    if aggregation == "trimmed-mean":
        return FedProxTrimmedAvg(**_common(fraction_train), proximal_mu=mu, beta=trim_fraction)
    return FedProx(**_common(fraction_train), proximal_mu=mu)
