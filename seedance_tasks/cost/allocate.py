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
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from seedance_tasks import storage
from seedance_tasks.cost.ingest import LINES, TS
from seedance_tasks.cost.money import MONEY, ZERO, fmt, largest_remainder
from seedance_tasks.cost.owners import (
    Match, OwnersFile, as_utc, glob_regex, parse_tags, tag_matches, tag_owner, usage_path,
)

ALLOCATIONS = pa.schema(
    [
        *LINES,
        ("x_Cost", MONEY),
        ("x_Owner", pa.string()),
        ("x_OwnerSource", pa.string()),
        ("x_TagConflict", pa.string()),
        ("AllocatedMethodId", pa.string()),
        ("AllocatedMethodDetails", pa.string()),
    ]
)
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
    location = storage.resolve(uri)
    text = storage.read_bytes(location.fs, location.path).decode("utf-8-sig")
    return [{key.strip(): (value or "").strip() for key, value in row.items()} for row in csv.DictReader(io.StringIO(text))]


def shared_splits(owners: OwnersFile, month: str, month_end: datetime) -> tuple[dict[str, Split], list[str]]:
    """The split of every shared rule for `month` from its usage file; warnings for rules that cannot split.

    A rule without a usable usage file is skipped (its lines are attributed like any other) and
    named in the warnings.
    """
    splits: dict[str, Split] = {}
    warnings: list[str] = []
    for rule in owners.shared:
        uri = usage_path(owners, rule.usage, month)
        try:
            rows = _read_csv(uri)
        except (FileNotFoundError, OSError) as exc:
            warnings.append(f"shared rule {rule.id}: usage file {uri} not readable ({exc}); its lines are not split")
            continue
        weights: dict[str, Fraction] = defaultdict(Fraction)
        try:
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


@dataclass
class _TagInfo:
    owner: str | None
    key: str | None
    conflict: str | None
    tags: dict[str, str] | None
    malformed: bool


