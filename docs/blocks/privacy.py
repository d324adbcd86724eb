"""docs/privacy.md: what leaves a client, per method, from the committed measurement
(`python -m benchmarks.what_leaves`, benchmarks/results/what-leaves.json): every record each method's
clients sent in a two-round federation, its size, and what it reveals (`REVEALS`, `KEY_REVEALS`; a
record or key without an entry there fails the generation, so a new upload is never listed silently)."""

from __future__ import annotations

import fnmatch

from docs.blocks import block
from docs.blocks.data import raw, table

# record name (fnmatch pattern) -> what its content reveals about the client's data
REVEALS: dict[str, str] = {
    "model": "the model trained on the client's train split (its update: gradients of its data)",
    "personal": "the client's personalized model, trained on its train split",
    "global": "the shared model after the client's training on its data",
    "autoencoder": "an autoencoder trained on the client's raw inputs",
    "centroids": "k-means centroids of the client's encoded inputs (summaries of its data)",
    "cluster-*": "the cluster model the client trained on its data",
    "student": "FedCG's student model, trained on the client's data",
    "teacher": "a FedCG teacher model, trained on the client's data",
    "slot_features": "FedSKA's feature descriptors, computed from the client's raw inputs",
    "slot_gradients": "gradients of the client's loss on its data with respect to the shared slots",
    "control": "SCAFFOLD's control variate: the client's mean gradient over its local steps",
    "client-control": "SCAFFOLD's control variate: the client's mean gradient over its local steps",
    "descriptor": "FedSKA's mean feature of the client's data (a summary of its raw inputs)",
    "privacy": "the DP-SGD steps taken and the client's ε (dp = 'sample' only)",
}
# ConfigRecord / MetricRecord key -> what it reveals (config and metrics records list their keys)
KEY_REVEALS: dict[str, str] = {
    "num-examples": "data size", "train-sizes": "data size", "test-sizes": "data size",
    "train-loss": "loss on its data", "recon-loss": "loss on its data", "loss": "loss on its data",
    "accuracy": "test accuracy", "correct": "test accuracy", "global-accuracy": "test accuracy",
    "global-correct": "test accuracy", "finetuned-accuracy": "test accuracy",
    "finetuned-correct": "test accuracy", "cuda": "its device", "device": "its device",
    "code-fingerprint": "its code version", "partition-id": "its slot", "num-partitions": "its slot",
    "client-names": "its clients' names", "failed-names": "its clients' names",
    "failed-reasons": "why its data was unusable",
    "label-sets": "which labels it holds (only when the run asks)",
    "groups": "its true group (reporting only)", "domain-counts": "samples per domain",
    "gains": "held-out gains of mixes (safeguard)", "squares": "held-out gains of mixes (safeguard)",
    "own": "the weight of its own model (safeguard)", "finetuned": "its choice of model (safeguard)",
    "start-gain": "held-out gains (safeguard)", "start-square": "held-out gains (safeguard)",
    "tuned-gain": "held-out gains of its fine-tuned model (safeguard)",
    "tuned-square": "held-out gains of its fine-tuned model (safeguard)",
    "student-counts": "how many of its samples the domain classifier puts in each domain (train "
                      "samples in a train reply, test samples in an evaluation)",
    "teacher-counts": "how many of its test samples the teacher puts in each domain",
    "soft-correct": "test accuracy per domain (soft domain weights)",
    "hard-correct": "test accuracy per domain (hard domain assignment)",
    "logit-sum": "sums of the teacher's domain logits over its samples (its domain mix)",
    "logit-square-sum": "sums of squared domain logits over its samples (their spread)",
    "logit-sample": "a few of its samples' domain logits, drawn at random",
    "student-agreement": "how often the student agrees with the teacher on its samples",
    "student-loss": "the student's loss on its data",
    "cluster": "which cluster model fits its data best (lowest loss)",
}


def reveals(name: str) -> str:
    for pattern, text in REVEALS.items():
        if fnmatch.fnmatchcase(name, pattern):
            return text
    raise KeyError(f"docs/blocks/privacy.py: record '{name}' has no entry in REVEALS; say what it "
                   "reveals")


def key_reveals(keys: list[str]) -> str:
    unknown = [k for k in keys if k not in KEY_REVEALS]
    if unknown:
        raise KeyError(f"docs/blocks/privacy.py: key(s) {unknown} have no entry in KEY_REVEALS; "
                       "say what they reveal")
    return ", ".join(dict.fromkeys(KEY_REVEALS[k] for k in keys))


def size(record: dict, model_bytes: int) -> str:
    if record["kind"] != "arrays":
        return f"{len(record['keys'])} values"
    kib = record["bytes"] / 1024
    return f"{kib:,.1f} KiB ({record['bytes'] / model_bytes:.2f}× the model)"


@block("what-leaves")
def what_leaves(prefix: str) -> str:
    """One table per method: message, record, size (for the measured model), what it reveals."""
    measured = raw("what-leaves")
    parts = []
    for entry in measured["methods"]:
        model = entry["model"]
        rows = []
        for record in entry["records"]:
            what = (reveals(record["name"]) if record["kind"] == "arrays" or
                    record["name"] == "privacy" else
                    f"`{'`, `'.join(record['keys'])}`: {key_reveals(record['keys'])}")
            rows.append([f"`{record['message']}`", f"`{record['name']}`", size(record, model["bytes"]),
                         what])
        parts.append(f"### {entry['method']}\n\nModel `{model['model']}` on {model['dataset']}: "
                     f"{model['parameters']:,} parameters, {model['bytes'] / 1024:,.1f} KiB.\n\n"
                     + table(["message", "record", "size", "what it reveals"], rows, "llrl"))
    return "\n\n".join(parts)
