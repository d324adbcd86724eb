"""The message contract every method shares: record names, the generic train / evaluate / identify
messages, and fused evaluation. A method's own messages live in its contract module
(`strategies/methods/<method>/settings.py`), typed configs extending `TrainInstructions` with their required
fields.

Both halves import these, so a renamed key breaks a test instead of a deployment. Keys are spelled in
kebab-case on the wire (Flower's convention, e.g. `server-round`, `num-examples`).
"""

from __future__ import annotations

from flwr.app import RecordDict
from pydantic import Field, model_validator

from strategies.shared.settings import Record

# ArrayRecord names (what a record holds, as the method specs name them).
GLOBAL = "global"  # the server's global model, sent down
PERSONAL = "personal"  # a client's personalized model, sent down or up
MODEL = "model"  # the model a client trained, sent up
# ConfigRecord / MetricRecord names.
CONFIG = "config"
FUSED = "fused-evaluate"  # a train message that carries an evaluation too (FusedEvaluation)
EVALUATION_PREFIX = "evaluate:"  # record name prefix of the evaluation part of a fused message
CLIENT = "client"  # which logical client a message is for (added by ClientGrid)
METRICS = "metrics"

# Message types.
TRAIN = "train"
EVALUATE = "evaluate"
IDENTIFY = "query.identify"
TRAIN_LOCAL = "train.local"

class ClientAddress(Record):
    """Which logical client a message is for; one SuperNode may host several. `client-id` is the
    client's index in the run (seeds and per-client state use it); `client-name`, set when the node
    holds its own data (node_config `data-dir`), is the name the node finds the client's data by."""

    client_id: int = Field(ge=0)
    client_name: str | None = Field(None, min_length=1)


class IdentifyRequest(Record):
    """`query.identify`: the server asks a node which clients it hosts."""

    code_fingerprint: str
    num_clients: int = Field(ge=1)
    # the run builds a `label-sharing` client graph: each client reports its label set (it reveals
    # which labels each client holds, so only then)
    label_sets: bool = False


class IdentifyReply(Record):
    """A node's answer: which clients it hosts and the code it runs.

    A node that rebuilds its share of the run's data set sends its partition slot (`partition-id`,
    `num-partitions`); a node with its own data (node_config `data-dir`) sends the names of the
    clients found there (`client-names`) and of those it cannot use (`failed-names`, each with its
    reason in `failed-reasons`). Per-client fields are parallel lists, in the order of the hosted
    clients (client-id order for a slot, `client-names` order for named clients); what a client may
    report later (its label set, group or domain fields) is added the same way, one list entry per
    hosted client.
    """

    partition_id: int | None = Field(None, ge=0)
    num_partitions: int | None = Field(None, ge=1)
    code_fingerprint: str
    device: str
    # train / test sample counts of the hosted clients; replies claiming more examples than
    # declared are dropped (server_app.validation)
    train_sizes: list[int] = Field(default_factory=list)
    test_sizes: list[int] = Field(default_factory=list)
    client_names: list[str] = Field(default_factory=list)
    failed_names: list[str] = Field(default_factory=list)
    failed_reasons: list[str] = Field(default_factory=list)
    # what the clients report about their data (strategies.shared.priors.ClientReport), one entry
    # per hosted client or none at all: their distinct train labels as "0,3,7" (only when the request
    # asks for `label-sets`), their group id (-1: none) and their train samples per domain id as
    # "12,0,5" ("": none). Partitioned: the partition's ground truth of the client; own data: the
    # npz `group` / `domain` arrays. The server's ground-truth figures come from these alone.
    label_sets: list[str] = Field(default_factory=list)
    groups: list[int] = Field(default_factory=list)
    domain_counts: list[str] = Field(default_factory=list)
    # a partition's clients when the partition has no clusters (simulation only): train samples per
    # label as "12,0,5", the label-similarity ground truth
    label_counts: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_way_of_hosting(self) -> IdentifyReply:
        slot = self.partition_id is not None and self.num_partitions is not None
        named = bool(self.client_names or self.failed_names)
        if slot == named:
            raise ValueError("an identify reply gives either partition-id and num-partitions, or "
                             "client-names / failed-names (a node with its own data)")
        if named and len(self.train_sizes) != len(self.client_names):
            raise ValueError(f"{len(self.client_names)} client-names but {len(self.train_sizes)} "
                             "train-sizes; one per named client")
        if len(self.failed_reasons) != len(self.failed_names):
            raise ValueError("one failed-reasons entry per failed-names entry")
        for name in ("label_sets", "groups", "domain_counts", "label_counts"):
            entries = getattr(self, name)
            if entries and len(entries) != len(self.train_sizes):
                raise ValueError(f"{len(entries)} {name.replace('_', '-')} entries but "
                                 f"{len(self.train_sizes)} hosted clients; one per hosted client, "
                                 "or none")
        return self


