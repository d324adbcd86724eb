"""Differential privacy, the part both halves share (docs/privacy.md).

Two modes, chosen by the run config's `dp`:

- `sample` (record-level DP-SGD): every client clips each example's gradient to `dp-max-grad-norm`
  and adds Gaussian noise of std `dp-noise-multiplier` × that norm to each step's sum, with Poisson
  sampling of its train split (Opacus, `client_app/privacy.py`). Train requests carry a `privacy`
  record (`PrivacyInstructions`): the settings and the *ledger*, the DP-SGD steps every client has
  taken so far, since a deployed ClientApp is a fresh process per message and keeps nothing; the
  server keeps the ledger (`server_app/privacy.py`) from what each train reply reports in its own
  `privacy` record (`PrivacyReport`). A client with `dp-target-epsilon` set takes only the steps
  that keep its ε within it.
- `client` (user-level DP-FedAvg): the server clips each client's update to `dp-clip-norm`, averages
  the sampled clients' clipped updates with equal weights and adds Gaussian noise of std
  `dp-noise-multiplier` × `dp-clip-norm` / (clients sampled) to the aggregate
  (`strategies.shared.private_aggregation.ClientLevelDP`, a wrapper of the method's strategy); once
  the next aggregate would exceed `dp-target-epsilon`, no client trains any more. Methods whose
  server forms one aggregate per client opt into `AggregateNoise` instead: each aggregate noised by
  its own sensitivity, the clients' non-model uploads clipped and noised on the client
  (`UploadInstructions`, `noised_record`), every release accounted per client.

Both use Opacus' RDP accountant: ε at `dp-delta` of a history of (noise multiplier, sampling rate,
steps). Which modes a method supports its registry entry declares (`Method.privacy`); `check` rejects
the rest, and bad values, before any client is contacted.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from strategies.shared.settings import Record

if TYPE_CHECKING:
    from strategies.shared.run_config import RunConfig

PRIVACY = "privacy"  # the record of a train request (PrivacyInstructions) and of its reply (PrivacyReport)
MODES = ("off", "sample", "client")

# One accounting entry: (noise multiplier, sampling rate, steps).
Entry = tuple[float, float, int]


def epsilon(history: Iterable[Entry], delta: float) -> float:
    """ε at `delta` of a history of Gaussian-mechanism steps, by Opacus' RDP accountant (0 for none).

    The same numbers as `RDPAccountant.get_epsilon` with `history`, bit for bit, computed as it
    does (`compute_rdp` of each entry at the default orders, summed in order, converted by
    `get_privacy_spent`), with two caches: one step's RDP per (noise multiplier, sampling rate),
    the costly part (Opacus' `compute_rdp` of k steps is one step's times k), and ε per exact history
    and δ (clients with equal ledgers, the server's and the client's reports of the same ledger)."""
    entries = tuple((float(s), float(q), int(k)) for s, q, k in history if k > 0)
    if not entries:
        return 0.0
    return _epsilon(entries, float(delta))


@functools.lru_cache(maxsize=4096)
def _epsilon(entries: tuple[Entry, ...], delta: float) -> float:
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as analysis

    rdp = sum([_step_rdp(noise, rate) * steps for noise, rate, steps in entries])
    eps, _ = analysis.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
    return float(eps)


@functools.lru_cache(maxsize=1024)
def _step_rdp(noise: float, rate: float) -> Any:
    """One step's RDP of the sampled Gaussian mechanism at Opacus' default orders (read-only)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as analysis

    rdp = analysis.compute_rdp(q=rate, noise_multiplier=noise, steps=1,
                               orders=RDPAccountant.DEFAULT_ALPHAS)
    rdp.setflags(write=False)
    return rdp


def merged(history: Iterable[Entry]) -> list[Entry]:
    """The same history with the steps of equal (noise, rate) summed (RDP of equal steps adds up)."""
    steps: dict[tuple[float, float], int] = {}
    for noise, rate, count in history:
        steps[(noise, rate)] = steps.get((noise, rate), 0) + int(count)
    return [(noise, rate, count) for (noise, rate), count in steps.items()]


