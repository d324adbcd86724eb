"""The shared pieces of every contract: the run-config error, the kebab-case settings base and the
ConfigRecord/MetricRecord schema base."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from flwr.app import ConfigRecord, MetricRecord
from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationInfo,
    field_validator,
)


class ConfigError(ValueError):
    """An invalid run configuration; the message is one line a user can act on."""


def kebab(name: str) -> str:
    """A field name as spelled on the wire and in the run config (`lambda_` → `lambda`)."""
    return name.rstrip("_").replace("_", "-")


class Settings(BaseModel):
    """Frozen, strict about unknown keys, spelled in kebab-case like Flower's run config."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=kebab, populate_by_name=True
    )


class MethodSettings(Settings):
    """A method's `<section>.*` run-config keys. `check(cfg)` holds rules that involve the common
    settings (called only when the method runs); counts bounded by num-clients are declared as the
    method's `limits` (`strategies.shared.method.Method`)."""

    def check(self, cfg: Any) -> None:
        """Raise ValueError (one actionable line) when these settings do not fit `cfg`."""


class GraphFileRule(MethodSettings):
    """Sections that read their client graph from `<section>.graph-file` when `graph='file'`."""

    section: ClassVar[str]

    @field_validator("graph_file", check_fields=False)
    @classmethod
    def _file_iff_graph_file(cls, value: str, info: ValidationInfo) -> str:
        graph, key = info.data.get("graph"), cls.section
        if graph == "file" and not value:
            raise ValueError(f"{key}.graph='file' needs a path: set {key}.graph-file to a .npy or "
                             ".csv adjacency matrix [num-clients, num-clients]")
        if value and graph not in (None, "file"):
            raise ValueError(f"a graph file is only read with {key}.graph='file' (got {key}.graph="
                             f"'{graph}'); set {key}.graph='file' or leave {key}.graph-file empty")
        return value


def allowed_keys(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


Contract = TypeVar("Contract", bound="Record")


class Record(Settings):
    """A ConfigRecord/MetricRecord schema: frozen, kebab-case keys, unknown keys rejected."""

    @classmethod
    def read(cls: type[Contract], record: Any) -> Contract:
        """Parse a received ConfigRecord or MetricRecord."""
        return cls.model_validate(dict(record))

    @classmethod
    def extending(cls: type[Contract], record: Any, **fields: Any) -> Contract:
        """This (extended) contract from a received or built record of its base plus `fields`."""
        return cls.model_validate({**dict(record), **fields})

    def values(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)

    def config(self) -> ConfigRecord:
        return ConfigRecord(self.values())

    def metrics(self) -> MetricRecord:
        return MetricRecord(self.values())
