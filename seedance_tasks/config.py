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

import difflib
import importlib
import inspect
import os
import re
from collections.abc import Mapping
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, Field, ValidationError

from seedance_tasks.boundary import first_line
from seedance_tasks.errors import YAML_HINT, ConfigError, yaml_problem
from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import Duration, quoted

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
    lease_ttl: Duration = Field(  # at most lease.MAX_TTL_S: a lease record claiming more is refused as damaged
        600, gt=0, le=7 * 86400,
        description="a writer's lease is taken over when its heartbeat is older than this (at most 7d)",
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


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader (no tags that build Python objects) that also refuses a key given
    twice in one mapping: YAML would silently keep the last one and drop the first."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges on purpose: the keys given next to it win
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key '{key}' is given twice (first on line {seen[key].start_mark.line + 1})",
                        key_node.start_mark)
                seen[key] = key_node
        return super().construct_mapping(node, deep)

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except ValueError as exc:  # 2026-02-30 has a date's shape, not a date's values; an int of 5000 digits
            what = {"timestamp": "a date", "int": "an integer", "float": "a number"}.get(node.tag.rpartition(":")[2],
                                                                                       "a value")
            raise yaml.constructor.ConstructorError(
                None, None, f"not {what}: {quoted(str(node.value))} ({first_line(str(exc), 80)})", node.start_mark,
            ) from None


MAX_YAML_NODES = 100_000
"""The most values a settings document may expand to, its aliases counted every time they are
used: a real config holds a few hundred, an alias bomb ("billion laughs") billions."""


def load_yaml(text: str) -> Any:
    """The value of the YAML document `text`, safely: no Python objects are constructed (tags like
    `!!python/object` are refused), a key given twice in one mapping is refused, and so is a
    document whose aliases expand past `MAX_YAML_NODES` values or refer to themselves.
    Every refusal is a `yaml.YAMLError` saying where (`errors.yaml_problem`)."""
    loader = _StrictLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise yaml.YAMLError("the document is nested too deeply") from None
        if node is None:
            return None
        _count_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _count_nodes(root: yaml.Node) -> None:
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = [item for pair in node.value for item in pair] if isinstance(node, yaml.MappingNode) else (
            node.value if isinstance(node, yaml.SequenceNode) else [])
        if children_done:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[id(node)] > MAX_YAML_NODES:
                raise yaml.YAMLError(f"line {node.start_mark.line + 1}: aliases expand this document past "
                                     f"{MAX_YAML_NODES:,} values (an alias bomb?)")
            continue
        if id(node) in open_nodes:
            raise yaml.YAMLError(f"line {node.start_mark.line + 1}: an alias refers to the value that holds it")
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


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
        for depth, part in enumerate(path[:-1], start=1):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                whole = ENV_PREFIX + "__".join(path[:depth]).upper()
                raise ConfigError(f"environment variable {key} conflicts with {whole}, which sets all of "
                                  f"'{'.'.join(path[:depth])}'", hint=f"unset one of {key} and {whole}")
        try:
            node[path[-1]] = load_yaml(raw) if raw.strip() else None
            _refuse_comment(key, raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(
                f"environment variable {key} is not a valid YAML value ({problem}): {quoted(raw)}",
                hint=f"fix or unset {key}: write a YAML value (256MiB, 3, true, [a, b]) and quote other text",
            ) from None
    return tree


def _refuse_comment(key: str, raw: str) -> None:
    """Refuse an override whose text YAML cuts at a comment (`/data/run #2` would read `/data/run`)."""
    if "#" not in raw:
        return
    tokens = [token for token in yaml.scan(raw, Loader=yaml.SafeLoader) if not isinstance(token, yaml.StreamEndToken)]
    if tokens and tokens[-1].end_mark.index < len(raw.rstrip()):
        raise ConfigError(
            f"environment variable {key} holds a YAML comment: {quoted(raw)} would be read as {quoted(load_yaml(raw))}",
            hint=f"quote the value if the '#' belongs to it: {key}=\"'...'\"",
        )


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


CONFIG_HINT = "see config/seedance.yaml for every key and its default"


def _describe(error: ValidationError, source: str, model: type[BaseModel], prefix: str | None = None,
              names: Mapping[str, str] | None = None, hint: str = CONFIG_HINT,
              environ: Mapping[str, str] | None = None) -> ConfigError:
    lines, variables = [], []
    for item in _union_merged(error):
        loc = list(item["loc"])
        match = _did_you_mean(model, loc) if item["type"] == "extra_forbidden" else None
        variable = _env_origin(environ or {}, [prefix, *loc] if prefix else loc)
        origin = f" (from {variable})" if variable else ""
        if variable and variable not in variables:
            variables.append(variable)
        if names and loc and loc[0] in names:
            loc[0] = names[loc[0]]
        key = ".".join([prefix, *loc] if prefix else loc)
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'{origin}"
                         + _suggest(".".join([*key.split(".")[:-1], match]) if match else None))
        elif not key:  # a check across keys (e.g. small_file_size <= target_file_size)
            lines.append(message)
        else:
            lines.append(f"'{key}'{origin}: {message}{_shown_input(key, item.get('input'), message)}")
    if variables:
        hint = (f"fix or unset {', '.join(variables)} (quote text that YAML reads as a number, a boolean or "
                "a date: '0123', 'no'); " + hint)
    return ConfigError(f"invalid settings in {source}: " + "; ".join(lines), hint=hint)


