"""Secure aggregation, the part both halves share (docs/privacy.md, "Secure aggregation").

`secure-aggregation = 'secagg+'` runs Flower's SecAgg+ protocol (Bell et al., 2020) around each
round's training, so the server learns only the weighted sum of the sampled clients' models, never
one client's. Each round has four exchanges, each message carrying a `secagg` ConfigRecord with the
keys of Flower's protocol (`flwr.common.secure_aggregation.secaggplus_constants.Key`):

1. `setup` (a `query.secagg` message): the protocol's settings; each client answers two public keys.
2. `share-keys` (`query.secagg`): the public keys of its neighbours; each client answers its secrets
   (its mask seed and first private key) split into Shamir shares, encrypted for each neighbour.
3. `collect-masked-vectors` (the round's train message itself): the shares addressed to the client;
   it trains, and answers, instead of its model, the quantized, weighted model plus masks (one
   mask of its own, one per neighbour that cancels in the sum) as a `secagg` ArrayRecord.
4. `unmask` (`query.secagg`): which neighbours answered 3 and which dropped; each client answers
   the shares that let the server remove the survivors' own masks and the dropped clients' pairwise
   masks.

The client half is Flower's own `secaggplus_mod`, run unchanged inside `client_app/secagg.py`; the
server half is `strategies.shared.secure_sum.SecureAggregation`, a wrapper of the method's strategy
whose phases (`strategies.shared.phases`) send these exchanges and unmask the sum with Flower's
protocol functions. Methods opt in (`Method.secure_aggregation`); `check` rejects the rest, and
settings that cannot hold, before any client is contacted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig

SECAGG = "secagg"  # the record of every secure-aggregation request and reply
QUERY_SECAGG = "query.secagg"  # the message type of the exchanges without training
MODES = ("off", "secagg+")
MODULUS_RANGE = 2**32  # masks are drawn from [0, 2**32) (Flower's default modulus)

# keys of the collect-masked-vectors request that Bouquet adds to Flower's: the ArrayRecord of the
# train reply to mask, and the prefix of its arrays that are masked ('' = all of them)
RECORD = "record"
PART = "part"


def shares(num_shares: int, sampled: int) -> int:
    """The shares of each client's secrets in a round with `sampled` clients: `secagg-num-shares`
    (0: all of them), made odd (each client's neighbours sit symmetrically around it) and at most
    `sampled`."""
    count = sampled if num_shares == 0 else min(num_shares, sampled)
    if count < sampled and count % 2 == 0:
        count += 1
    return min(count, sampled)


def threshold(reconstruction_threshold: int, num_shares: int) -> int:
    """Shares that rebuild a secret: `secagg-reconstruction-threshold` (0: a majority)."""
    return reconstruction_threshold or num_shares // 2 + 1


def sampled_per_round(cfg: RunConfig) -> int:
    """The clients a round samples for training (Flower's FedAvg: int(fraction × clients), ≥ 1)."""
    return max(int(cfg.fraction_train * cfg.num_clients), 1)


def check(cfg: RunConfig, allowed: Sequence[str]) -> None:
    """Raise ValueError (one line naming the key and what is allowed) for secure-aggregation
    settings that cannot hold: a method whose server needs each client's model, a server rule other
    than the weighted mean, client-level DP (it clips each client's update on the server), too few
    clients, shares and threshold that do not fit, a sum that would overflow the modulus. `allowed`:
    the methods that opt in (`Method.secure_aggregation`, passed in by `RunConfig`)."""
    if cfg.secure_aggregation == "off":
        return
    if cfg.method not in allowed:
        raise ValueError(f"secure-aggregation = '{cfg.secure_aggregation}' hides every client's "
                         f"model from the server; method '{cfg.method}''s server needs the "
                         f"individual models (see docs/privacy.md): set secure-aggregation='off' or "
                         f"use one of {', '.join(allowed)}")
    if cfg.aggregation != "mean":
        raise ValueError(f"secure-aggregation gives the server only the weighted sum of the models; "
                         f"aggregation = '{cfg.aggregation}' needs each client's: set "
                         "aggregation='mean'")
    if cfg.dp == "client":
        raise ValueError("secure-aggregation with dp = 'client': client-level DP clips each "
                         "client's update on the server, which secure aggregation hides; use "
                         "dp='sample' or dp='off'")
    sampled = sampled_per_round(cfg)
    if sampled < 3:
        raise ValueError(f"secure-aggregation needs at least 3 clients per round (a sum of two "
                         f"reveals each to the other), but fraction-train × num-clients samples "
                         f"{sampled}; raise num-clients or fraction-train")
    if cfg.secagg_num_shares and not 3 <= cfg.secagg_num_shares <= sampled:
        raise ValueError(f"secagg-num-shares = {cfg.secagg_num_shares} must be 0 (every sampled "
                         f"client) or from 3 to the {sampled} clients sampled per round")
    count = shares(cfg.secagg_num_shares, sampled)
    needed = threshold(cfg.secagg_reconstruction_threshold, count)
    if cfg.secagg_reconstruction_threshold and not 2 <= needed < count:
        raise ValueError(f"secagg-reconstruction-threshold = {needed} must be 0 (a majority) or "
                         f"from 2 to secagg-num-shares − 1 = {count - 1}")
    if sampled * cfg.secagg_quantization_range >= MODULUS_RANGE:
        raise ValueError(f"secagg-quantization-range = {cfg.secagg_quantization_range} × the "
                         f"{sampled} clients sampled per round must stay below 2**32 (the masks' "
                         f"modulus), or the sum overflows: lower it below "
                         f"{MODULUS_RANGE // sampled}")
