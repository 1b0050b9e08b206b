"""Attribution of billing lines to owners, shared-cost splits, and per-owner totals.

Order, per line: a shared-cost rule that matches splits the line among owners by usage weights
(largest remainder, one allocated line per owner, FOCUS 1.3 `AllocatedMethodId`/`Details`);
else the owner tags (first listed key present wins; disagreements recorded in `x_TagConflict`);
else the first CMDB rule in effect on the line's ChargePeriodStart that matches; else the line
is unallocated (owner null). Everything but the split of shared lines is vectorised over Arrow
batches: tag strings are parsed once per distinct value.
"""

from __future__ import annotations

import csv
import io
import json
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seedance_tasks import storage
from seedance_tasks.arrow_memory import reusing_memory
from seedance_tasks.cost.ingest import CARRIED_MONEY, DICT, LINES, TS, decode_text, nulls
from seedance_tasks.cost.money import MONEY, ZERO, exact_sums, fmt, largest_remainder
from seedance_tasks.cost.owners import (
    Match,
    OwnersFile,
    as_utc,
    glob_regex,
    parse_tags,
    tag_matches,
    tag_owner,
    usage_path,
)

ALLOCATED = [
    ("x_Cost", MONEY),
    ("x_Owner", DICT),
    ("x_OwnerSource", DICT),
    ("x_TagConflict", DICT),
    ("AllocatedMethodId", DICT),
    ("AllocatedMethodDetails", DICT),
    ("AllocatedResourceId", pa.string()),
    ("AllocatedResourceName", pa.string()),
    ("AllocatedTags", DICT),
]
"""The columns allocation adds to a line: Seedance's (`x_`) and FOCUS 1.3's allocation columns."""
ALLOCATED_NAMES = tuple(name for name, _ in ALLOCATED)


def allocations_schema(lines: pa.Schema = LINES) -> pa.Schema:
    """The allocated lines of `lines` (LINES plus any carried source columns): those and ALLOCATED,
    FOCUS columns first, then the custom `x_` ones (as FOCUS asks)."""
    fields = [*lines, *(pa.field(name, kind) for name, kind in ALLOCATED)]
    return pa.schema([field for field in fields if not field.name.startswith("x_")]
                     + [field for field in fields if field.name.startswith("x_")])


ALLOCATIONS = allocations_schema()
MATCH_COLUMNS = {"account": "BillingAccountId", "sub_account": "SubAccountId", "resource_id": "ResourceId",
                 "resource_name": "ResourceName", "service": "ServiceName"}
SPLIT_QUANTUM = Decimal("0.01")
_CACHE_LIMIT = 500_000


@dataclass(frozen=True)
class Split:
    """How one shared rule divides a cost this month: owners (sorted) and their exact weights."""

    rule_id: str
    owners: list[str]
    weights: list[Fraction]
    details: str  # JSON for AllocatedMethodDetails


def _read_csv(uri: str) -> list[dict[str, str]]:
    """The rows of a usage CSV, keys and values stripped; ValueError naming the row if one has more
    fields than the header (or the line if the file is not text: `ingest.decode_text`)."""
    location = storage.resolve(uri)
    text = decode_text(storage.read_bytes(location.fs, location.path))
    rows = []
    for number, row in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
        if None in row:
            raise ValueError(f"row {number} has more fields than the header")
        rows.append({key.strip(): (value or "").strip() for key, value in row.items()})
    return rows


USAGE_HINT = ("fix the usage file: each usage value is a finite number >= 0 (an owner without usage is 0); "
              "the split uses the other rows until then")


def _unusable(text: str) -> str | None:
    """Why a usage value cannot weigh a split (negative, NaN, infinite), or None if it can;
    ValueError if it is not a number at all (the file is then malformed)."""
    try:
        return "is negative" if Fraction(text) < 0 else None
    except (ValueError, ZeroDivisionError):
        number = float(text)  # ValueError: not a number at all
        return "is not a finite number" if number != number or number in (float("inf"), float("-inf")) else None