# pydantic's names of union members in an error's location, e.g. `checkpoint_every.literal['auto']`
_UNION_MEMBER = re.compile(r"(?:int|str|float|bool|decimal|date|datetime|bytes|none|(?:constrained-|function-|"
                           r"lax-or-strict\[|json-or-python\[|nullable\[|tagged-union\[|union\[|chain\[|list\[|"
                           r"dict\[|is-instance\[|literal\[).*)")


def _union_merged(error: ValidationError) -> list[dict[str, Any]]:
    """The errors of `error`, locations as strings without union-member names, and the errors of one
    value against each member of its union merged into one ("... or ...")."""
    items: list[dict[str, Any]] = []
    unions: dict[tuple[str, ...], dict[str, Any]] = {}
    for item in error.errors():
        parts = [str(part) for part in item["loc"]]
        loc = tuple(part for part in parts if not _UNION_MEMBER.fullmatch(part))
        message = item["msg"].removeprefix("Value error, ")
        if len(loc) < len(parts) and loc in unions:
            unions[loc]["msg"] += ", or " + message[:1].lower() + message[1:]
            continue
        items.append({**item, "loc": loc, "msg": message})
        if len(loc) < len(parts):
            unions[loc] = items[-1]
    return items


def _env_origin(environ: Mapping[str, str], path: list[str]) -> str | None:
    """The SEEDANCE__* variable that set the value at `path`, a section holding it or a key in it, if one did."""
    found, length = None, 0
    for variable in environ:
        if variable.startswith(ENV_PREFIX):
            parts = [part.lower() for part in variable[len(ENV_PREFIX):].split("__") if part]
            if parts and len(parts) > length and path[:len(parts)] == parts[:len(path)]:
                found, length = variable, len(parts)
    return found


def _did_you_mean(model: type[BaseModel], loc: list[str]) -> str | None:
    """The key allowed at `loc` of `model` closest to the unknown key there (its last part), or None."""
    def models(annotation: Any) -> list[type[BaseModel]]:
        if inspect.isclass(annotation):
            return [annotation] if issubclass(annotation, BaseModel) else []
        return [found for arg in get_args(annotation) for found in models(arg)]

    def step(annotation: Any, part: str) -> list[Any]:
        """What `part` (a field, a dict key or a list index) of a value of type `annotation` holds."""
        fields = [found.model_fields[part].annotation for found in models(annotation) if part in found.model_fields]
        return fields or [arg for arg in get_args(annotation) if arg is not str]

    annotations: list[Any] = [model]
    for part in loc[:-1]:
        annotations = [held for annotation in annotations for held in step(annotation, part)]
    known = sorted({name for annotation in annotations for found in models(annotation) for name in found.model_fields})
    return _closest(loc[-1], known) if loc else None


def _closest(word: str, known: list[str]) -> str | None:
    match = difflib.get_close_matches(word.lower(), known, n=1, cutoff=0.6)
    return match[0] if match else None


def _suggest(key: str | None) -> str:
    return f" (did you mean '{key}'?)" if key else ""


_SECRET_KEY = re.compile(r"(?i)password|secret|token|webhook|credential|key_id|access_key")


