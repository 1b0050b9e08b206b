"""The owners file: tag keys that name an owner, effective-dated CMDB rules, shared costs,
budgets and approvals. Only `owner_tags` is required.

```yaml
owner_tags: [owner, team]          # first key present wins; a disagreement is recorded
rules:                             # tried in order on lines no tag attributed
  - {id: research-acct, owner: research, match: {sub_account: "4388*"}, valid_from: 2024-01-01}
shared:                            # split a matched cost among owners by usage weights
  - {id: kafka, match: {resource_name: "kafka-*"}, method: usage_share,
     usage: usage/kafka-{month}.csv, weights: {partitions: "0.5", bytes: "0.5"}}
budgets: {research: {amount: "1000", currency: USD}}
approvals: [{owner: research, from_month: 2024-09, to_month: 2024-12, up_to: "1500", currency: USD}]
contacts:                          # where Notifier.send delivers; a webhook only by reference
  research: {email: [ml-leads@example.com], webhook_conn: slack_research}
```
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Collection
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from seedance_tasks.config import StrictModel, load_yaml
from seedance_tasks.cost.workdays import CURRENCY_RE, MONTH_PATTERN
from seedance_tasks.errors import YAML_HINT, ConfigError, yaml_problem
from seedance_tasks.notifiers import WebhookRef, email_list


def norm_key(key: str) -> str:
    """A tag key as compared: surrounding spaces dropped, case folded."""
    return key.strip().casefold()


def glob_regex(pattern: str) -> str:
    """A shell-style pattern (`*`, `?`) as an anchored RE2/Python regex."""
    parts = []
    for char in pattern:
        parts.append(".*" if char == "*" else "." if char == "?" else re.escape(char))
    return "^" + "".join(parts) + "$"


class Match(StrictModel):
    """What a rule matches; every given condition must hold. Patterns are shell globs."""

    account: str | None = Field(None, description="BillingAccountId glob")
    sub_account: str | None = Field(None, description="SubAccountId glob")
    resource_id: str | None = Field(None, description="ResourceId glob")
    resource_name: str | None = Field(None, description="ResourceName glob")
    service: str | None = Field(None, description="ServiceName glob")
    tag: dict[str, str] | None = Field(None, description="tag key (case-insensitive) -> exact value")

    @model_validator(mode="after")
    def _not_empty(self):
        if not any(value is not None for value in self.model_dump().values()):
            raise ValueError("a match needs at least one condition")
        return self


def owner_name(value):
    """An owner's name as given in the owners file, surrounding spaces dropped (as tag values are);
    ValueError for a blank one, which would charge a cost to nobody in particular."""
    if isinstance(value, str):
        value = value.strip()
        if not value:
            raise ValueError("an owner name must not be empty or blank")
    return value


def currency_code(value):
    """A currency as the owners file gives it, as billing lines hold it: an ISO 4217 code in capitals
    (` usd` -> `USD`); ValueError for anything else, which would never match a line's currency."""
    if isinstance(value, str):
        value = value.strip().upper()
        if not re.fullmatch(CURRENCY_RE, value):
            raise ValueError(f"{value!r} is not a currency code (ISO 4217, e.g. USD or EUR)")
    return value


def _owner_keys(value):
    """A mapping keyed by owner names (budgets, contacts, approvers) with its keys as `owner_name` gives
    them; ValueError naming both when two keys are one owner once spaces are dropped (`a`, `" a "`):
    either one silently replacing the other would be wrong."""
    if not isinstance(value, dict):
        return value
    out: dict = {}
    given: dict = {}
    for key, item in value.items():
        name = owner_name(key)
        if name in out:
            raise ValueError(f"owners {given[name]!r} and {key!r} are the same owner, {name!r}: give it once")
        out[name], given[name] = item, key
    return out


def _check_dates(rule):
    """A dated rule must apply on at least one day: valid_from before valid_to."""
    if rule.valid_from is not None and rule.valid_to is not None and rule.valid_to <= rule.valid_from:
        raise ValueError(f"rule {rule.id}: valid_to {rule.valid_to} is not after valid_from {rule.valid_from} "
                         "(valid_to is exclusive)")
    return rule


class Rule(StrictModel):
    id: str
    owner: str
    match: Match
    valid_from: date | None = Field(None, description="first day the rule applies (inclusive)")
    valid_to: date | None = Field(None, description="day the rule stops applying (exclusive)")

    _dates = model_validator(mode="after")(_check_dates)
    _owner = field_validator("owner", mode="before")(owner_name)


class Recency(StrictModel):
    max_age_days: int | None = Field(None, ge=0, description="last access at most this many days before month end")
    weight: Decimal = Field(..., ge=0)


