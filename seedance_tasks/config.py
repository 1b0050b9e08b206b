"""Typed settings: `config/seedance.yaml`, then `SEEDANCE__SECTION__KEY=value` environment overrides.

Every section is a strict pydantic model: an unknown key is an error that names the key, a
malformed value an error that names the key and says what was expected. Each pipeline owns its
section's model (`seedance_tasks/<pipeline>/settings.py`, named in `SECTIONS` and imported only
when that section is asked for); this module only assembles them.

- `load_settings()`: every section, validated (the CLI's and the demo's edge).
- `load_section(name)`: one section only (storage asks for `storage` on every `s3://` URI: it
  must not import and build every pipeline's model).
- `section_with(section, overrides)`: a section with per-run/per-command overrides validated in.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from seedance_tasks.errors import YAML_HINT, ConfigError, yaml_problem
from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import Duration

ENV_PREFIX = "SEEDANCE__"
CONFIG_ENV = "SEEDANCE_CONFIG"
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "config" / "seedance.yaml"


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


SECTIONS: dict[str, str] = {
    "storage": "seedance_tasks.config:StorageSettings",
    "compaction": "seedance_tasks.compaction.settings:CompactionSettings",
    "shards": "seedance_tasks.shards.settings:ShardSettings",
    "preprocess": "seedance_tasks.preprocess.settings:PreprocessSettings",
    "checkpoint": "seedance_tasks.checkpoint.settings:CheckpointSettings",
    "lifecycle": "seedance_tasks.lifecycle.settings:LifecycleSettings",
    "training": "seedance_tasks.training.settings:TrainingSettings",
    "telemetry": "seedance_tasks.telemetry.settings:TelemetrySettings",
    "cost": "seedance_tasks.cost.settings:CostSettings",
    "signals": "seedance_tasks.signals.settings:SignalsSettings",
    "notifications": "seedance_tasks.notifiers:NotificationSettings",
}
"""Each section of `config/seedance.yaml` and its model (`module:Class`, imported on first use)."""


@cache
def section_model(name: str) -> type[StrictModel]:
    """The settings model of section `name` (imports only that section's module)."""
    if name not in SECTIONS:
        raise ConfigError(f"unknown settings section '{name}'", hint="sections: " + ", ".join(SECTIONS))
    module, _, attr = SECTIONS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def _sections() -> dict[str, type[StrictModel]]:
    return {name: section_model(name) for name in SECTIONS}


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


CONFIG_HINT = "see config/seedance.yaml for every key and its default"


def _describe(error: ValidationError, source: str, prefix: str | None = None,
              names: Mapping[str, str] | None = None, hint: str = CONFIG_HINT) -> ConfigError:
    lines = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"]]
        if names and loc and loc[0] in names:
            loc[0] = names[loc[0]]
        key = ".".join([prefix, *loc] if prefix else loc)
        if item["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'")
        elif not key:  # a check across keys (e.g. small_file_size <= target_file_size)
            lines.append(item["msg"].removeprefix("Value error, "))
        else:
            lines.append(f"'{key}': {item['msg']}{_shown_input(key, item.get('input'))}")
    return ConfigError(f"invalid settings in {source}: " + "; ".join(lines), hint=hint)


_SECRET_KEY = re.compile(r"(?i)password|secret|token|webhook|credential|key_id|access_key")


def _shown_input(key: str, value: Any) -> str:
    """` (got 'x')` for a scalar value; nothing for a whole section or list (it may hold secrets and
    says less than the message) or for a key whose name says it is a secret."""
    if isinstance(value, dict | list) or _SECRET_KEY.search(key):
        return ""
    text = repr(value)
    return f" (got {text[:80] + '...' if len(text) > 80 else text})"


_PARSED: dict[tuple, StrictModel] = {}
_RAW: dict[tuple, dict[str, Any]] = {}
_SECTION_CACHE: dict[tuple, StrictModel] = {}


def _source(path: str | Path | None, environ: Mapping[str, str]) -> tuple[Path, bool, tuple]:
    """The config file, whether it was named explicitly, and the cache key of file + environment."""
    explicit = path is not None or bool(environ.get(CONFIG_ENV))
    source = Path(path or environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    try:
        stamp = source.stat().st_mtime_ns
    except OSError:
        stamp = None
    overrides = tuple(sorted((key, value) for key, value in environ.items() if key.startswith(ENV_PREFIX)))
    return source, explicit, (str(source), explicit, stamp, overrides)


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None):
    """Settings from `path` (default: $SEEDANCE_CONFIG or config/seedance.yaml) plus env overrides.

    Raises ConfigError naming the key for unknown keys and malformed values. The file is parsed
    again only when it, the path or the SEEDANCE__* environment changes (training loops and
    stores ask often); each call returns its own copy.
    """
    environ = os.environ if environ is None else environ
    source, _, key = _source(path, environ)
    if key not in _PARSED:
        _PARSED.clear()
        try:
            _PARSED[key] = _settings_model().model_validate(_raw(path, environ))
        except ValidationError as exc:
            raise _describe(exc, f"{source} (+ {ENV_PREFIX}* environment)") from None
    return _PARSED[key].model_copy(deep=True)


def load_section(name: str, path: str | Path | None = None, environ: Mapping[str, str] | None = None):
    """Section `name` of the settings (same sources and errors as `load_settings`), validating
    and importing only that section's model; unknown section names in the file are still errors.
    Cached like `load_settings`; each call returns its own copy."""
    environ = os.environ if environ is None else environ
    source, _, key = _source(path, environ)
    cache_key = (name, *key)
    if cache_key not in _SECTION_CACHE:
        if len(_SECTION_CACHE) > 64:
            _SECTION_CACHE.clear()
        model = section_model(name)
        data = _raw(path, environ).get(name)
        try:
            _SECTION_CACHE[cache_key] = model.model_validate({} if data is None else data)
        except ValidationError as exc:
            raise _describe(exc, f"{source} (+ {ENV_PREFIX}* environment)", prefix=name) from None
    return _SECTION_CACHE[cache_key].model_copy(deep=True)


def _raw(path: str | Path | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """The file's mapping merged with the environment overrides (cached); unknown sections refused."""
    source, explicit, key = _source(path, environ)
    if key not in _RAW:
        _RAW.clear()
        data = _read_file(source, explicit)
        data = _merge(data, _env_overrides(environ))
        unknown = [name for name in data if name not in SECTIONS]
        if unknown:
            raise ConfigError(
                f"invalid settings in {source} (+ {ENV_PREFIX}* environment): "
                + "; ".join(f"unknown key '{name}'" for name in unknown),
                hint="see config/seedance.yaml for every key and its default",
            )
        _RAW[key] = data
    return _RAW[key]


def _read_file(source: Path, explicit: bool) -> dict[str, Any]:
    if not (explicit or source.exists()):
        return {}
    try:
        loaded = yaml.safe_load(source.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {source}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {source} is not valid YAML: {yaml_problem(exc)}", hint=YAML_HINT) from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {source} must hold a mapping of sections")
    return loaded


def settings_with(settings: StrictModel, section: str, **overrides: Any) -> StrictModel:
    """A copy of one settings section with `overrides` (None values ignored) validated in."""
    return section_with(getattr(settings, section), overrides)


def section_with(current: StrictModel, overrides: Mapping[str, Any], source: str = "the command's options",
                 names: Mapping[str, str] | None = None) -> StrictModel:
    """A copy of the section `current` with `overrides` (None and "" ignored) validated in.

    A bad value raises ConfigError naming it as `names[key]` (e.g. the DAG param) when given.
    """
    values = {key: value for key, value in overrides.items() if value is not None and value != ""}
    try:
        return type(current).model_validate({**current.model_dump(), **values})
    except ValidationError as exc:
        hint = ("fix that value in the run's form (or its conf)" if names else
                "fix that option (--help lists every option; config/seedance.yaml has the defaults)")
        raise _describe(exc, source, names=names, hint=hint) from None