def _usable_rows(rows: list[dict[str, str]], columns: list[str]) -> tuple[list[dict[str, str]], list[str]]:
    """The usage rows with an owner whose `columns` all hold a finite number >= 0, and one note per
    other row (`row N (owner 'x'): COLUMN VALUE is negative`, `row N: no owner`), rows numbered as
    in the file (header: row 1): a row left out weighs nothing, nor counts in the column totals.
    KeyError for a missing column, ValueError for a value that is not a number (malformed file)."""
    kept, notes = [], []
    for number, row in enumerate(rows, start=2):
        problems = [f"{column} {row[column]!r} {why}" for column in columns if (why := _unusable(row[column]))]
        if not row["owner"]:
            notes.append(f"row {number}: no owner (each row names the owner its usage is charged to)")
            continue
        if problems:
            notes.append(f"row {number} (owner {row.get('owner', '')!r}): {', '.join(problems)}")
        else:
            kept.append(row)
    return kept, notes


def shared_splits(owners: OwnersFile, month: str, month_end: datetime) -> tuple[dict[str, Split], list[str]]:
    """The split of every shared rule for `month` from its usage file; warnings for rules that cannot split.

    A rule without a usable usage file (unreadable, malformed, no positive weight) is skipped (its
    lines are attributed like any other) and named in the warnings. A row whose usage value is
    negative, NaN or infinite is left out of the split, the rest of the file still splits, and a
    warning names the file, each such row, its owner and column, with a hint.
    """
    splits: dict[str, Split] = {}
    warnings: list[str] = []
    for rule in owners.shared:
        uri = usage_path(owners, rule.usage, month)
        try:
            rows = _read_csv(uri)
        except OSError as exc:
            warnings.append(f"shared rule {rule.id}: usage file {uri} not readable ({exc}); its lines are not split")
            continue
        except (ValueError, csv.Error) as exc:
            warnings.append(f"shared rule {rule.id}: usage file {uri} malformed ({exc}); its lines are not split")
            continue
        weights: dict[str, Fraction] = defaultdict(Fraction)
        try:
            rows, notes = _usable_rows(rows, list(rule.weights) if rule.method == "usage_share" else ["gb_months"])
            if rule.method == "usage_share":
                totals = {column: sum((Fraction(row[column]) for row in rows), Fraction(0)) for column in rule.weights}
                for row in rows:
                    for column, coefficient in rule.weights.items():
                        if totals[column]:
                            weights[row["owner"]] += Fraction(coefficient) * Fraction(row[column]) / totals[column]
            else:
                for row in rows:
                    age = (month_end.date() - datetime.strptime(row["last_access"], "%Y-%m-%d").date()).days
                    band = next(
                        (b for b in rule.recency if b.max_age_days is None or age <= b.max_age_days), None
                    )
                    if band is not None:
                        weights[row["owner"]] += Fraction(row["gb_months"]) * Fraction(band.weight)
        except (KeyError, ValueError, ZeroDivisionError) as exc:
            warnings.append(f"shared rule {rule.id}: usage file {uri} malformed ({exc!r}); its lines are not split")
            continue
        if notes:
            shown = "; ".join(notes[:10]) + (f"; and {len(notes) - 10:,} more" if len(notes) > 10 else "")
            warnings.append(f"shared rule {rule.id}: usage file {uri}: {len(notes):,} row(s) left out of the "
                            f"split: {shown}\n  hint: {USAGE_HINT}")
        kept = sorted(owner for owner, weight in weights.items() if weight > 0 and owner)
        if not kept:
            warnings.append(f"shared rule {rule.id}: usage file {uri} gives no owner a positive weight")
            continue
        total = sum(weights[owner] for owner in kept)
        shares = {owner: fmt(round(Decimal(weights[owner].numerator) / Decimal(weights[owner].denominator)
                                   / (Decimal(total.numerator) / Decimal(total.denominator)), 6)) for owner in kept}
        details = json.dumps(
            {"method": rule.method, "usage": uri.rsplit("/", 1)[-1], "shares": shares,
             "rounding": "largest-remainder"}, sort_keys=True,
        )
        splits[rule.id] = Split(rule.id, kept, [weights[owner] for owner in kept], details)
    return splits, warnings