class SharedRule(StrictModel):
    id: str
    match: Match
    method: Literal["usage_share", "storage_recency"]
    usage: str = Field(..., description="CSV with an `owner` column; `{month}` is replaced; relative to the owners file")
    weights: dict[str, Decimal] | None = Field(
        None, description="usage_share: column -> coefficient (summing to 1), e.g. partitions 0.5, bytes 0.5"
    )
    recency: list[Recency] | None = Field(
        None, description="storage_recency: weight of GB-months by days since last access, first fitting band"
    )
    valid_from: date | None = None
    valid_to: date | None = None

    _dates = model_validator(mode="after")(_check_dates)

    @model_validator(mode="after")
    def _method_args(self):
        if self.method == "usage_share":
            if not self.weights or sum(self.weights.values()) != 1 or any(v < 0 for v in self.weights.values()):
                raise ValueError(f"shared rule {self.id}: weights must be non-negative and sum to 1")
        elif not self.recency:
            raise ValueError(f"shared rule {self.id}: storage_recency needs recency bands")
        return self


class Budget(StrictModel):
    amount: Decimal = Field(..., ge=0)
    currency: str = "USD"

    _currency = field_validator("currency", mode="before")(currency_code)


class Approval(StrictModel):
    owner: str
    from_month: str = Field(..., pattern=MONTH_PATTERN)
    to_month: str = Field(..., pattern=MONTH_PATTERN, description="inclusive")
    up_to: Decimal = Field(..., ge=0, description="spend the approval covers, in `currency`")
    currency: str = "USD"

    _owner = field_validator("owner", mode="before")(owner_name)
    _currency = field_validator("currency", mode="before")(currency_code)

    @field_validator("from_month", "to_month", mode="before")
    @classmethod
    def _month_text(cls, value):
        return value.strftime("%Y-%m") if isinstance(value, date) else value

    @model_validator(mode="after")
    def _months_in_order(self):
        if self.to_month < self.from_month:
            raise ValueError(f"approval of {self.owner}: to_month {self.to_month} is before from_month {self.from_month}")
        return self


class Contact(WebhookRef):
    """How to reach an owner: e-mail addresses and a webhook *reference* (an Airflow connection id
    or an environment variable name; never the URL, which is a secret)."""

    email: list[str] = Field(default_factory=list, description="one address or a list")

    @field_validator("email", mode="before")
    @classmethod
    def _emails(cls, value):
        return email_list(value)


class OwnersFile(StrictModel):
    owner_tags: list[str] = Field(..., min_length=1)
    contacts: dict[str, Contact] = Field(default_factory=dict, description="owner -> e-mail / webhook reference")
    rules: list[Rule] = Field(default_factory=list)
    shared: list[SharedRule] = Field(default_factory=list)
    budgets: dict[str, Budget] = Field(default_factory=dict)
    approvals: list[Approval] = Field(default_factory=list)
    approvers: dict[str, list[str]] = Field(
        default_factory=dict, description="owner -> Airflow user names who confirm its chargeback (HITL); none: any")
    base_dir: str = Field("", exclude=True, description="directory of the file, for relative usage paths")

    _owners = field_validator("contacts", "budgets", "approvers", mode="before")(_owner_keys)

    @property
    def keys(self) -> list[str]:
        return [norm_key(key) for key in self.owner_tags]


def load_owners(uri: str) -> OwnersFile:
    """Parse and validate an owners file (local path, file:// or s3://); ConfigError names the key."""
    from seedance_tasks import storage

    location = storage.resolve(uri)
    try:
        text = storage.read_bytes(location.fs, location.path).decode("utf-8")
    except (FileNotFoundError, OSError) as exc:
        raise ConfigError(f"owners file not readable: {uri} ({exc})", hint="pass --owners FILE") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"owners file {uri} is not UTF-8 text (byte {exc.start} cannot be decoded)",
                          hint="save it as UTF-8 YAML; see config/owners.yaml for the format") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"owners file {uri} is not valid YAML: {yaml_problem(exc)}", hint=YAML_HINT) from None
    if not isinstance(data, dict):
        raise ConfigError(f"owners file {uri} must be a mapping with at least `owner_tags`")
    try:
        owners = OwnersFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for item in exc.errors():
            key = ".".join(str(part) for part in item["loc"])
            problems.append(f"unknown key '{key}'" if item["type"] == "extra_forbidden" else f"'{key}': {item['msg']}")
        raise ConfigError(
            f"invalid owners file {uri}: " + "; ".join(problems), hint="see config/owners.yaml for every key"
        ) from None
    _unique_ids(uri, "CMDB rule", owners.rules)
    _unique_ids(uri, "shared rule", owners.shared)
    owners.base_dir = location.uri_of(posixpath.dirname(location.path))
    return owners