class TrainInstructions(Record):
    """`train` / `train.<method>`: the local-training hyperparameters of one round (a method's own
    message, in its package's `settings.py`, extends this with its required fields)."""

    server_round: int = Field(ge=1)
    lr: float = Field(gt=0.0)
    momentum: float = Field(ge=0.0, lt=1.0)
    local_epochs: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    seed: int = Field(ge=0)


class TrainReply(Record):
    """Metrics of a training reply; `num-examples` weights aggregation (a method whose reply carries
    more extends this in its contract module, `strategies/methods/<method>/settings.py`)."""

    num_examples: int = Field(ge=0)
    train_loss: float
    cuda: int | None = Field(None, ge=0, le=1)  # the device it trained on: 1 a CUDA GPU, 0 the CPU


class EvaluateInstructions(Record):
    """`evaluate`: evaluate the received model(s) on the client's own test split."""

    server_round: int = Field(ge=0)
    batch_size: int = Field(ge=1)
    seed: int = Field(ge=0)
    finetune_epochs: int = Field(0, ge=0)
    lr: float = Field(gt=0.0)
    momentum: float = Field(ge=0.0, lt=1.0)


class EvaluateReply(Record):
    """Per-client test metrics of the model the client would use (personal if any): `accuracy` for
    classification, or `mae` / `mape` / `rmse` for regression (traffic; de-normalised speeds, MAPE a
    fraction, zeros/missing skipped, NaN when a client has no valid target; averaged over the 12 horizon
    steps, `*-h12` at the last step). `correct` is 0 for regression. `global-*` / `finetuned-*`: the
    global model, and the global model after local fine-tuning epochs."""

    num_examples: int = Field(ge=0)
    correct: float = Field(ge=0)
    loss: float
    accuracy: float | None = Field(None, ge=0.0, le=1.0)
    global_correct: float | None = Field(None, ge=0)
    global_accuracy: float | None = Field(None, ge=0.0, le=1.0)
    finetuned_correct: float | None = Field(None, ge=0)
    finetuned_accuracy: float | None = Field(None, ge=0.0, le=1.0)
    mae: float | None = None
    mape: float | None = None
    rmse: float | None = None
    mae_h12: float | None = None
    mape_h12: float | None = None
    rmse_h12: float | None = None
    global_mae: float | None = None
    global_mape: float | None = None
    global_rmse: float | None = None
    finetuned_mae: float | None = None
    finetuned_mape: float | None = None
    finetuned_rmse: float | None = None

    @model_validator(mode="after")
    def _one_task(self) -> EvaluateReply:
        if (self.accuracy is None) == (self.mae is None):
            raise ValueError("an evaluate reply carries exactly one of 'accuracy' (classification) "
                             "and 'mae' (regression)")
        return self


class FusedEvaluation(Record):
    """`fused-evaluate` of a train message that also carries the previous round's evaluation
    (`strategies.shared.fusion`): the client runs the evaluation first, then the training. The evaluation's
    records travel as `evaluate:<name>`, except `shared` ones, which are identical to a train record
    and travel once: the train record `sources[i]` for `shared[i]` (no `sources`: the same name)."""

    message_type: str = Field(pattern=r"^evaluate(\.[A-Za-z_][A-Za-z0-9_]*)?$")
    shared: list[str] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source_per_shared_record(self) -> FusedEvaluation:
        if self.sources and len(self.sources) != len(self.shared):
            raise ValueError(f"'sources' names {len(self.sources)} train records for "
                             f"{len(self.shared)} shared ones; give one per shared record or none")
        return self


def with_client(content: RecordDict, client_id: int, client_name: str | None = None) -> RecordDict:
    """A copy of `content` addressed to one logical client (records are shared, not copied); a named
    client (a node's own data) is also addressed by its name."""
    records = dict(content.items())
    records[CLIENT] = ClientAddress(client_id=client_id, client_name=client_name).config()
    return RecordDict(records)