def steps_within(history: Sequence[Entry], noise: float, rate: float, steps: int, delta: float,
                 target: float) -> int:
    """The most of `steps` more DP steps at (`noise`, `rate`) after `history` that keep ε ≤ `target`
    (all of them with `target` 0, no target)."""
    if target <= 0 or epsilon([*history, (noise, rate, steps)], delta) <= target:
        return steps
    low, high = 0, steps  # ε(low) ≤ target < ε(high)
    if epsilon([*history, (noise, rate, 1)], delta) > target:
        return 0
    low = 1
    while high - low > 1:
        middle = (low + high) // 2
        if epsilon([*history, (noise, rate, middle)], delta) <= target:
            low = middle
        else:
            high = middle
    return low


def sample_schedule(n: int, batch_size: int, epochs: int) -> tuple[float, int]:
    """(sampling rate, steps) of DP-SGD over n examples for `epochs` epochs: ⌈n / batch-size⌉ steps
    per epoch at rate 1 / ⌈n / batch-size⌉ (Opacus' DP data loader; client_app/privacy.py trains so)."""
    per_epoch = max(math.ceil(n / batch_size), 1)
    return 1.0 / per_epoch, epochs * per_epoch


def noise_for_epsilon(target_epsilon: float, delta: float,
                      schedules: Iterable[tuple[float, int]]) -> float:
    """The noise multiplier σ with which every schedule (sampling rate, steps) of the Gaussian
    mechanism ends at ε ≤ `target_epsilon` at `delta` by the RDP accountant (Opacus'
    `get_noise_multiplier` per schedule, within its tolerance of 0.01 below the target; the largest
    σ of the schedules)."""
    from opacus.accountants.utils import get_noise_multiplier

    if target_epsilon <= 0:
        raise ValueError(f"target ε = {target_epsilon:g} must be positive to calibrate a noise "
                         "multiplier")
    found = [get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                  sample_rate=rate, steps=steps, accountant="rdp")
             for rate, steps in sorted(set(schedules)) if steps > 0]
    if not found:
        raise ValueError("no DP steps to calibrate a noise multiplier for")
    return float(max(found))


def run_schedules(cfg: RunConfig, train_sizes: Sequence[int] = ()) -> list[tuple[float, int]]:
    """Each accountant's (sampling rate, steps) over a whole run of `cfg` if every round trains:
    under `sample`, one per distinct client train size (`train_sizes`) with `local-epochs` epochs a
    round; under `client`, the federation's, one aggregate a round at rate (clients sampled) /
    num-clients. A method that trains more than once a round, or a client sampled in fewer rounds,
    spends otherwise (`dp-target-epsilon` then stops it)."""
    if cfg.dp == "sample":
        if not train_sizes:
            raise ValueError("dp = 'sample': the clients' train sizes are needed to calibrate")
        out = []
        for n in sorted(set(int(n) for n in train_sizes if n > 0)):
            rate, steps = sample_schedule(n, cfg.batch_size, cfg.local_epochs)
            out.append((rate, steps * cfg.num_rounds))
        return out
    if cfg.dp == "client":
        sampled = max(int(cfg.fraction_train * cfg.num_clients), 1)
        return [(sampled / cfg.num_clients, cfg.num_rounds)]
    raise ValueError(f"dp = '{cfg.dp}' has no accountant to calibrate")


class PrivacyInstructions(Record):
    """`privacy` of a train request under `dp = 'sample'`: the DP-SGD settings and the ledger, the
    steps each client took in earlier rounds as parallel lists (one row per client and distinct
    noise multiplier and sampling rate)."""

    noise_multiplier: float = Field(gt=0.0)
    max_grad_norm: float = Field(gt=0.0)
    delta: float = Field(gt=0.0, lt=1.0)
    target_epsilon: float = Field(0.0, ge=0.0)  # 0: no target
    ledger_clients: list[int] = Field(default_factory=list)
    ledger_noise: list[float] = Field(default_factory=list)
    ledger_rates: list[float] = Field(default_factory=list)
    ledger_steps: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _parallel(self) -> PrivacyInstructions:
        sizes = {len(self.ledger_clients), len(self.ledger_noise), len(self.ledger_rates),
                 len(self.ledger_steps)}
        if len(sizes) != 1:
            raise ValueError("the ledger's clients, noise, rates and steps must be parallel lists")
        return self

    def history(self, client: int) -> list[Entry]:
        """The ledger's entries of `client`."""
        return [(s, q, k) for c, s, q, k in zip(self.ledger_clients, self.ledger_noise,
                                                 self.ledger_rates, self.ledger_steps) if c == client]