def _value_index(values: pa.Array, cache: dict, name: str) -> np.ndarray:
    """Per row, the index of its value in the column's dictionary; null rows point one past the end."""
    key = ("index", name)
    if key not in cache:
        encoded = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
        indices = encoded.indices
        if indices.null_count:
            indices = pc.fill_null(indices, len(encoded.dictionary))
        cache[key] = indices.to_numpy(zero_copy_only=False)
    return cache[key]


def _codes(values) -> np.ndarray:
    """Codes per distinct value (-1 for none), with a trailing -1 for null rows."""
    return np.array([-1 if value is None else value for value in values] + [-1], np.int32)


def _arrow_codes(codes: np.ndarray) -> pa.Array:
    return pa.array(codes, pa.int32(), mask=codes < 0)


def _micros(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


class _Codes:
    """Distinct strings (owners, sources, conflicts) and their int32 codes, stable for a run.

    Safe to share between the threads attributing batches: a new value gets one code, and the
    code always names that value."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self.index: dict[str, int] = {}
        self._lock = threading.Lock()

    def code(self, value: str | None) -> int | None:
        if value is None:
            return None
        found = self.index.get(value)
        if found is None:
            with self._lock:
                found = self.index.get(value)
                if found is None:
                    self.values.append(value)
                    found = self.index[value] = len(self.values) - 1
        return found

    def array(self, codes: pa.Array) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(codes, pa.array(self.values, pa.string()))


class _TagInfo(NamedTuple):
    """What one distinct Tags string decides (a tuple: the collector stops tracking it once its
    fields are plain values, and a month holds one per distinct string)."""

    owner: int | None  # code
    source: int | None  # code of "tag:<key>"
    conflict: int | None  # code
    tags: dict[str, str] | None  # kept only where a rule matches on tags
    malformed: bool


@dataclass
class _Decision:
    """A batch's attribution as numpy codes, before any Arrow column is built."""

    index: np.ndarray  # per line: its Tags value's position in the dictionary (null: one past the end)
    owner: np.ndarray  # per line: owner code, -1 for none
    source: np.ndarray | None  # per line: code of the owner's source, -1 for none (None: not asked for)
    conflict_per_value: np.ndarray  # per Tags value: conflict code, -1 for none
    shared: np.ndarray | None  # per line: the shared rule splitting it, -1 for none; None if no line is split
    cache: dict  # per-column dictionary indices already computed


class Attributor:
    """Attributes batches of LINES to owners; one per month run (it caches parsed tag strings).

    All decisions are taken once per distinct value (dictionary) and broadcast to the rows as
    int32 codes, so a batch costs a few vectorised passes whatever its size.
    """

    def __init__(self, owners: OwnersFile, basis: str, splits: dict[str, Split] | None = None):
        self.owners = owners
        self.keys = owners.keys
        self.basis = basis
        self.splits = splits or {}
        self._tags: dict[str, _TagInfo] = {}
        self._keep_tags = any(rule.match.tag for rule in [*owners.rules, *owners.shared])
        self.malformed_tags: list[int] = []  # their data rows (x_Row), the first 1000
        self.malformed_tags_at: list[int] = []  # their positions among the lines, where `attribute` was told
        self.malformed_tags_count = 0
        self._lock = threading.Lock()
        self.owner_codes, self.source_codes, self.conflict_codes = _Codes(), _Codes(), _Codes()
        self.rule_codes = [(rule, self.owner_codes.code(rule.owner), self.source_codes.code(f"rule:{rule.id}"))
                           for rule in owners.rules]

    def needed_columns(self) -> list[str]:
        """The line columns attribution reads (for a reader's projection)."""
        needed = {"Tags", self.basis}
        for rule in [*self.owners.rules, *self.owners.shared]:
            needed.update(column for name, column in MATCH_COLUMNS.items() if getattr(rule.match, name) is not None)
        if self.splits:
            needed.update({"BilledCost", "EffectiveCost"})
        return sorted(needed)

    def _info(self, text: str | None) -> _TagInfo:
        if text is None:
            return _TagInfo(None, None, None, None, False)
        info = self._tags.get(text)
        if info is None:
            try:
                tags = parse_tags(text, self.keys)
                malformed = False
            except ValueError:
                tags, malformed = None, True
            owner, key, conflict = tag_owner(tags, self.keys)
            info = _TagInfo(self.owner_codes.code(owner), self.source_codes.code(f"tag:{key}" if owner else None),
                            self.conflict_codes.code(conflict), tags if self._keep_tags else None, malformed)
            if len(self._tags) >= _CACHE_LIMIT:
                self._tags.clear()
            self._tags[text] = info
        return info

    def _condition(self, batch: pa.RecordBatch, match: Match, rows: np.ndarray | None, valid_from, valid_to,
                   cache: dict) -> np.ndarray:
        """Where `match` (and the validity dates) hold, as a numpy bool array over `rows` (None: all rows)."""
        result: np.ndarray | None = None

        def both(condition: np.ndarray) -> None:
            nonlocal result
            result = condition if result is None else result & condition

        for name, column in MATCH_COLUMNS.items():
            pattern = getattr(match, name)
            if pattern is None:
                continue
            regex = glob_regex(pattern)
            values = batch.column(column)
            if pa.types.is_dictionary(values.type):
                index = _value_index(values, cache, column)
                hits = pc.fill_null(pc.match_substring_regex(values.dictionary, regex), False)
                per_value = np.append(hits.to_numpy(zero_copy_only=False), False)
                both(per_value[index if rows is None else index[rows]])
            else:
                subset = values if rows is None else values.take(pa.array(rows))
                both(pc.fill_null(pc.match_substring_regex(subset, regex), False).to_numpy(zero_copy_only=False))
        if match.tag:
            index, infos = cache["tags"]
            per_value = np.array([tag_matches(info.tags, match.tag) for info in infos] + [False])
            both(per_value[index if rows is None else index[rows]])
        if valid_from is not None or valid_to is not None:
            if "start" not in cache:
                cache["start"] = batch.column("ChargePeriodStart").cast(pa.int64()).to_numpy(zero_copy_only=False)
            start = cache["start"] if rows is None else cache["start"][rows]
            if valid_from is not None:
                both(start >= _micros(as_utc(valid_from)))
            if valid_to is not None:
                both(start < _micros(as_utc(valid_to)))
        assert result is not None  # a Match has at least one condition
        return result

    def _decide(self, batch: pa.RecordBatch, sources: bool = True, first: int | None = None) -> _Decision:
        """Each line's owner, its source (unless not `sources`) and tag conflict, and its shared
        rule, as numpy codes. `first`: the position of the batch's first line among all the lines
        (malformed Tags are then noted by position too)."""
        length = len(batch)
        cache: dict = {}
        tags = batch.column("Tags")
        index = _value_index(tags, cache, "Tags")
        infos = [self._info(text) for text in (tags.dictionary if pa.types.is_dictionary(tags.type)
                                                else pc.dictionary_encode(tags).dictionary).to_pylist()]
        cache["tags"] = (index, infos)
        if any(info.malformed for info in infos):
            bad = np.array([info.malformed for info in infos] + [False])[index]
            rows = batch.column("x_Row").filter(pa.array(bad)).to_pylist()
            with self._lock:
                room = max(0, 1000 - len(self.malformed_tags))
                self.malformed_tags.extend(rows[:room])
                if first is not None:
                    self.malformed_tags_at.extend((np.flatnonzero(bad)[:room] + first).tolist())
                self.malformed_tags_count += len(rows)
        owner = _codes(info.owner for info in infos)[index]
        source = _codes(info.source for info in infos)[index] if sources else None
        conflict_per_value = _codes(info.conflict for info in infos)

        for rule, owner_code, source_code in self.rule_codes:
            unowned = np.flatnonzero(owner < 0)
            if not unowned.size:
                break
            hit = unowned[self._condition(batch, rule.match, unowned, rule.valid_from, rule.valid_to, cache)]
            owner[hit] = owner_code
            if source is not None:
                source[hit] = source_code

        shared = None
        for number, rule in enumerate(self.owners.shared):
            if rule.id in self.splits:
                if shared is None:
                    shared = np.full(length, -1, np.int32)
                free = shared < 0
                shared[free & self._condition(batch, rule.match, None, rule.valid_from, rule.valid_to, cache)] = number
        if shared is not None and not (shared >= 0).any():
            shared = None
        return _Decision(index, owner, source, conflict_per_value, shared, cache)

    def attribute(self, batch: pa.RecordBatch, first: int | None = None) -> list[pa.RecordBatch]:
        """`batch` (LINES) as ALLOCATIONS batches: owner, its source, conflicts, then shared splits.

        Decisions are made per distinct value (tag string, account, service...) and broadcast to
        rows through their dictionary indices (numpy); CMDB rules look only at rows still unowned.
        With `first` (the position of the batch's first line among the month's lines), the lines
        with malformed Tags are also noted by position (`malformed_tags_at`, aligned with
        `malformed_tags`), which `ingest.LineFiles` maps to their file.
        """
        return self._allocations(batch, self._decide(batch, first=first))

    def _allocations(self, batch: pa.RecordBatch, decision: _Decision) -> list[pa.RecordBatch]:
        length = len(batch)
        conflict_per_value, index = decision.conflict_per_value, decision.index
        schema = allocations_schema(batch.schema)
        columns = {name: batch.column(name) for name in batch.schema.names}
        columns.update(
            x_Cost=batch.column(self.basis), x_Owner=self.owner_codes.array(_arrow_codes(decision.owner)),
            x_OwnerSource=self.source_codes.array(_arrow_codes(decision.source)),
            x_TagConflict=(nulls(length, DICT) if (conflict_per_value < 0).all()
                           else self.conflict_codes.array(_arrow_codes(conflict_per_value[index]))),
            AllocatedMethodId=nulls(length, DICT), AllocatedMethodDetails=nulls(length, DICT),
            AllocatedResourceId=nulls(length, pa.string()), AllocatedResourceName=nulls(length, pa.string()),
            AllocatedTags=nulls(length, DICT),
        )
        out = pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)
        if decision.shared is None:
            return [out]
        is_shared = decision.shared >= 0
        plain = out.filter(pa.array(~is_shared))
        rule_ids = [self.owners.shared[number].id for number in decision.shared[is_shared]]
        return [plain, self._split(out.filter(pa.array(is_shared)), rule_ids)]

    def totals(self, batch: pa.RecordBatch) -> Partial:
        """What `batch` (LINES) adds to the month's totals (`Totals.fold`), without building its
        allocated lines unless a shared rule splits some: the same sums as `Totals.add` over
        `attribute(batch)`. Safe to call from several threads at once."""
        if self.splits:  # shared lines are split line by line: their allocated lines are built
            return Partial.merged([Partial.of(out) for out in self.attribute(batch)])
        decision = self._decide(batch, sources=False)
        owners = len(self.owner_codes.values)  # every code of this batch is below: codes only grow
        # owner code + 1 indexes [None, *owners]: no line's code is below -1
        labels = [_labels(batch.column("BillingCurrency")), [None, *self.owner_codes.values[:owners]],
                  _labels(batch.column("ServiceName"))]
        kind = np.int32 if len(labels[0]) * len(labels[1]) * len(labels[2]) < 2**31 else np.int64
        keys = _value_index(batch.column("BillingCurrency"), decision.cache, "BillingCurrency").astype(kind)
        keys *= len(labels[1])
        keys += decision.owner
        keys += 1
        keys *= len(labels[2])
        keys += _value_index(batch.column("ServiceName"), decision.cache, "ServiceName")
        partial = Partial(lines=len(batch), groups=_group_sums(keys, labels, batch.column(self.basis), batch))
        if (decision.conflict_per_value >= 0).any():
            conflicts = decision.conflict_per_value[decision.index]
            has = conflicts >= 0
            partial.conflicts = int(has.sum())
            rows = np.flatnonzero(has)[:100]
            partial.conflict_sample = [
                {"row": row, "tags": json.loads(self.conflict_codes.values[code])}
                for row, code in zip(batch.column("x_Row").take(pa.array(rows)).to_pylist(), conflicts[rows].tolist(),
                                     strict=True)]
        partial.estimated = bool(pc.any(batch.column("x_Estimated")).as_py())
        return partial

    def _split(self, lines: pa.RecordBatch, rule_ids: list[str]) -> pa.RecordBatch:
        rows: list[dict[str, Any]] = []
        money = ["BilledCost", "EffectiveCost", *(name for name in CARRIED_MONEY if name in lines.schema.names)]
        for line, rule_id in zip(lines.to_pylist(), rule_ids, strict=True):
            split = self.splits[rule_id]
            parts = {name: largest_remainder(line[name], split.weights, SPLIT_QUANTUM)
                     for name in money if line[name] is not None}
            for index, owner in enumerate(split.owners):
                part = dict(line)
                part.update({name: amounts[index] for name, amounts in parts.items()})
                part.update(
                    x_Cost=part[self.basis], x_Owner=owner, x_OwnerSource=f"shared:{rule_id}",
                    AllocatedMethodId=rule_id, AllocatedMethodDetails=split.details,
                    AllocatedTags=json.dumps({"x_Owner": owner}, sort_keys=True),
                )
                rows.append(part)
        return pa.RecordBatch.from_pylist(rows, schema=lines.schema)


