"""The run configuration: one typed, frozen `RunConfig` built from Flower's flat `run_config`.

Flower hands the app a flat mapping (`num-rounds`, `<section>.<key>`, ...). Keys without a dot are common
settings; `<section>.<key>` keys belong to a method's settings section, which the method declares in
the registry. Every value is validated here, before any client is contacted, and a problem is
reported as one line naming the key, the value and what is allowed. Both halves use it: the server to
run, every client to rebuild the same settings from the run config.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from datasets.federated import DataSpec
from datasets.partition import PARTITION_SCHEMES, PartitionSpec
from datasets.sources import SOURCE_NAMES, TEXT_SOURCES, dataset_task
from models import MODEL_NAMES, SEQUENCE_MODELS, TEXT_MODELS
from strategies.shared.client_matrix import DEFAULT_MMAP_BYTES
from strategies.shared import registry
from strategies.shared.settings import (
    ConfigError,
    MethodSettings,
    Settings,
    allowed_keys,
    kebab,
)

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"  # the app's defaults
_CHOICES = {"dataset": SOURCE_NAMES, "partition": PARTITION_SCHEMES, "model": MODEL_NAMES}


def describe(err: ValidationError, given: Mapping[str, Any], prefix: str = "") -> str:
    """Pydantic's first error as: run config: key 'k' = v is invalid: <what is allowed>."""
    first = err.errors()[0]
    loc = [str(part) for part in first["loc"]]
    key = prefix + ".".join(loc) if loc else "(config)"
    if not loc:
        return f"run config: {first['msg'].removeprefix('Value error, ')}"
    value: Any = given
    for part in loc:
        value = value.get(part) if isinstance(value, Mapping) else None
    message = first["msg"].removeprefix("Value error, ")
    return f"run config: key '{key}' = {value!r} is invalid: {message}"