def ledger_fields(ledger: dict[int, list[Entry]]) -> dict[str, list[Any]]:
    """`PrivacyInstructions`' ledger lists from client → history."""
    rows = [(client, *entry) for client in sorted(ledger) for entry in merged(ledger[client])]
    return {"ledger_clients": [r[0] for r in rows], "ledger_noise": [r[1] for r in rows],
            "ledger_rates": [r[2] for r in rows], "ledger_steps": [r[3] for r in rows]}


class PrivacyReport(Record):
    """`privacy` of a train reply under `dp = 'sample'`: the DP-SGD steps this message took (one
    entry per local training run, e.g. two for a global and a personal model), the steps it planned, and the client's ε at
    δ after them (its ledger included)."""

    noise: list[float] = Field(default_factory=list)
    rates: list[float] = Field(default_factory=list)
    steps: list[int] = Field(default_factory=list)
    planned_steps: int = Field(0, ge=0)
    epsilon: float = Field(ge=0.0)

    def entries(self) -> list[Entry]:
        if not len(self.noise) == len(self.rates) == len(self.steps):
            raise ValueError("a privacy report's noise, rates and steps must be parallel lists")
        return list(zip(self.noise, self.rates, self.steps))


# --- client-level DP's clipping and the noised uploads --------------------------------------------
DP_UPLOAD = "dp-upload"  # request record (UploadInstructions): noise the named records of the reply


def clip_scale(norm: float, clip_norm: float) -> float:
    """The factor that clips a vector of L2 norm `norm` to at most `clip_norm` (1: within it)."""
    return min(1.0, clip_norm / (norm + 1e-12))


class UploadInstructions(Record):
    """`dp-upload` of a request under `dp = 'client'` (or `sample`, `UploadLedger`): the reply's ArrayRecords named in `records`
    leave the client clipped (each record's floating arrays together) to L2 norm `clip-norm` and
    with Gaussian noise of std `noise-multiplier` × `clip-norm` on every value, drawn from a
    generator seeded by `seed` (`noised_record`)."""

    noise_multiplier: float = Field(gt=0.0)
    clip_norm: float = Field(gt=0.0)
    records: list[str]
    seed: int = Field(ge=0)


def noised_record(record: Any, clip_norm: float, std: float, generator: Any) -> Any:
    """`record` (an ArrayRecord) with its floating arrays clipped together to L2 norm `clip_norm`
    and N(0, std²) added to each value (float64 arithmetic, each array back in its dtype; the
    others as they are): one Gaussian mechanism of sensitivity `clip_norm`."""
    import numpy as np
    import torch
    from flwr.app import Array, ArrayRecord

    values = {name: record[name].numpy() for name in record.keys()}
    floating = [n for n, v in values.items() if np.issubdtype(v.dtype, np.floating)]
    norm = float(np.sqrt(sum(float(np.square(values[n].astype(np.float64)).sum())
                             for n in floating)))
    scale = clip_scale(norm, clip_norm)
    out = {}
    for name, value in values.items():
        if name in floating:
            noise = torch.normal(0.0, std, size=value.shape, generator=generator,
                                 dtype=torch.float64).numpy() if value.size else 0.0
            value = (value.astype(np.float64) * scale + noise).astype(value.dtype)
        out[name] = Array(np.ascontiguousarray(value))
    return ArrayRecord(out)


def upload_entry(upload_noise_multiplier: float, records: int) -> Entry:
    """The accounting entry of `records` noised upload records under `dp = 'sample'`
    (`UploadLedger`): each a Gaussian mechanism at noise multiplier σ_u/2, no subsampling."""
    return (upload_noise_multiplier / 2.0, 1.0, int(records))