@dataclass
class Partial:
    """One batch's contribution to `Totals`: its sums per (currency, owner, service) and its
    conflicts. Made on any thread; folded in order by one (`Totals.fold`)."""

    lines: int = 0
    groups: list[tuple[str, str | None, str | None, Decimal, Decimal, Decimal]] = field(default_factory=list)
    conflicts: int = 0
    conflict_sample: list[dict[str, Any]] = field(default_factory=list)
    estimated: bool = False

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> Partial:
        """The sums of an ALLOCATIONS batch (x_Owner attributed)."""
        partial = cls(lines=len(batch))
        if not len(batch):
            return partial
        # one hash aggregation on an int64 key (currency, owner, service codes) gives both views
        cache: dict = {}
        keys, labels = np.zeros(len(batch), np.int64), []
        for name in ("BillingCurrency", "x_Owner", "ServiceName"):
            column = batch.column(name)
            values = _labels(column)
            keys = keys * len(values) + _value_index(column, cache, name)
            labels.append(values)
        partial.groups = _group_sums(keys, labels, batch.column("x_Cost"), batch)
        conflicts = batch.column("x_TagConflict")
        if conflicts.null_count < len(conflicts):
            has = pc.is_valid(conflicts)
            partial.conflicts = pc.sum(has).as_py()
            picked = batch.filter(has).slice(0, 100)
            partial.conflict_sample = [
                {"row": row, "tags": json.loads(conflict)} for row, conflict in zip(
                    picked.column("x_Row").to_pylist(), picked.column("x_TagConflict").to_pylist(), strict=True)]
        partial.estimated = bool(pc.any(batch.column("x_Estimated")).as_py())
        return partial

    @classmethod
    def merged(cls, partials: list[Partial]) -> Partial:
        """One partial holding all of `partials` (in order)."""
        total = cls()
        for partial in partials:
            total.lines += partial.lines
            total.groups.extend(partial.groups)
            total.conflicts += partial.conflicts
            total.conflict_sample.extend(partial.conflict_sample[: max(0, 100 - len(total.conflict_sample))])
            total.estimated = total.estimated or partial.estimated
        return total


