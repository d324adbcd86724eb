"""SFL / SFL*: its settings (`sfl.*` run-config keys) and the messages only it sends."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from strategies.shared.method import Method
from strategies.shared.settings import GraphFileRule
from strategies.shared.messages import TrainInstructions


class SFLSection(GraphFileRule):
    """SFL / SFL* (docs/methods/sfl.md): client graph, GCN hops L and α, local pulls λ1/λ2, SFL*'s learner."""

    section: ClassVar[str] = "sfl"

    graph: Literal["label-sharing", "road", "file", "none"] = "label-sharing"  # the prior A
    graph_file: str = Field("", validate_default=True)  # .npy / .csv adjacency for graph='file'
    hops: int = Field(1, ge=0)  # L (spec: 3)
    alpha: float = Field(0.5, ge=0.0, le=1.0)  # U = α·Â^L·V + (1−α)·V (spec: 1.0)
    lambda_personal: float = Field(0.3, ge=0.0)  # λ1·||θ − u_i||_2
    lambda_global: float = Field(0.3, ge=0.0)  # λ2·||θ − w||_2
    reg_grad: bool = False  # true: the pulls carry gradients (spec); false: constants (reference code)
    start: Literal["global", "personal"] = "personal"  # clients start from u_i, or from w (spec)
    propagation: Literal["auto", "graph-first", "rows-first"] = "auto"
    beta: float = Field(1.0, ge=0.0, le=1.0)  # SFL*: A = (1−β)·Â_prior + β·A_learn (spec: 0.05)
    # rows of V read by the propagation, the read-out and SFL*'s learner: `trained` leaves out the
    # rows of clients that never trained (still w0), renormalising Â's rows; `all` = the spec
    rows: Literal["trained", "all"] = "trained"
    staleness_decay: float = Field(0.5, gt=0.0, le=1.0)  # rows='trained': weight decay^(age in rounds)
    gl_k: int = Field(5, ge=1)  # top-k per row of the learned graph (at most N − 1)
    gl_model: Literal["mtgnn", "knn"] = "knn"  # knn: top-k of the model similarity itself
    gl_features: Literal["models", "updates"] = "updates"  # distances of V's rows, or of the updates
    gl_dim: int = Field(40, ge=1)  # m, node-embedding size
    gl_scale: float = Field(3.0, gt=0.0)  # a, tanh saturation
    gl_init_std: float = Field(0.1, gt=0.0)  # std of the node embeddings at init (reference: 1.0)
    gl_steps: int = Field(50, ge=1)  # learner steps per round
    gl_lr: float = Field(0.01, gt=0.0)
    gl_optimizer: Literal["adam", "sgd"] = "adam"
    gl_weight_decay: float = Field(0.0, ge=0.0)
    gl_persist: bool = True  # false: a fresh learner every round (reference code)
    gl_target: Literal["similarity", "distance"] = "similarity"
    gl_symmetric: bool = True  # export topk(A_L) + its transpose (reference: false)
    gl_self_loops: bool = True  # add self-loops to the exported graph (reference: false)


# --- messages -------------------------------------------------------------------------------
TRAIN_SFL = "train.sfl"  # SFL / SFL*: train from `global` with pulls toward `global` and `personal`


class SFLTrain(TrainInstructions):
    """`train.sfl`: the local step's pulls λ1·||θ − u_i||_2 + λ2·||θ − w||_2 and where θ starts."""

    lambda_personal: float = Field(ge=0.0)  # λ1
    lambda_global: float = Field(ge=0.0)  # λ2
    reg_grad: bool  # the pulls carry gradients (false = reference code: constants)
    start: Literal["global", "personal"]  # θ starts from w (spec) or from u_i


# the registry entry (`strategies.shared.method.Method`), read through the package's __init__
HANDLERS = {"train.sfl": "client_app.methods.sfl:train"}
METHODS = (
    Method("sfl", "strategies.methods.sfl.server:build_plain", "sfl", SFLSection, HANDLERS, safeguard=True, privacy=("sample", "client"), default=True,
           summary="SFL: weight-free GCN aggregation of the client models over a given client graph (label-sharing, road or file)"),
    Method("sfl-star", "strategies.methods.sfl.server:build_star", "sfl", SFLSection, HANDLERS, limits={"gl_k": "other-clients"}, safeguard=True, privacy=("sample", "client"),
           summary="SFL\\* (`sfl*`): SFL over a graph learned from the client models, blended into the prior"),
)