class UploadLedger:
    """`dp = 'sample'`, a method whose clients upload more than what DP-SGD trained (descriptors,
    embeddings, split-learning features and gradients): those records leave the client clipped to
    `dp-upload-clip-norm` and noised with σ_u = `dp-upload-noise-multiplier` by the same client layer
    as under `client` (`upload_instructions`, client_app/private_upload.py). Each is one Gaussian
    mechanism on the client's data whose sensitivity to one example is 2·C_u (the example's removal
    moves the clipped record anywhere within the ball of radius C_u, not to zero as a whole client's
    removal does), so with std σ_u·C_u its noise multiplier is σ_u/2. The strategy charges the
    records it receives (`charge_uploads`); the run's DP-SGD ledger (server_app/privacy.py) takes them
    (`take`) as entries (σ_u/2, rate 1, records), so each client's ε is Opacus' RDP of its DP-SGD
    steps and its uploads added order by order. Same interface as the client-level layer's uploads.

    With `dp-target-epsilon` the target covers everything a client releases: the run's ledger hands
    this one a copy of itself whenever it changes (`record_ledger`), so `history` is a client's whole
    spending (DP-SGD steps, uploads and phase steps, taken or not), and a method asks `affordable`
    before it sends a request that would make a client release more; one that would pass the target
    is not sent (`withhold`): the client releases nothing more that depends on its data."""

    STREAM = 43  # keeps the upload noise's seeds apart from other seeded draws
    target_epsilon = 0.0  # 0: no target
    delta = 0.0
    known: dict[int, list[Entry]] | None = None  # the run ledger's copy (record_ledger)
    withheld: set[int] | None = None  # clients a request was withheld from by the target

    def __init__(self, *, upload_noise_multiplier: float, upload_clip_norm: float, seed: int,
                 target_epsilon: float = 0.0, delta: float = 0.0) -> None:
        self.upload_noise_multiplier = upload_noise_multiplier
        self.upload_clip_norm = upload_clip_norm
        self.seed = seed
        self.target_epsilon, self.delta = target_epsilon, delta
        self.known, self.withheld = {}, set()
        self.draws = 0  # upload instructions issued (each gets its own seed)
        self.pending: dict[int, int] = {}  # client -> noised records received, not yet taken
        self.uploads = 0  # noised upload records received
        # DP-SGD steps of a method phase outside the runner's train requests (an encoder's pretraining):
        # client -> entries not yet taken, and every entry charged here (the phase's own ledger)
        self.steps: dict[int, list[Entry]] = {}
        self.charged: dict[int, list[Entry]] = {}

    @classmethod
    def of(cls, cfg: RunConfig) -> UploadLedger | None:
        """The ledger of a `dp = 'sample'` run; None under any other mode."""
        if cfg.dp != "sample":
            return None
        return cls(upload_noise_multiplier=cfg.dp_upload_noise_multiplier,
                   upload_clip_norm=cfg.dp_upload_clip_norm, seed=cfg.seed,
                   target_epsilon=cfg.dp_target_epsilon, delta=cfg.dp_delta)

    def upload_instructions(self, records: list[str]) -> Any:
        """The `dp-upload` record of a request whose reply carries the non-model `records`."""
        self.draws += 1
        seed = 0
        for part in (self.seed, self.STREAM, self.draws):
            seed = (seed * 1_000_003 + int(part)) % (2**63 - 1)
        return UploadInstructions(noise_multiplier=self.upload_noise_multiplier,
                                  clip_norm=self.upload_clip_norm, records=records,
                                  seed=seed).config()

    def charge_uploads(self, clients: Iterable[int], records: int = 1) -> None:
        """Charge `records` noised upload records received from each of `clients`."""
        for client in clients:
            self.pending[int(client)] = self.pending.get(int(client), 0) + int(records)
            self.uploads += int(records)

    def charge_steps(self, client: int, entries: Iterable[Entry]) -> None:
        """Charge the DP-SGD steps a method phase's train reply reports (`PrivacyReport.entries`)."""
        entries = list(entries)
        self.steps[int(client)] = [*self.steps.get(int(client), []), *entries]
        self.charged[int(client)] = merged([*self.charged.get(int(client), []), *entries])

    def take(self) -> dict[int, list[Entry]]:
        """client -> the accounting entries of the uploads (and phase steps) charged since the last
        call."""
        taken = {client: list(entries) for client, entries in self.steps.items() if entries}
        for client, count in self.pending.items():
            if count > 0:
                taken[client] = [*taken.get(client, []),
                                 (self.upload_noise_multiplier / 2.0, 1.0, count)]
        self.pending, self.steps = {}, {}
        return taken

    def pending_entries(self, client: int) -> list[Entry]:
        """The entries charged to `client` and not yet taken (phase steps, then uploads)."""
        entries = list(self.steps.get(int(client), []))
        if self.pending.get(int(client), 0) > 0:
            entries.append((self.upload_noise_multiplier / 2.0, 1.0, self.pending[int(client)]))
        return entries

    def record_ledger(self, ledger: dict[int, list[Entry]]) -> None:
        """The run ledger as it now is (server_app/privacy.py hands it over after every change)."""
        self.known = {int(client): list(entries) for client, entries in ledger.items()}

    def history(self, client: int) -> list[Entry]:
        """Everything `client` has released so far: the run ledger's entries and those not taken."""
        return merged([*(self.known or {}).get(int(client), []), *self.pending_entries(client)])

    def affordable(self, client: int, records: int = 0, entries: Iterable[Entry] = ()) -> bool:
        """Whether `client` stays within the target after `records` more noised upload records and
        `entries` more steps (always, without a target)."""
        if self.target_epsilon <= 0:
            return True
        more = list(entries)
        if records > 0:
            more.append((self.upload_noise_multiplier / 2.0, 1.0, int(records)))
        return epsilon([*self.history(client), *more], self.delta) <= self.target_epsilon

    def withhold(self, client: int) -> bool:
        """Note that a request to `client` was withheld by the target; True the first time."""
        if self.withheld is None:
            self.withheld = set()
        first = int(client) not in self.withheld
        self.withheld.add(int(client))
        return first