def _labels(column: pa.Array) -> list:
    """The distinct values of a column in `_value_index` order, and None last (null rows)."""
    return (column.dictionary if pa.types.is_dictionary(column.type)
            else pc.dictionary_encode(column).dictionary).to_pylist() + [None]


def _group_sums(keys: np.ndarray, labels: list[list], cost: pa.Array,
                batch: pa.RecordBatch) -> list[tuple[str, str | None, str | None, Decimal, Decimal, Decimal]]:
    """Exact sums of `cost`, BilledCost and EffectiveCost per key present, a key being
    (currency * len(owners) + owner) * len(services) + service over the `labels` lists."""
    columns = {"cost": cost}
    # a column that is all null (not read) or the very cost column again (the basis) is not summed twice
    for name, column in (("billed", batch.column("BilledCost")), ("effective", batch.column("EffectiveCost"))):
        if column.null_count < len(column) and not _same(column, cost):
            columns[name] = column
    owners, services = len(labels[1]), len(labels[2])
    size = len(labels[0]) * owners * services
    found = _dense_sums(keys, size, columns) if size <= _DENSE_KEYS else None
    if found is None:  # Arrow's hash aggregation: any key range, any decimal
        grouped = pa.table({"key": keys, **columns}).group_by("key", use_threads=False).aggregate(
            [(name, "sum") for name in columns])
        found = grouped.column("key").to_pylist(), {name: grouped.column(f"{name}_sum").to_pylist()
                                                     for name in columns}
    present, sums = found
    cost_sums = sums["cost"]
    billed = sums.get("billed", cost_sums if _same(batch.column("BilledCost"), cost) else [None] * len(present))
    effective = sums.get("effective", cost_sums if _same(batch.column("EffectiveCost"), cost)
                         else [None] * len(present))
    return [(labels[0][key // (owners * services)], labels[1][key // services % owners], labels[2][key % services],
             total or ZERO, billed_total or ZERO, effective_total or ZERO)  # an unread column sums to null
            for key, total, billed_total, effective_total in zip(present, cost_sums, billed, effective, strict=True)]


_DENSE_KEYS = 1 << 20


def _dense_sums(keys: np.ndarray, size: int, columns: dict[str, pa.Array]
                ) -> tuple[list[int], dict[str, list[Decimal]]] | None:
    """The keys present and each column's exact sum per key, by integer adds over a dense table of
    `size` keys; None where a column does not allow it (`money.exact_sums`)."""
    present = np.flatnonzero(np.bincount(keys, minlength=size))
    sums = {}
    for name, column in columns.items():
        totals = exact_sums(keys, size, column, present)
        if totals is None:
            return None
        sums[name] = totals
    return present.tolist(), sums


@dataclass
class Totals:
    """Running per-currency totals of a month: by owner (None = unallocated) and by service."""

    by_owner: dict[tuple[str, str | None], list[Decimal]] = field(default_factory=dict)  # [cost, billed, effective]
    by_service: dict[tuple[str, str | None], Decimal] = field(default_factory=dict)
    lines: int = 0
    conflicts: int = 0
    conflict_sample: list[dict[str, Any]] = field(default_factory=list)
    estimated: bool = False

    def add(self, batch: pa.RecordBatch) -> None:
        """Fold one ALLOCATIONS batch in (exact decimal sums)."""
        self.fold(Partial.of(batch))

    def fold(self, partial: Partial) -> None:
        """Add `partial` (one batch's sums) to the running totals."""
        self.lines += partial.lines
        for currency, owner, service, cost, billed, effective in partial.groups:
            sums = self.by_owner.setdefault((currency, owner), [ZERO, ZERO, ZERO])
            sums[0] += cost
            sums[1] += billed
            sums[2] += effective
            self.by_service[(currency, service)] = self.by_service.get((currency, service), ZERO) + cost
        self.conflicts += partial.conflicts
        self.conflict_sample.extend(partial.conflict_sample[: max(0, 100 - len(self.conflict_sample))])
        self.estimated = self.estimated or partial.estimated

    def currencies(self) -> dict[str, dict[str, Any]]:
        """{currency: {total, by_owner, unallocated, billed_total, effective_total}} as Decimals, sorted."""
        result: dict[str, dict[str, Any]] = {}
        for (currency, owner), (cost, billed, effective) in sorted(
            self.by_owner.items(), key=lambda item: (item[0][0], item[0][1] or "")
        ):
            entry = result.setdefault(
                currency, {"total": ZERO, "by_owner": {}, "unallocated": ZERO, "billed_total": ZERO,
                           "effective_total": ZERO}
            )
            entry["total"] += cost
            entry["billed_total"] += billed
            entry["effective_total"] += effective
            if owner is None:
                entry["unallocated"] += cost
            else:
                entry["by_owner"][owner] = entry["by_owner"].get(owner, ZERO) + cost
        return result

    def to_json(self) -> dict[str, Any]:
        return {
            "by_owner": [[c, o, *map(str, v)] for (c, o), v in sorted(self.by_owner.items(), key=lambda i: (i[0][0], i[0][1] or ""))],
            "by_service": [[c, s, str(v)] for (c, s), v in sorted(self.by_service.items(), key=lambda i: (i[0][0], i[0][1] or ""))],
            "lines": self.lines, "conflicts": self.conflicts, "conflict_sample": self.conflict_sample,
            "estimated": self.estimated,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Totals:
        totals = cls()
        totals.by_owner = {(c, o): [Decimal(a), Decimal(b), Decimal(e)] for c, o, a, b, e in data["by_owner"]}
        totals.by_service = {(c, s): Decimal(v) for c, s, v in data["by_service"]}
        totals.lines, totals.conflicts = data["lines"], data["conflicts"]
        totals.conflict_sample, totals.estimated = data["conflict_sample"], data["estimated"]
        return totals


def _same(a: pa.Array, b: pa.Array) -> bool:
    """True if `a` and `b` are views of the same values (same buffers, offset and length)."""
    if a is b:
        return True
    if a.type != b.type or len(a) != len(b) or a.offset != b.offset:
        return False
    return [buf.address if buf else None for buf in a.buffers()] == [buf.address if buf else None
                                                                      for buf in b.buffers()]


def in_month(batch: pa.RecordBatch, start: datetime, end: datetime) -> pa.RecordBatch:
    """The lines of `batch` whose ChargePeriodStart is in [start, end)."""
    column = batch.column("ChargePeriodStart")
    bounds = pc.min_max(column)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is not None and low >= start and high < end and column.null_count == 0:
        return batch  # the usual case: a month's export holds that month only
    keep = pc.and_(pc.greater_equal(column, pa.scalar(start, TS)), pc.less(column, pa.scalar(end, TS)))
    return batch.filter(keep)


def allocate_month(uri: str, owners: OwnersFile, month: str, basis: str = "EffectiveCost",
                   splits: dict[str, Split] | None = None, batch_rows: int = 500_000) -> Totals:
    """Parse, attribute and total `month` of a FOCUS source in one streaming pass, in process.

    Reads only the columns attribution needs (the basis cost only: no invoice totals here); memory
    is bounded by the batch size (nothing but the running totals is kept). The pipeline's stages
    do the same plus validation of every column, outputs and invoice reconciliation.
    """
    from seedance_tasks.cost.ingest import focus_chunks, month_bounds
    from seedance_tasks.parallel import ordered_map

    start, end = month_bounds(month)
    attributor = Attributor(owners, basis, splits)
    totals = Totals()
    chunks = focus_chunks(uri, batch_rows=batch_rows, columns=attributor.needed_columns(),
                          costs=tuple(sorted({basis, *(("BilledCost", "EffectiveCost") if splits else ())})))
    # the file is read here while both cores normalise, attribute and sum the batches read before
    with reusing_memory():
        for partial in ordered_map(lambda chunk: attributor.totals(in_month(chunk.lines()[0], start, end)), chunks,
                                   threads=2, ahead=3, name="cost-attribute"):
            totals.fold(partial)
    return totals