class RunConfig(Settings):
    """Every setting of a Bouquet run (see pyproject.toml `[tool.flwr.app.config]` for defaults).

    The common settings are fields; each registered method's settings are one more attribute named
    by its section (`cfg.<section>`), validated by the method's own `MethodSettings`.
    """

    model_config = ConfigDict(frozen=True, extra="allow", alias_generator=kebab,
                              populate_by_name=True)

    method: str = Field(default_factory=registry.default_method)  # the one registered with default=True
    dataset: str = "mnist"
    data_root: str | None = None
    partition: str = "label-clusters"
    num_clients: int = Field(10, ge=1)
    num_rounds: int = Field(5, ge=1)
    fraction_train: float = Field(1.0, gt=0.0, le=1.0)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.05, gt=0.0)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int = Field(0, ge=0)
    model: str = "mlp"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    run_name: str = ""
    output_dir: str = "outputs"
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    max_samples_per_client: int = Field(300, ge=0)
    shards_per_client: int = Field(2, ge=1)
    dirichlet_alpha: float = Field(0.5, gt=0.0)
    num_clusters: int = Field(5, ge=1)
    labels_per_cluster: int = Field(2, ge=1)
    power_law: bool = False
    domain_rotations: str = "0,90,180,270"
    domain_test_clients: float = Field(0.0, ge=0.0, lt=1.0)  # domains: share of whole test clients
    domain_unseen_rotations: str = ""  # domains: angles only the held-out test clients see
    domain_family: Literal["rotations", "styles"] = "rotations"  # domains: what makes a domain
    domain_styles: str = "plain,inverted,noisy,thick"  # domains, family styles: the train domains
    domain_unseen_styles: str = ""  # domains, family styles: styles only held-out test clients see
    domains_per_client: int = Field(1, ge=1)  # domains: k domains per train client (images split)
    eval_every: int = Field(1, ge=1)
    # send round r's evaluation with round r + 1's train message (one phase per round); false: a
    # separate evaluate phase after each evaluated round (strategies/shared/fusion.py)
    fuse_evaluate: bool = True
    finetune_epochs: int = Field(1, ge=0)
    # graph methods: each client mixes the received model with its own last trained one, the weight
    # chosen on a held-out slice of its train split (client_app/safeguard.py); off = the paper's
    safeguard: Literal["mix", "off"] = "mix"
    safeguard_holdout: float = Field(0.1, gt=0.0, lt=0.5)  # the held-out share of the train split
    safeguard_grid: int = Field(5, ge=2, le=21)  # mixing weights tested per received model
    # where a method hands every client the federation's consensus model, a client leaves the
    # federation's weight (pooled by the server from every client's held-out gains, each weight of
    # the grid at the threshold where the best of them passes on noise as often as one test does at
    # this margin) only if its own best mix is this many standard errors better on its held-out slice
    # (0: any gain)
    safeguard_margin: float = Field(1.0, ge=0.0, le=10.0)
    # where a method hands every client the consensus (with safeguard-margin > 0), the model a client
    # sends is also trained on its held-out slice, so the consensus is trained on every sample, and
    # the client scores with the consensus less its own update
    safeguard_send_slice: bool = True
    # where a method hands every client the consensus (with safeguard-margin > 0), where a sampled
    # client's training starts: `consensus`, the consensus itself as under FedAvg (the client keeps
    # as its own model the better on its slice of its own and the trained one); `mix`, its chosen
    # mix; `federation`, the consensus until the clients' own models are clearly better (pooled
    # since the start) than the models trained from it, then the mix for the rest of the run
    safeguard_start: Literal["federation", "consensus", "mix"] = "federation"
    # where a sampled client trains from its chosen mix (every graph method; on the consensus path
    # once `safeguard-start` lets it): true, it trains from its own model instead unless the chosen
    # mix is clearly better (`safeguard-margin`, > 0) than it on its slice; false, from the mix
    safeguard_own_start: bool = True
    # where a method hands every client the consensus (with safeguard-margin > 0) and the evaluation
    # fine-tunes, which answer a client gives without clear evidence of its own: `client`, its mix
    # unless the fine-tuned mix is clearly better on its slice; `federation`, whichever of the two
    # the clients' held-out gains of fine-tuned over mix, pooled over every client and evaluation
    # since the start, favour (the mix while they are not above zero), leaving it only where the
    # other is clearly better on the client's slice (measured: it follows noise where the two
    # answers are close, docs/no-regret.md)
    safeguard_finetune: Literal["client", "federation"] = "client"
    # how a client's local update over the train split less its held-out slice is batched:
    # `whole-split`, the batches an epoch over the whole split makes, each less its held-out
    # samples (the slice costs samples, not steps: the steps of training alone); `slice-free`, the
    # batches of that part (fewer steps, and a short last one)
    safeguard_batches: Literal["whole-split", "slice-free"] = "whole-split"
    # differential privacy (docs/privacy.md): `sample`, DP-SGD in every client's local training
    # (per-example clipping and Gaussian noise); `client`, each client's update clipped and Gaussian
    # noise on each aggregate the server forms; `off`, none
    dp: Literal["off", "sample", "client"] = "off"
    dp_noise_multiplier: float = Field(1.0, gt=0.0)  # σ: the noise's std over the clipping norm
    dp_max_grad_norm: float = Field(1.0, gt=0.0)  # dp='sample': each example's gradient clipped to this
    dp_clip_norm: float = Field(1.0, gt=0.0)  # dp='client': each client's update clipped to this
    # dp='client' (and dp='sample' for the methods whose uploads it noises), methods whose clients upload more than models
    # (docs/privacy.md): each such upload record clipped on the client to this L2 norm
    dp_upload_clip_norm: float = Field(1.0, gt=0.0)
    # dp='client' (and those methods under 'sample'): σ of those uploads' Gaussian noise (std σ × dp-upload-clip-norm)
    dp_upload_noise_multiplier: float = Field(1.0, gt=0.0)
    dp_delta: float = Field(1e-5, gt=0.0, lt=1.0)  # the δ of the reported (ε, δ); below 1/n
    # training stops where one more step would take ε above this (0: no target, ε only reported)
    dp_target_epsilon: float = Field(0.0, ge=0.0)
    # secure aggregation (docs/privacy.md): `secagg+`, Flower's SecAgg+ protocol, so the server learns
    # only the sum of the sampled clients' models (methods whose server needs only a sum); `off`, none
    secure_aggregation: Literal["off", "secagg+"] = "off"
    # secure-aggregation: each client's secrets are shared with this many clients, itself included (0:
    # every client sampled in the round)
    secagg_num_shares: int = Field(0, ge=0)
    # secure-aggregation: shares that rebuild a secret (0: a majority of secagg-num-shares)
    secagg_reconstruction_threshold: int = Field(0, ge=0)
    # secure-aggregation: every model value is clipped to ± this before quantization
    secagg_clipping_range: float = Field(8.0, gt=0.0)
    # secure-aggregation: the integers [0, this) each clipped value is quantized to
    secagg_quantization_range: int = Field(2**22, ge=2, le=2**30)
    round_timeout: float = Field(600.0, gt=0.0)
    max_update_norm: float = Field(10000.0, ge=0.0)  # drop replies whose model moved further (0 = off)
    aggregation: Literal["mean", "median", "trimmed-mean"] = "mean"  # the global part's rule
    trim_fraction: float = Field(0.2, ge=0.0, lt=0.5)  # aggregation='trimmed-mean': cut per side
    resume: bool = False  # continue run-name from its newest valid checkpoint
    checkpoint_every: int = Field(1, ge=0)  # checkpoint after every n-th round (and the last; 0 = off)
    # how many of the newest checkpoints a run keeps (older ones are deleted once a new one is safely
    # written); 2 or more: resume can fall back to the one before a newest checkpoint that is corrupt
    keep_checkpoints: int = Field(1, ge=1)
    client_threads: int = Field(0, ge=0)
    # a per-client server matrix (V [num_clients, P], a method's own [N, P] ones) larger than this many
    # bytes is kept in a memory-mapped file in the run's output directory
    # (strategies/shared/client_matrix.py; 0 = always)
    client_matrix_mmap_bytes: int = Field(DEFAULT_MMAP_BYTES, ge=0)
    traffic_days: int = Field(0, ge=0)  # traffic: days of the series (0 = all; traffic-synthetic: 14)
    # the names of the model's classes 0..n-1, in this order (comma-separated; empty: "0".."n-1"): a
    # node's own data (node_config data-dir) names its classes by them (datasets/local.py)
    class_names: str = ""
    # a simulation on one machine over one's own federated data: a folder with one subfolder per
    # client (datasets/local.py layouts), read only by the clients; each simulated SuperNode hosts
    # the subfolders at its partition slot (sorted position mod num-partitions). A SuperNode's own
    # node_config data-dir wins (a deployment); empty: the built-in data set and partition
    data_dir: str = ""

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        return _one_of(value, registry.method_names())  # the registry is the source of truth

    @field_validator("dataset", "partition", "model")
    @classmethod
    def _known_choice(cls, value: str, info: ValidationInfo) -> str:
        return _one_of(value, _CHOICES[info.field_name])

    @field_validator("data_root", mode="before")
    @classmethod
    def _empty_root_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("domain_rotations")
    @classmethod
    def _rotation_list(cls, value: str) -> str:
        try:
            angles = [float(part) for part in value.split(",")]
        except ValueError:
            raise ValueError("must be comma-separated angles in degrees, e.g. '0,90,180,270'") from None
        if not angles:
            raise ValueError("must list at least one angle")
        return value

    @field_validator("domain_unseen_rotations", mode="before")
    @classmethod
    def _one_angle_is_a_list(cls, value: Any) -> Any:
        """`domain-unseen-rotations=45` arrives as a number; it means the list '45'."""
        return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    @field_validator("domain_unseen_rotations")
    @classmethod
    def _unseen_rotation_list(cls, value: str) -> str:
        if value.strip():
            try:
                [float(part) for part in value.split(",")]
            except ValueError:
                raise ValueError("must be empty or comma-separated angles in degrees, e.g. '45'") from None
        return value

    @field_validator("domain_styles", "domain_unseen_styles")
    @classmethod
    def _style_list(cls, value: str, info: ValidationInfo) -> str:
        from datasets.domains import STYLES

        for name in cls._names(value):
            if name not in STYLES:
                raise ValueError(f"unknown style {name!r}; allowed styles: {', '.join(STYLES)}")
        if info.field_name == "domain_styles" and not cls._names(value):
            raise ValueError(f"must list at least one style of {', '.join(STYLES)}")
        return value

    @staticmethod
    def _names(text: str) -> tuple[str, ...]:
        return tuple(part.strip() for part in text.split(",") if part.strip())

    @model_validator(mode="after")
    def _held_out_domains(self) -> RunConfig:
        if self.domain_test_clients > 0 and self.partition != "domains":
            raise ValueError(f"domain-test-clients = {self.domain_test_clients} holds out whole test "
                             f"clients of partition 'domains' only (got partition '{self.partition}')")
        if self.domain_unseen_rotations.strip() and self.domain_test_clients <= 0:
            raise ValueError("domain-unseen-rotations needs held-out test clients: set "
                             "domain-test-clients > 0 (e.g. 0.2)")
        if self.domain_unseen_styles.strip() and self.domain_test_clients <= 0:
            raise ValueError("domain-unseen-styles needs held-out test clients: set "
                             "domain-test-clients > 0 (e.g. 0.2)")
        seen = self.data_spec.partition.num_seen_domains
        if self.partition == "domains" and self.domains_per_client > seen:
            raise ValueError(f"domains-per-client = {self.domains_per_client} exceeds the {seen} seen "
                             f"domains of family '{self.domain_family}'; lower it or list more domains")
        return self

    @model_validator(mode="before")
    @classmethod
    def _method_sections(cls, data: Any) -> Any:
        """Validate each registered section (`<section>.*` keys) with its method's settings model;
        a section left out gets its defaults. Any other unknown key is an error naming the allowed
        ones."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        sections = registry.sections()
        common = allowed_keys(cls)
        known = {*common, *cls.model_fields, *sections}
        unknown = [key for key in data if key not in known]
        if unknown:
            given = data[unknown[0]]
            key = (f"{unknown[0]}.{next(iter(given))}" if isinstance(given, Mapping) and given
                   else unknown[0])  # `sfll.hops` arrives as {'sfll': {'hops': ...}}
            raise ValueError(unknown_key_message(key))
        for section, model in sections.items():
            given = data.get(section, {})
            if isinstance(given, model):
                continue
            if not isinstance(given, Mapping):
                raise ValueError(f"'{section}' holds the {section}.* keys, not a value: {given!r}")
            try:
                data[section] = model.model_validate(given)
            except ValidationError as err:
                first = err.errors()[0]
                if first["type"] == "extra_forbidden":
                    raise ValueError(unknown_key_message(f"{section}.{first['loc'][0]}")) from None
                raise ValueError(describe(err, given, f"{section}.").removeprefix("run config: "))\
                    from None
        return data

    def section(self, name: str) -> MethodSettings:
        """The settings of section `name` (a registered method's)."""
        return getattr(self, name)

    @model_validator(mode="after")
    def _method_fits(self) -> RunConfig:
        """The running method's own cross-field rules (`MethodSettings.check`)."""
        method = registry.METHODS[self.method]
        if method.section:
            self.section(method.section).check(self)
        return self

    @model_validator(mode="after")
    def _clients_per_round(self) -> RunConfig:
        if int(self.fraction_train * self.num_clients) < 1:
            raise ValueError(
                f"fraction-train × num-clients = {self.fraction_train} × {self.num_clients} "
                "selects no client; raise fraction-train or num-clients"
            )
        return self

    @model_validator(mode="after")
    def _settings_fit_together(self) -> RunConfig:
        """Cross-field rules: values that are valid alone but not together. A per-client count that
        must stay below num-clients (kNN k, cluster counts) is capped when left at its default and
        an error when set explicitly."""
        from datasets.sources import SOURCE_INFO

        if self.resume and not self.run_name:
            raise ValueError("resume=true needs run-name (and output-dir) of the run to continue; "
                             "a run without run-name gets a new timestamped directory")
        if self.partition == "domains" and self.domain_family == "rotations" and len(self.rotations) < 2:
            raise ValueError(f"partition 'domains' needs at least 2 domains, but domain-rotations="
                             f"'{self.domain_rotations}' lists {len(self.rotations)}; list two or "
                             "more angles, e.g. '0,90,180,270'")
        if self.partition == "domains" and self.domain_family == "styles" and len(self._names(
                self.domain_styles)) < 2:
            raise ValueError(f"partition 'domains' needs at least 2 domains, but domain-styles="
                             f"'{self.domain_styles}' lists fewer; list two or more styles, e.g. "
                             "'plain,inverted,noisy,thick'")
        if self.partition == "label-clusters" and self.dataset in SOURCE_INFO:
            classes = SOURCE_INFO[self.dataset][1]
            if self.num_clusters * self.labels_per_cluster > classes:
                raise ValueError(
                    f"num-clusters × labels-per-cluster = {self.num_clusters} × "
                    f"{self.labels_per_cluster} exceeds the {classes} classes of '{self.dataset}'; "
                    "lower one of them")
            explicit = self.num_clusters != type(self).model_fields["num_clusters"].default
            if self.num_clusters > self.num_clients and explicit:  # a default is capped
                raise ValueError(f"num-clusters = {self.num_clusters} exceeds num-clients = "
                                 f"{self.num_clients}; every cluster needs a client")
        if self.aggregation != "mean":
            robust = registry.robust_methods()
            if self.method not in robust:
                raise ValueError(
                    f"aggregation='{self.aggregation}' applies to the global part of "
                    f"{', '.join(robust)}; method '{self.method}' aggregates over a client "
                    "graph or clusters: set aggregation='mean'")
        method = registry.METHODS[self.method]
        for field, counts in method.limits.items():
            section = self.section(method.section)
            value = getattr(section, field)
            default = type(section).model_fields[field].default
            limit = self.num_clients if counts == "clients" else self.num_clients - 1
            if value != default and value > limit:
                key = f"{method.section}.{kebab(field)}"
                raise ValueError(f"{key} = {value} must be at most {limit} with num-clients = "
                                 f"{self.num_clients}; lower {key} or raise num-clients")
        return self

    @model_validator(mode="after")
    def _privacy_fits(self) -> RunConfig:
        """Differential privacy's rules (strategies/shared/privacy.py `check`)."""
        if self.dp != "off":
            from strategies.shared.privacy import check

            method = registry.METHODS[self.method]
            check(self, method.privacy, method.safeguard,
                  tuple(m.name for m in registry.METHODS.values() if self.dp in m.privacy),
                  method.privacy_refused)
        if self.secure_aggregation != "off":
            from strategies.shared.secure_aggregation import check as check_secure

            check_secure(self, [n for n, m in registry.METHODS.items() if m.secure_aggregation])
        return self

    @model_validator(mode="after")
    def _class_names_fit(self) -> RunConfig:
        from datasets.sources import SOURCE_INFO

        names = self._names(self.class_names)
        if not names:
            return self
        if dataset_task(self.dataset) != "classification":
            raise ValueError(f"class-names = '{self.class_names}' names classes, but dataset "
                             f"'{self.dataset}' is regression; leave class-names empty")
        classes = SOURCE_INFO[self.dataset][1]
        if len(set(names)) != len(names) or len(names) > classes:
            raise ValueError(f"class-names = '{self.class_names}' must list distinct names, at most "
                             f"the {classes} classes of dataset '{self.dataset}'")
        return self

    @model_validator(mode="after")
    def _task_fits(self) -> RunConfig:
        """Traffic (regression) data sets need partition 'sensors' and a sequence model, and only they
        take them."""
        traffic = dataset_task(self.dataset) == "regression"
        if traffic and self.partition != "sensors":
            raise ValueError(f"dataset '{self.dataset}' is traffic (one client per sensor): set "
                             f"partition='sensors' (got '{self.partition}')")
        if not traffic and self.partition == "sensors":
            raise ValueError(f"partition 'sensors' is for the traffic data sets; dataset '{self.dataset}' "
                             "takes iid, dirichlet, shards, label-clusters, domains or natural")
        text = self.dataset in TEXT_SOURCES  # token windows (next character), not images
        kind = "traffic" if traffic else "text" if text else "image"
        if kind != ("traffic" if self.model in SEQUENCE_MODELS else "text" if self.model in TEXT_MODELS
                    else "image"):
            allowed = (SEQUENCE_MODELS if traffic else TEXT_MODELS if text else
                       tuple(m for m in MODEL_NAMES if m not in SEQUENCE_MODELS + TEXT_MODELS))
            raise ValueError(f"model '{self.model}' does not fit dataset '{self.dataset}'; allowed models: "
                             f"{', '.join(allowed)}")
        if text and self.partition == "domains":
            raise ValueError(f"partition 'domains' transforms images; dataset '{self.dataset}' is text: "
                             "use natural (one client per LEAF user), iid or dirichlet")
        return self

    @model_validator(mode="after")
    def _torchvision_present(self) -> RunConfig:
        """MobileNet-v2 and rotations by angles that are not multiples of 90 degrees come from
        torchvision, which the CPU app image (docker/superexec.Dockerfile, TORCH=cpu) leaves out."""
        import importlib.util

        needs = ("model 'mobilenet-v2'" if self.model == "mobilenet-v2" else
                 "partition 'domains' with rotations that are not multiples of 90 degrees"
                 if self.partition == "domains" and self.domain_family == "rotations"
                 and any(float(a) % 90 for a in self.rotations + self.unseen_rotations) else "")
        if needs and importlib.util.find_spec("torchvision") is None:
            from importlib.metadata import version
            raise ValueError(
                f"{needs} needs torchvision, which is not installed here (the CPU image "
                f"bouquet-superexec:{version('flwr')}-cpu has none): run it on the CUDA image "
                f"bouquet-superexec:{version('flwr')}-cuda (BOUQUET_TORCH=cuda, docs/deploy-compose.md) "
                "or `pip install torchvision`")
        return self

    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any]) -> RunConfig:
        """Validate Flower's flat run config; raise `ConfigError` with one actionable line."""
        nested: dict[str, Any] = {}
        for key, value in run_config.items():
            section, dot, name = key.partition(".")
            if dot:
                nested.setdefault(section, {})[name] = value
            else:
                nested[key] = value
        try:
            return cls.model_validate(nested)
        except ValidationError as err:
            raise ConfigError(describe(err, nested)) from None

    @cached_property
    def rotations(self) -> tuple[float, ...]:
        return tuple(float(part) for part in self.domain_rotations.split(","))

    @cached_property
    def unseen_rotations(self) -> tuple[float, ...]:
        text = self.domain_unseen_rotations.strip()
        return tuple(float(part) for part in text.split(",")) if text else ()

    @cached_property
    def data_spec(self) -> DataSpec:
        """What a client needs to load its partition: dataset, root and the partition parameters."""
        return DataSpec(
            dataset=self.dataset,
            data_root=self.data_root,
            traffic_days=self.traffic_days,
            partition=PartitionSpec(
                scheme=self.partition,
                num_clients=self.num_clients,
                seed=self.seed,
                test_fraction=self.test_fraction,
                alpha=self.dirichlet_alpha,
                shards_per_client=self.shards_per_client,
                num_clusters=min(self.num_clusters, self.num_clients),  # capped default (checked above)
                labels_per_cluster=self.labels_per_cluster,
                power_law=self.power_law,
                rotations=self.rotations,
                max_samples_per_client=self.max_samples_per_client,
                test_clients=self.domain_test_clients,
                unseen_rotations=self.unseen_rotations,
                family=self.domain_family,
                styles=self._names(self.domain_styles),
                unseen_styles=self._names(self.domain_unseen_styles),
                domains_per_client=self.domains_per_client,
            ),
        )

    def flat(self) -> dict[str, Any]:
        """The config as Flower-style flat keys (for `config.json` and reproduction)."""
        out: dict[str, Any] = {}
        for key, value in self.model_dump(by_alias=True).items():
            if isinstance(value, dict):
                out.update({f"{key}.{name}": item for name, item in value.items()})
            else:
                out[key] = value
        return out


