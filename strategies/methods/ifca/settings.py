"""IFCA: its settings (`ifca.*` run-config keys) and the messages only it sends."""

from __future__ import annotations

from pydantic import Field

from strategies.shared.messages import TrainReply
from strategies.shared.method import Method
from strategies.shared.settings import MethodSettings


class IFCASection(MethodSettings):
    """IFCA: number C of cluster models (every sampled client receives all C each round)."""

    clusters: int = Field(5, ge=1)


# --- messages -------------------------------------------------------------------------------
TRAIN_IFCA = "train.ifca"
EVALUATE_IFCA = "evaluate.ifca"


class IFCATrainReply(TrainReply):
    """Metrics of a `train.ifca` reply: which cluster model the client chose and trained."""

    cluster: int | None = Field(None, ge=0)  # index ĵ of the cluster model the client trained


def cluster_model(index: int) -> str:
    """ArrayRecord name of cluster model `index`; IFCA sends all C: `cluster-0`, `cluster-1`, ..."""
    return f"cluster-{index}"


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
METHODS = (Method("ifca", "strategies.methods.ifca.server:build", "ifca", IFCASection, {"train.ifca": "client_app.methods.ifca:train",
                                                        "evaluate.ifca": "client_app.methods.ifca:evaluate"},
                  limits={"clusters": "clients"}, model_records=(cluster_model("*"),), privacy=("sample",),
                  privacy_refused=("its server keeps C cluster models, each averaged over the clients that "
                                   "chose it; no client-level aggregate layer is written for them"),
           summary="IFCA: C cluster models; each client trains the one with the lowest loss on its data"),)