def _unique_ids(uri: str, kind: str, rules: list) -> None:
    """ConfigError naming the first id two of `rules` share (splits and sources are keyed by id)."""
    seen: set[str] = set()
    for rule in rules:
        if rule.id in seen:
            raise ConfigError(f"invalid owners file {uri}: duplicate {kind} id {rule.id!r}",
                              hint=f"give each {kind} its own id")
        seen.add(rule.id)


def parse_tags(text: str | None, owner_keys: Collection[str] = ()) -> dict[str, str] | None:
    """Tags of a billing line: a JSON object (FOCUS), or one without braces (Azure EA); None if absent.

    Values are what FOCUS's key-value format allows: strings, null (as ""), numbers and true/false
    (as their JSON text), except that a true/false under one of `owner_keys` (`norm_key` form) names
    no owner. A key repeated with another value is kept as another spelling of it (spaces added,
    which `norm_key` drops), so the disagreement is a tag conflict, not a silent last-one-wins.
    Raises ValueError for text that is not such an object, for an object or list value, and for a
    true/false owner tag.
    """
    if text is None or not text.strip():
        return None
    body = text.strip()
    try:
        value = json.loads(body if body.startswith("{") else "{" + body + "}", object_pairs_hook=_repeated_keys)
    except (json.JSONDecodeError, RecursionError):  # nested deeper than Python's stack: no tags either
        raise ValueError(f"tags are not a JSON object: {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"tags are not a JSON object: {text[:80]!r}")
    return {str(key): _tag_value(key, item, text, owner_keys) for key, item in value.items()}


def _repeated_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object's pairs as a dict in which a key repeated with another value gets a trailing space."""
    out: dict[str, object] = {}
    for key, item in pairs:
        while key in out and out[key] != item:
            key += " "
        out[key] = item
    return out


def _tag_value(key: str, item, text: str, owner_keys: Collection[str] = ()) -> str:
    """A tag's value as text: a string as it is, null as "", a number or true/false as its JSON
    text; an object or a list is no tag value, nor is true/false under an owner key (ValueError:
    the line's tags are malformed)."""
    if item is None:
        return ""
    if isinstance(item, str):
        return item
    if isinstance(item, bool) and norm_key(key) in owner_keys:
        raise ValueError(f"owner tag {key!r} is {json.dumps(item)}, not an owner name: {text[:80]!r}")
    if isinstance(item, int | float):
        return json.dumps(item)
    raise ValueError(f"tag {key!r} has a {type(item).__name__} value, not a string: {text[:80]!r}")


def tag_owner(tags: dict[str, str] | None, keys: list[str]) -> tuple[str | None, str | None, str | None]:
    """(owner, the tag key that named it, conflict) for one line's tags.

    Keys compare case-insensitively without surrounding spaces; empty values count as absent. The
    first of `keys` present wins; when present keys (or two spellings of one key) disagree, the
    conflict is returned as a JSON object {key: [values]} sorted, else None.
    """
    if not tags:
        return None, None, None
    found: dict[str, list[str]] = {}
    for raw_key, raw_value in tags.items():
        key = norm_key(raw_key)
        value = raw_value.strip()
        if key in keys and value:
            values = found.setdefault(key, [])
            if value not in values:
                values.append(value)
    if not found:
        return None, None, None
    first = next(key for key in keys if key in found)
    owner = sorted(found[first])[0]
    distinct = {value for values in found.values() for value in values}
    conflict = None
    if len(distinct) > 1:
        conflict = json.dumps({key: sorted(values) for key, values in sorted(found.items())}, sort_keys=True)
    return owner, first, conflict


def tag_matches(tags: dict[str, str] | None, wanted: dict[str, str]) -> bool:
    """True if every `wanted` key (compared like owner keys) is present with exactly that value."""
    if not tags:
        return False
    normalised = {norm_key(key): value.strip() for key, value in tags.items()}
    return all(normalised.get(norm_key(key)) == value for key, value in wanted.items())


def as_utc(day: date | None) -> datetime | None:
    return None if day is None else datetime(day.year, day.month, day.day, tzinfo=UTC)


def usage_path(owners: OwnersFile, template: str, month: str) -> str:
    """Where a shared rule's usage file for `month` is: absolute/URI as is, else beside the owners file."""
    name = template.replace("{month}", month)
    if "://" in name or name.startswith("/") or not owners.base_dir:
        return name
    return f"{owners.base_dir}/{name}" if owners.base_dir.startswith("s3://") else str(Path(owners.base_dir) / name)