# --- run-config checks ---------------------------------------------------------------------------
def check(cfg: RunConfig, modes: tuple[str, ...] = (), safeguard_method: bool = False,
          methods: tuple[str, ...] = (), refused: str = "") -> None:
    """Raise ValueError (one line naming the key and what is allowed) for DP settings that cannot
    hold: a method without the mode (`modes`: the method's `Method.privacy`; `methods`: those that
    support `cfg.dp`, for the message), the safeguard's choices on raw data beside DP-SGD, δ not
    below 1/n, a model with BatchNorm under DP-SGD."""
    if cfg.dp == "off":
        return
    if cfg.dp not in modes:
        why = f" ({refused})" if refused else ""
        raise ValueError(f"dp = '{cfg.dp}' is supported by methods {', '.join(methods)}; method "
                         f"'{cfg.method}' is not one of them{why} (see docs/privacy.md): set dp='off' "
                         "or choose one of those methods")
    if cfg.dp == "sample":
        if safeguard_method and cfg.safeguard != "off":  # the method's clients honour the safeguard
            raise ValueError(f"dp = 'sample' with safeguard = '{cfg.safeguard}': method "
                             f"'{cfg.method}''s safeguard chooses its mix on raw held-out data, "
                             "outside DP-SGD; set safeguard='off'")
        cap = cfg.max_samples_per_client
        if cap > 0 and cfg.dp_delta * cap >= 1.0:
            raise ValueError(f"dp-delta = {cfg.dp_delta:g} must be below 1/n, n a client's train "
                             f"samples (up to max-samples-per-client = {cap}): below {1.0 / cap:.3g}")
        layer = batch_norm_layer(cfg.model, cfg.dataset)
        if layer is not None:
            raise ValueError(batch_norm_message(cfg.model, *layer))
    else:
        if safeguard_method and cfg.safeguard != "off":
            raise ValueError(f"dp = 'client' with safeguard = '{cfg.safeguard}': method "
                             f"'{cfg.method}''s safeguard reports gains measured on raw held-out data, "
                             "which no noise covers and which steer every client's mix; set "
                             "safeguard='off'")
        if cfg.dp_delta * cfg.num_clients >= 1.0:
            raise ValueError(f"dp-delta = {cfg.dp_delta:g} must be below 1/num-clients = "
                             f"{1.0 / cfg.num_clients:.3g} under dp = 'client' (n is the number of "
                             "clients)")
        if cfg.aggregation != "mean":
            raise ValueError(f"dp = 'client' averages clipped updates with equal weights; "
                             f"aggregation = '{cfg.aggregation}' is not allowed with it: set "
                             "aggregation='mean'")


def batch_norm_message(model: str, layer: str, kind: str) -> str:
    return (f"dp = 'sample': model '{model}' has a {kind} layer '{layer}', which mixes the examples "
            "of a batch, so DP-SGD has no per-example gradient for it; use a model without "
            "BatchNorm (e.g. one with GroupNorm) or convert it with Opacus' ModuleValidator.fix")


def batch_norm_layer(model: str, dataset: str) -> tuple[str, str] | None:
    """(name, class) of the first BatchNorm layer of `model` built for `dataset` (built on the
    `meta` device: no memory, no time), None if it has none."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    from datasets.sources import SOURCE_INFO
    from models import build_model

    if dataset not in SOURCE_INFO:
        return None
    shape, classes = SOURCE_INFO[dataset]
    with torch.device("meta"):
        built = build_model(model, shape, classes)
    for name, module in built.named_modules():
        if isinstance(module, _BatchNorm):
            return name, type(module).__name__
    return None