def run_config_keys() -> list[str]:
    """Every run-config key in Flower's flat spelling: the common keys, then `<section>.<key>`."""
    keys = allowed_keys(RunConfig)
    for section, model in registry.sections().items():
        keys += [f"{section}.{key}" for key in allowed_keys(model)]
    return keys


def nearest_keys(key: str, keys: Iterable[str] | None = None) -> list[str]:
    """The valid keys closest in spelling to `key`, best first: at most three, each about as close
    as the best (`num-round` gives `num-rounds` alone, not every key that shares letters with it)."""
    keys = list(run_config_keys() if keys is None else keys)
    near = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    section, dot, name = key.partition(".")
    if dot and not near:  # a key of a known section spelled far off: compare within the section
        inside = [k.partition(".")[2] for k in keys if k.startswith(section + ".")]
        near = [f"{section}.{k}" for k in difflib.get_close_matches(name, inside, n=3, cutoff=0.4)]
    if not near:
        return []
    ratio = [difflib.SequenceMatcher(None, key, k).ratio() for k in near]
    return [k for k, r in zip(near, ratio) if r >= max(ratio) - 0.1]


def unknown_key_message(key: str) -> str:
    """One line for an unknown run-config key: the nearest valid keys, else where the keys are."""
    near = nearest_keys(key)
    hint = f"did you mean {' or '.join(repr(k) for k in near)}?" if near else ""
    section, dot, _ = key.partition(".")
    sections = registry.sections()
    if dot and section not in sections:
        return (f"unknown key '{key}': there is no settings section '{section}'; "
                + (hint or f"the sections are {', '.join(sections)}"))
    if hint:
        return f"unknown key '{key}'; {hint}"
    if dot:
        return (f"unknown key '{key}'; the keys of section '{section}' are "
                f"{', '.join(allowed_keys(sections[section]))}")
    return (f"unknown key '{key}'; the common keys are {', '.join(allowed_keys(RunConfig))} "
            "(and <section>.<key> for a method's settings)")


def _one_of(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"allowed values are {', '.join(repr(a) for a in allowed)}")
    return value


def flat_keys(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """TOML's dotted keys (`a.k = 2` → {"a": {"k": 2}}) back to run-config keys (`a.k`), the
    way Flower flattens a run config."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            flat.update(flat_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def default_run_config() -> dict[str, Any]:
    """The run config defaults of pyproject.toml, flattened the way Flower flattens them."""
    return flat_keys(tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"])