class Attributor:
    """Attributes batches of LINES to owners; one per month run (it caches parsed tag strings)."""

    def __init__(self, owners: OwnersFile, basis: str, splits: dict[str, Split] | None = None):
        self.owners = owners
        self.keys = owners.keys
        self.basis = basis
        self.splits = splits or {}
        self._tags: dict[str, _TagInfo] = {}
        self.malformed_tags: list[int] = []

    def _info(self, text: str | None) -> _TagInfo:
        if text is None:
            return _TagInfo(None, None, None, None, False)
        info = self._tags.get(text)
        if info is None:
            try:
                tags = parse_tags(text)
                malformed = False
            except ValueError:
                tags, malformed = None, True
            owner, key, conflict = tag_owner(tags, self.keys)
            info = _TagInfo(owner, key, conflict, tags, malformed)
            if len(self._tags) >= _CACHE_LIMIT:
                self._tags.clear()
            self._tags[text] = info
        return info

    def _condition(self, batch: pa.RecordBatch, match: Match, indices: pa.Array, infos: list[_TagInfo],
                   valid_from, valid_to) -> pa.Array:
        conditions = []
        for name, column in (("account", "BillingAccountId"), ("sub_account", "SubAccountId"),
                             ("resource_id", "ResourceId"), ("resource_name", "ResourceName"),
                             ("service", "ServiceName")):
            pattern = getattr(match, name)
            if pattern is not None:
                conditions.append(pc.match_substring_regex(batch.column(column), glob_regex(pattern)))
        if match.tag:
            per_value = pa.array([tag_matches(info.tags, match.tag) for info in infos], pa.bool_())
            conditions.append(per_value.take(indices))
        start = batch.column("ChargePeriodStart")
        if valid_from is not None:
            conditions.append(pc.greater_equal(start, pa.scalar(as_utc(valid_from), TS)))
        if valid_to is not None:
            conditions.append(pc.less(start, pa.scalar(as_utc(valid_to), TS)))
        result = conditions[0]
        for condition in conditions[1:]:
            result = pc.and_kleene(result, condition)
        return pc.fill_null(result, False)

    def attribute(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """`batch` (LINES) as ALLOCATIONS: owner, its source, conflicts, shared splits."""
        encoded = pc.dictionary_encode(batch.column("Tags"))
        indices = encoded.indices
        infos = [self._info(text) for text in encoded.dictionary.to_pylist()]
        if any(info.malformed for info in infos):
            bad = pa.array([info.malformed for info in infos], pa.bool_()).take(indices).fill_null(False)
            rows = batch.column("x_Row").filter(bad).to_pylist()
            self.malformed_tags.extend(rows[: max(0, 1000 - len(self.malformed_tags))])
        owner = pa.array([info.owner for info in infos], pa.string()).take(indices)
        source = pa.array([f"tag:{info.key}" if info.owner else None for info in infos], pa.string()).take(indices)
        conflict = pa.array([info.conflict for info in infos], pa.string()).take(indices)

        for rule in self.owners.rules:
            hit = pc.and_(self._condition(batch, rule.match, indices, infos, rule.valid_from, rule.valid_to),
                          owner.is_null())
            if pc.any(hit).as_py():
                owner = pc.if_else(hit, pa.scalar(rule.owner, pa.string()), owner)
                source = pc.if_else(hit, pa.scalar(f"rule:{rule.id}", pa.string()), source)

        shared = None
        for rule in self.owners.shared:
            if rule.id not in self.splits:
                continue
            hit = self._condition(batch, rule.match, indices, infos, rule.valid_from, rule.valid_to)
            if shared is not None:
                hit = pc.and_(hit, shared.is_null())
            if pc.any(hit).as_py():
                shared = pc.if_else(hit, pa.scalar(rule.id, pa.string()),
                                    shared if shared is not None else pa.nulls(len(batch), pa.string()))

        columns = {name: batch.column(name) for name in LINES.names}
        columns.update(
            x_Cost=batch.column(self.basis), x_Owner=owner, x_OwnerSource=source, x_TagConflict=conflict,
            AllocatedMethodId=pa.nulls(len(batch), pa.string()),
            AllocatedMethodDetails=pa.nulls(len(batch), pa.string()),
        )
        out = pa.RecordBatch.from_arrays([columns[name] for name in ALLOCATIONS.names], schema=ALLOCATIONS)
        if shared is None:
            return out
        is_shared = pc.fill_null(pc.is_valid(shared), False)
        plain = out.filter(pc.invert(is_shared))
        split = self._split(out.filter(is_shared), shared.filter(is_shared).to_pylist())
        return pa.Table.from_batches([plain, split], schema=ALLOCATIONS).combine_chunks().to_batches()[0]

    def _split(self, lines: pa.RecordBatch, rule_ids: list[str]) -> pa.RecordBatch:
        rows: list[dict[str, Any]] = []
        for line, rule_id in zip(lines.to_pylist(), rule_ids, strict=True):
            split = self.splits[rule_id]
            billed = largest_remainder(line["BilledCost"], split.weights, SPLIT_QUANTUM)
            effective = largest_remainder(line["EffectiveCost"], split.weights, SPLIT_QUANTUM)
            for index, owner in enumerate(split.owners):
                part = dict(line)
                part.update(
                    BilledCost=billed[index], EffectiveCost=effective[index],
                    x_Cost=billed[index] if self.basis == "BilledCost" else effective[index],
                    x_Owner=owner, x_OwnerSource=f"shared:{rule_id}",
                    AllocatedMethodId=rule_id, AllocatedMethodDetails=split.details,
                )
                rows.append(part)
        return pa.RecordBatch.from_pylist(rows, schema=ALLOCATIONS)


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
        if not len(batch):
            return
        self.lines += len(batch)
        table = pa.Table.from_batches([batch])
        grouped = table.group_by(["BillingCurrency", "x_Owner"], use_threads=False).aggregate(
            [("x_Cost", "sum"), ("BilledCost", "sum"), ("EffectiveCost", "sum")]
        )
        for row in grouped.to_pylist():
            sums = self.by_owner.setdefault((row["BillingCurrency"], row["x_Owner"]), [ZERO, ZERO, ZERO])
            sums[0] += row["x_Cost_sum"]
            sums[1] += row["BilledCost_sum"]
            sums[2] += row["EffectiveCost_sum"]
        services = table.group_by(["BillingCurrency", "ServiceName"], use_threads=False).aggregate([("x_Cost", "sum")])
        for row in services.to_pylist():
            key = (row["BillingCurrency"], row["ServiceName"])
            self.by_service[key] = self.by_service.get(key, ZERO) + row["x_Cost_sum"]
        conflicts = batch.column("x_TagConflict")
        if conflicts.null_count < len(conflicts):
            has = pc.is_valid(conflicts)
            self.conflicts += pc.sum(has).as_py()
            if len(self.conflict_sample) < 100:
                picked = batch.filter(has).slice(0, 100 - len(self.conflict_sample))
                for row, conflict in zip(picked.column("x_Row").to_pylist(),
                                         picked.column("x_TagConflict").to_pylist(), strict=True):
                    self.conflict_sample.append({"row": row, "tags": json.loads(conflict)})
        if not self.estimated and pc.any(batch.column("x_Estimated")).as_py():
            self.estimated = True

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


def in_month(batch: pa.RecordBatch, start: datetime, end: datetime) -> pa.RecordBatch:
    """The lines of `batch` whose ChargePeriodStart is in [start, end)."""
    column = batch.column("ChargePeriodStart")
    keep = pc.and_(pc.greater_equal(column, pa.scalar(start, TS)), pc.less(column, pa.scalar(end, TS)))
    return batch.filter(keep)
