"""Typed settings: `config/seedance.yaml`, then `SEEDANCE__SECTION__KEY=value` environment overrides.

Every section is a strict pydantic model: an unknown key is an error that names the key, a
malformed value an error that names the key and says what was expected. Each pipeline owns its
section's model (`seedance_tasks/<pipeline>/settings.py`); this module only assembles them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seedance_tasks.errors import ConfigError
from seedance_tasks.units import Duration

ENV_PREFIX = "SEEDANCE__"
CONFIG_ENV = "SEEDANCE_CONFIG"
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "config" / "seedance.yaml"


class StrictModel(BaseModel):
    """Base of every settings model: unknown keys are refused, values validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class S3Settings(StrictModel):
    endpoint_url: str | None = Field(
        None, description="S3-compatible endpoint (MinIO, Ceph); else AWS_ENDPOINT_URL or AWS itself"
    )
    region: str | None = Field(None, description="region; else the standard AWS chain's")
    aws_conn_id: str | None = Field(
        None, description="Airflow connection to take credentials from; else the standard AWS chain"
    )
    connect_timeout: Duration = Field(5, gt=0, description="seconds to wait for a TCP connection to the endpoint")
    request_timeout: Duration = Field(30, gt=0, description="seconds a request may go without receiving data")
    max_attempts: int = Field(4, ge=1, le=20, description="tries of each S3 request (standard retry mode, backoff)")


class StorageSettings(StrictModel):
    s3: S3Settings = S3Settings()
    trash_retention: Duration = Field(7 * 86400, description="age after which trash may be purged")
    lease_ttl: Duration = Field(
        600, gt=0, description="a writer's lease is taken over when its heartbeat is older than this"
    )


def _sections() -> dict[str, type[StrictModel]]:
    from seedance_tasks.checkpoint.settings import CheckpointSettings
    from seedance_tasks.compaction.settings import CompactionSettings
    from seedance_tasks.cost.settings import CostSettings
    from seedance_tasks.lifecycle.settings import LifecycleSettings
    from seedance_tasks.preprocess.settings import PreprocessSettings
    from seedance_tasks.shards.settings import ShardSettings
    from seedance_tasks.training.settings import TrainingSettings

    return {
        "storage": StorageSettings,
        "compaction": CompactionSettings,
        "shards": ShardSettings,
        "preprocess": PreprocessSettings,
        "checkpoint": CheckpointSettings,
        "lifecycle": LifecycleSettings,
        "training": TrainingSettings,
        "cost": CostSettings,
    }


@lru_cache(maxsize=1)
def _settings_model() -> type[StrictModel]:
    from pydantic import create_model

    fields: dict[str, Any] = {name: (model, model()) for name, model in _sections().items()}
    return create_model("Settings", __base__=StrictModel, **fields)


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = [part.lower() for part in key[len(ENV_PREFIX):].split("__") if part]
        if not path:
            continue
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment variable {key} conflicts with another override")
        try:
            node[path[-1]] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(
                f"environment variable {key} is not a valid YAML value ({problem}): {raw!r}",
                hint=f"fix or unset {key}: write a YAML value (256MiB, 3, true, [a, b]) and quote other text",
            ) from None
    return tree


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _describe(error: ValidationError, source: str) -> ConfigError:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"])
        if item["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'")
        else:
            lines.append(f"'{key}': {item['msg']} (got {item.get('input')!r})")
    return ConfigError(
        f"invalid settings in {source}: " + "; ".join(lines),
        hint="see config/seedance.yaml for every key and its default",
    )


_PARSED: dict[tuple, StrictModel] = {}


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None):
    """Settings from `path` (default: $SEEDANCE_CONFIG or config/seedance.yaml) plus env overrides.

    Raises ConfigError naming the key for unknown keys and malformed values. The file is parsed
    again only when it, the path or the SEEDANCE__* environment changes (training loops and
    stores ask often); each call returns its own copy.
    """
    environ = os.environ if environ is None else environ
    explicit = path is not None or bool(environ.get(CONFIG_ENV))
    source = Path(path or environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    try:
        stamp = source.stat().st_mtime_ns
    except OSError:
        stamp = None
    overrides = tuple(sorted((key, value) for key, value in environ.items() if key.startswith(ENV_PREFIX)))
    key = (str(source), explicit, stamp, overrides)
    if key not in _PARSED:
        _PARSED.clear()
        _PARSED[key] = _parse_settings(source, explicit, environ)
    return _PARSED[key].model_copy(deep=True)


def _parse_settings(source: Path, explicit: bool, environ: Mapping[str, str]):
    data: dict[str, Any] = {}
    if explicit or source.exists():
        try:
            loaded = yaml.safe_load(source.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {source}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {source} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {source} must hold a mapping of sections")
        data = loaded
    data = _merge(data, _env_overrides(environ))
    try:
        return _settings_model().model_validate(data)
    except ValidationError as exc:
        raise _describe(exc, f"{source} (+ {ENV_PREFIX}* environment)") from None


def settings_with(settings: StrictModel, section: str, **overrides: Any) -> StrictModel:
    """A copy of one settings section with `overrides` (None values ignored) validated in."""
    current = getattr(settings, section)
    values = {key: value for key, value in overrides.items() if value is not None}
    try:
        return type(current).model_validate({**current.model_dump(), **values})
    except ValidationError as exc:
        raise _describe(exc, "the command's options") from None