def _shown_input(key: str, value: Any, message: str = "") -> str:
    """` (got 'x')` for a scalar value; nothing for a whole section or list (it may hold secrets and
    says less than the message), for a key whose name says it is a secret, or when `message`
    already shows the value."""
    if isinstance(value, dict | list) or _SECRET_KEY.search(key) or (text := quoted(value)) in message:
        return ""
    return f" (got {text})"


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
            raise _describe(exc, f"{source} (+ {ENV_PREFIX}* environment)", _settings_model(),
                            environ=environ) from None
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
            raise _describe(exc, f"{source} (+ {ENV_PREFIX}* environment)", model, prefix=name,
                            environ=environ) from None
    return _SECTION_CACHE[cache_key].model_copy(deep=True)


def _raw(path: str | Path | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """The file's mapping merged with the environment overrides (cached); unknown sections refused."""
    source, explicit, key = _source(path, environ)
    if key not in _RAW:
        _RAW.clear()
        data = _read_file(source, explicit)
        data = _merge(data, _env_overrides(environ))
        _refuse_nul(data, [], source, environ)
        unknown = [name for name in data if name not in SECTIONS]
        if unknown:
            raise ConfigError(
                f"invalid settings in {source} (+ {ENV_PREFIX}* environment): "
                + "; ".join(_unknown_section(str(name), environ) for name in unknown),
                hint="see config/seedance.yaml for every key and its default",
            )
        _RAW[key] = data
    return _RAW[key]


def _refuse_nul(value: Any, path: list[str], source: Path, environ: Mapping[str, str]) -> None:
    """ConfigError naming the key (and the SEEDANCE__* variable that set it) of the first text that
    holds a NUL byte (YAML's "\\0" or "\\u0000" escape): no path, name or URI can, and it would fail far
    from the setting, as an unexpected error."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            _refuse_nul(key, path, source, environ)
            _refuse_nul(item, [*path, str(key)], source, environ)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _refuse_nul(item, [*path, str(index)], source, environ)
    elif isinstance(value, str) and "\x00" in value:
        variable = _env_origin(environ, [part.lower() for part in path])
        raise ConfigError(
            f"invalid settings in {source} (+ {ENV_PREFIX}* environment): "
            + (f"'{'.'.join(path)}'" if path else "a top-level key") + (f" (from {variable})" if variable else "")
            + f": {quoted(value)} holds a NUL byte (\\0): no path, name, URI or other setting can",
            hint=(f"fix or unset {variable}; " if variable else "") + CONFIG_HINT)


def _unknown_section(name: str, environ: Mapping[str, str]) -> str:
    variable = _env_origin(environ, [name])
    return (f"unknown key '{name}'" + (f" (from {variable})" if variable else "")
            + _suggest(_closest(name, list(SECTIONS))))


MAX_CONFIG_BYTES = 4 * 1024**2
"""The largest config file read (the repository's is 20 KiB): `/dev/zero` must not fill the memory."""


def read_yaml_file(path: str | Path, what: str, source_hint: str, format_hint: str) -> Any:
    """The YAML value of the file `path` (None for an empty one), read as every settings-like file
    is: at most MAX_CONFIG_BYTES, UTF-8, through `load_yaml` (no Python objects, no key given
    twice, no alias bomb). Every failure is a ConfigError naming `what` and `path` (missing,
    unreadable, oversized, not UTF-8, not YAML with its line), with a hint: `source_hint` says
    where the path comes from, `format_hint` what the file should hold."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{what} {path} is larger than {MAX_CONFIG_BYTES // 1024**2} MiB",
                              hint=f"{source_hint}; it holds a few KiB of YAML")
        return load_yaml(data.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}", hint=f"check the path; {source_hint}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}",
                          hint=f"check the path and its permissions; {source_hint}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {exc.start} cannot be decoded)",
                          hint=f"save it as UTF-8 YAML; {format_hint}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path} is not valid YAML: {yaml_problem(exc)}", hint=YAML_HINT) from None


def _read_file(source: Path, explicit: bool) -> dict[str, Any]:
    if not (explicit or source.exists()):
        return {}
    loaded = read_yaml_file(source, "config file",
                            f"${CONFIG_ENV} names the config file (unset, config/seedance.yaml is read)",
                            "see config/seedance.yaml for the format") or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {source} must hold a mapping of sections, not a {type(loaded).__name__}",
                          hint="write `section:` lines at the top level, as config/seedance.yaml does")
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
        raise _describe(exc, source, type(current), names=names, hint=hint) from None
