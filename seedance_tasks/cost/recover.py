"""One month of cost recovery, as the stages the DAG runs: prepare -> ingest -> allocate -> rules
-> statements -> check -> report (which publishes).

Each stage reads and writes a hidden work folder `OUT/_seedance/cost-work/month=M/<run>/`, so the
stages can run as separate Airflow tasks, and passes a small dict along. Every stage runs under
the month's lease (`OUT/_seedance/leases/month-M.json`): one writer per month, whoever starts it;
every task and retry of one DAG run shares one holder. Intermediates are written atomically, so
a retried stage simply writes them again. Outputs land in `OUT/month=M/` only at the end,
through a journal of the report attempt's own (own id, own staged copies): the staged files are
published (a file they replace goes to `OUT/_seedance/trash/<attempt>/` first), then files of the
old output that the new one no longer has retire to the trash. A new attempt first rolls every
interrupted journal of the month forward or back. Re-running a month gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from seedance_tasks import faults, journal, lease, storage
from seedance_tasks.arrow_memory import reusing_memory
from seedance_tasks.cost import cur_focus
from seedance_tasks.cost.allocate import (
    ALLOCATED_NAMES,
    Attributor,
    Totals,
    allocations_schema,
    in_month,
    shared_splits,
)
from seedance_tasks.cost.ingest import (
    CURRENCY_RE,
    MAX_REJECTED,
    LineFiles,
    carried_columns,
    lines_schema,
    month_bounds,
    rounded_amounts,
    source_of,
)
from seedance_tasks.cost.money import SCALE, exact, fmt, parse_amount
from seedance_tasks.cost.owners import load_owners
from seedance_tasks.errors import InputError, IntegrityError, SeedanceError, UsageError

WORK_DIR = f"{storage.SEEDANCE_DIR}/cost-work"
EMPTY_MONTH = "no billing lines in"


def journal_kind(month: str) -> str:
    """Journals are per month, so runs of different months (a backfill's) never recover each other's."""
    return f"cost-{month}"


def lease_name(month: str) -> str:
    """The month's lease: `OUT/_seedance/leases/month-YYYY-MM.json`."""
    return f"month-{month}"

FORMATS = ("focus", "cur", "ce")


@dataclass
class Job:
    """Everything a month's stages need; JSON-able (it travels between Airflow tasks as XCom)."""

    month: str
    billing: str
    owners: str
    out: str
    format: str = "focus"
    basis: str = "EffectiveCost"
    apply: bool = False
    backfill: bool = False
    utilization: str | None = None
    currency: str | None = None
    refresh: bool = False
    run_key: str = ""
    state: str = ""
    holder: str = ""  # who holds the month's lease: the CLI run's id, or `airflow:<dag>:<run>`
    wait_s: float = 0.0  # how long to wait for another holder's lease

    @property
    def lease_holder(self) -> str:
        return self.holder or self.run_key

    @cached_property
    def root(self) -> storage.Location:
        return storage.resolve(self.out)

    @property
    def work(self) -> str:
        """The work folder, relative to the output root."""
        return f"{WORK_DIR}/month={self.month}/{self.run_key}"

    def work_path(self, *parts: str) -> str:
        return self.root.join(self.work, *parts)


_log = logging.getLogger("seedance_tasks.dag")


def _settings():
    from seedance_tasks.config import load_settings

    return load_settings().cost


def last_closed_month(now: datetime) -> str:
    first = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (first - timedelta(days=1)).strftime("%Y-%m")


def describe(
    *, month: str, billing: str | None = None, out: str | None = None, owners: str | None = None, format: str = "focus",
    basis: str | None = None, apply: bool = False, backfill: bool | None = None,
    utilization: str | None = None, currency: str | None = None, refresh: bool = False,
    run_key: str | None = None, now: datetime | None = None, holder: str | None = None, wait_s: float = 0.0,
) -> Job:
    """Check the arguments and describe the run (nothing is read or written yet).

    A month after `now`'s is refused: nothing of it is billed yet, and publishing it would
    announce an empty statement as a closed month. `backfill=None` decides by the month: older than the last closed month (relative to `now`)
    is a backfill, which never tags, freezes or notifies. `holder` names the lease holder
    (default: the run key); `wait_s` is how long to wait for another holder of the month.
    """
    settings = _settings()
    month_bounds(month)
    now = now or datetime.now(UTC)
    current = now.astimezone(UTC).strftime("%Y-%m")
    if month > current:
        raise UsageError(f"month {month} has not begun (it is {current} now): nothing of it is billed yet",
                         hint=f"give a month up to {current}; the last closed one is {last_closed_month(now)}")
    if format not in FORMATS:
        raise UsageError(f"unknown billing format {format!r}", hint="use focus, cur or ce")
    if currency is not None and not re.fullmatch(CURRENCY_RE, currency):
        raise UsageError(f"--currency {currency!r} is not a currency code",
                         hint="an ISO 4217 code in capitals, e.g. USD or EUR")
    basis = basis or settings.basis
    if basis not in ("EffectiveCost", "BilledCost"):
        raise UsageError(f"unknown basis {basis!r}", hint="use EffectiveCost or BilledCost")
    owners = owners or settings.owners_file
    billing = billing or settings.billing_uri
    out = out or settings.out_uri
    if not billing or not out:
        raise UsageError("no billing source or no output root", hint="pass --billing and --out, or set "
                         "cost.billing_uri and cost.out_uri")
    if not owners:
        raise UsageError("no owners file", hint="pass --owners FILE or set cost.owners_file")
    load_owners(owners)  # fail early on a bad file
    if backfill is None:
        backfill = month < last_closed_month(now)
    root = storage.resolve(out)
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", run_key) if run_key else storage.new_run_id(now)
    state = settings.state_uri or root.uri_of(root.join(storage.SEEDANCE_DIR, "cost"))
    return Job(month, billing, owners, out, format, basis, apply, bool(backfill), utilization, currency,
               refresh, key, state, holder or "", float(wait_s))


@contextmanager
def month_lease(job: Job, *, release: bool = True) -> Iterator[lease.Lease]:
    """Hold the month's lease for `job.lease_holder` (LeaseHeldError naming the other holder, or
    wait up to `job.wait_s`); `release=False` keeps it for the next task of the same DAG run."""
    with lease.holding(job.root, lease_name(job.month), holder=job.lease_holder,
                       purpose=f"cost recovery {job.month}", wait_s=job.wait_s, release=release) as held:
        yield held


def prepare(*, release: bool = True, **kwargs: Any) -> dict[str, Any]:
    """`describe` the run, then, under the month's lease, finish or undo interrupted publishes of the month.

    Keyword arguments are those of `describe`. `release=False` keeps the lease for the next task
    of the same holder (a DAG run's).
    """
    job = describe(**kwargs)
    with month_lease(job, release=release):
        journal.recover(job.root, journal_kind(job.month))
    return asdict(job)


def _job(data: dict[str, Any]) -> Job:
    return Job(**data)


def _batches(job: Job, settings, info: dict[str, Any], carry: list[str]):
    from seedance_tasks.cost import ingest

    if job.format == "focus":
        yield from ingest.read_focus(job.billing, batch_rows=settings.batch_rows,
                                     default_currency=job.currency or settings.default_currency, carry=carry)
    elif job.format == "cur":
        yield from ingest.read_cur(job.billing, batch_rows=settings.batch_rows, carry=carry)
    else:
        tag = job.billing.removeprefix("ce://").strip("/") or settings.cost_explorer_group_tag
        pages, api = ingest.cost_explorer_pages(job.month, group_tag=tag, cache=storage.resolve(job.state),
                                                refresh=job.refresh)
        api["cost_usd"] = fmt(settings.cost_explorer_page_price * api["pages_queried"])
        info["cost_explorer"] = api
        yield from ingest.read_cost_explorer(pages, group_tag=tag)


INTERMEDIATE = {"compression": "lz4"}
"""How the work files between stages are written: fast to write and read (they live for one run).
Only the dictionary columns are dictionary-encoded: trying it on costs, row numbers and resource ids
(mostly distinct) doubles the write time for nothing."""


@contextmanager
def _parquet_output(root: storage.Location, path: str, schema: pa.Schema,
                    intermediate: bool = False) -> Iterator[pq.ParquetWriter]:
    """A Parquet writer whose file appears at `path` whole or not at all (a retry just writes it again).

    Outputs are zstd-compressed; `intermediate` work files are written the `INTERMEDIATE` way.
    """
    root.fs.create_dir(posixpath.dirname(path), recursive=True)
    temp = path if root.is_s3 else storage.hidden_sibling(path)  # an S3 upload appears whole at close
    options = ({**INTERMEDIATE, "use_dictionary": [f.name for f in schema if pa.types.is_dictionary(f.type)]}
               if intermediate else {"compression": "zstd"})
    with root.fs.open_output_stream(temp) as sink, pq.ParquetWriter(sink, schema, **options) as writer:
        yield writer
    if temp != path:
        storage.move(root.fs, temp, path)
    faults.point(f"cost.written.{posixpath.basename(path)}")


@exact
def ingest_stage(data: dict[str, Any]) -> dict[str, Any]:
    """Read the billing source, keep the month's valid lines (hidden Parquet), record rejections."""
    job, settings = _job(data), _settings()
    start, end = month_bounds(job.month)
    root = job.root
    info: dict[str, Any] = {"rows_read": 0, "rows_in_month": 0}
    rejected: list[dict[str, Any]] = []
    rejected_count = 0
    # a FOCUS source's other columns travel with its lines into the allocations (FOCUS out); a CUR
    # source's lines get the FOCUS columns its mapping gives (cur_focus)
    carry = (carried_columns(job.billing, reserved=ALLOCATED_NAMES) if job.format == "focus"
             else list(cur_focus.CARRY) if job.format == "cur" else [])
    files = LineFiles()  # which file each staged line comes from: a few bytes per file, no column per line
    other_months: dict[str, int] = {}  # valid lines dated outside the month, by their month
    with _parquet_output(root, job.work_path("lines.parquet"), lines_schema(carry), intermediate=True) as writer:
        rounded = 0
        for batch, bad in _batches(job, settings, info, carry):
            info["rows_read"] += len(batch) + len(bad)
            rounded += rounded_amounts(batch)
            for item in bad:
                if item["month"] in (None, job.month):
                    rejected_count += 1
                    if len(rejected) < MAX_REJECTED:
                        rejected.append({key: item[key] for key in ("file", "row", "column", "reason")})
            kept = in_month(batch, start, end)
            info["rows_in_month"] += len(kept)
            if len(kept) < len(batch):
                for month, count in line_months(batch).items():
                    if month != job.month:
                        other_months[month] = other_months.get(month, 0) + count
            if len(kept):
                writer.write_batch(kept)
                files.add(source_of(kept) or job.billing, len(kept))
    info.update(rejected=rejected, rejected_count=rejected_count, rounded_amounts=rounded, other_months=other_months,
                warnings=_skipped_warning(job) + _rounded_warning(job, rounded), files=files.to_json())
    storage.write_json_atomic(root.fs, job.work_path("ingest.json"), info)
    result = {"rows_read": info["rows_read"], "rows_in_month": info["rows_in_month"], "rejected": rejected_count}
    if "cost_explorer" in info:  # pages queried (and their price) or served from the cache
        result["cost_explorer"] = info["cost_explorer"]
    return result


@exact
def allocate_stage(data: dict[str, Any]) -> dict[str, Any]:
    """Attribute the month's lines (shared splits, tags, CMDB rules) and total them per owner."""
    job, settings = _job(data), _settings()
    start, end = month_bounds(job.month)
    owners = load_owners(job.owners)
    splits, warnings = shared_splits(owners, job.month, end)
    attributor = Attributor(owners, job.basis, splits)
    totals = Totals()
    root = job.root
    source = root.fs.open_input_file(job.work_path("lines.parquet"))
    try:
        lines = pq.ParquetFile(source, pre_buffer=False)  # pre_buffer keeps every chunk read until the end
        with _parquet_output(root, job.work_path("allocations.parquet"), allocations_schema(lines.schema_arrow)) as writer:
            position = 0  # of the batch's first line in lines.parquet (in write order: `LineFiles`)
            for batch in lines.iter_batches(batch_size=settings.batch_rows):
                for out in attributor.attribute(batch, first=position):
                    totals.add(out)
                    writer.write_batch(out)
                position += len(batch)
    finally:
        source.close()
    files = LineFiles(storage.read_json(root.fs, job.work_path("ingest.json")).get("files", []))
    result = totals.to_json()
    result["warnings"] = warnings
    result["shared"] = {rule_id: split.details for rule_id, split in sorted(splits.items())}
    result["malformed_tags"] = attributor.malformed_tags[:100]
    result["malformed_tags_files"] = [files.file_at(position) or job.billing
                                      for position in attributor.malformed_tags_at[:100]]
    result["malformed_tags_count"] = attributor.malformed_tags_count
    storage.write_json_atomic(root.fs, job.work_path("totals.json"), result)
    currencies = totals.currencies()
    return {"lines": totals.lines, "currencies": sorted(currencies), "tag_conflicts": totals.conflicts,
            "unallocated": {cur: fmt(entry["unallocated"]) for cur, entry in currencies.items()}}


def _allocation_batches(job: Job, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """The staged allocations.parquet of `job`, batch by batch, only `columns`."""
    with job.root.fs.open_input_file(job.work_path("allocations.parquet")) as handle:
        yield from pq.ParquetFile(handle, pre_buffer=False).iter_batches(columns=columns)


def _resource_costs(job: Job, resource_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per resource among `resource_ids`: this month's cost per currency and its main owner."""
    if not resource_ids:
        return {}
    wanted = pa.array(resource_ids, pa.string())
    sums: dict[tuple[str, str | None, str], Decimal] = {}
    for batch in _allocation_batches(job, ["ResourceId", "x_Owner", "BillingCurrency", "x_Cost"]):
        hit = batch.filter(pc.fill_null(pc.is_in(batch.column("ResourceId"), value_set=wanted), False))
        if not len(hit):
            continue
        grouped = pa.Table.from_batches([hit]).group_by(["ResourceId", "x_Owner", "BillingCurrency"],
                                                       use_threads=False).aggregate([("x_Cost", "sum")])
        for row in grouped.to_pylist():
            key = (row["ResourceId"], row["x_Owner"], row["BillingCurrency"])
            sums[key] = sums.get(key, Decimal(0)) + row["x_Cost_sum"]
    result: dict[str, dict[str, Any]] = {}
    for (resource, owner, currency), amount in sorted(sums.items(), key=lambda i: (i[0][0], i[0][1] or "", i[0][2])):
        entry = result.setdefault(resource, {"cost": {}, "owners": {}})
        entry["cost"][currency] = entry["cost"].get(currency, Decimal(0)) + amount
        entry["owners"][owner] = entry["owners"].get(owner, Decimal(0)) + abs(amount)
    return result


def _month_resources(job: Job) -> list[str]:
    """The distinct ResourceIds of the month's lines that look like EC2 instances."""
    found: set[str] = set()
    for batch in _allocation_batches(job, ["ResourceId"]):
        ids = pc.unique(batch.column("ResourceId").drop_null())
        found.update(value for value in ids.to_pylist() if "i-" in value)
    return sorted(found)


@exact
def rules_stage(data: dict[str, Any], *, tagger=None) -> dict[str, Any]:
    """Idle and over-budget findings for the month; their side effects only with apply, never in a backfill."""
    from seedance_tasks.cost import rules

    job, settings = _job(data), _settings()
    _, end = month_bounds(job.month)
    owners = load_owners(job.owners)
    totals = Totals.from_json(storage.read_json(job.root.fs, job.work_path("totals.json")))
    idle, active = [], []
    if job.utilization:
        if job.utilization == "cloudwatch":
            points, attributes = rules.cloudwatch_utilization(_month_resources(job), end.date(), settings.idle_days)
        else:
            points, attributes = rules.read_utilization(job.utilization)
        idle, active = rules.idle_findings(points, attributes, end.date(), settings)
        costs = _resource_costs(job, [item["resource_id"] for item in idle])
        for item in idle:
            found = costs.get(item["resource_id"], {"cost": {}, "owners": {}})
            ranked = sorted(found["owners"].items(), key=lambda kv: (-kv[1], kv[0] or ""))
            item["owner"] = ranked[0][0] if ranked else item.pop("owner_hint", None)
            item.pop("owner_hint", None)
            item["cost"] = {currency: fmt(amount) for currency, amount in sorted(found["cost"].items())}
        idle.sort(key=lambda item: (-sum(Decimal(v) for v in item["cost"].values()), item["resource_id"]))
    budgets = rules.budget_findings(owners, totals.currencies(), job.month, settings.overbudget_percent)
    storage.write_json_atomic(job.root.fs, job.work_path("rules.json"), {"idle": idle, "over_budget": budgets})
    actions = rules.act(month=job.month, idle=idle, active=active, budgets=budgets, settings=settings,
                        state=storage.resolve(job.state), apply=job.apply, backfill=job.backfill, tagger=tagger,
                        owners=owners, root=job.root)
    return {"idle": len(idle), "over_budget": [item["owner"] for item in budgets], "actions": actions}


_KEPT_PUNCTUATION = frozenset("._@-")


def _safe(owner: str) -> str:
    """`owner` (NFC) as a file name's part: Unicode letters, marks and digits and `._@-` kept, any
    other run (separators, spaces, control and format characters) as one `_`, no leading dot."""
    kept = "".join(char if char in _KEPT_PUNCTUATION or unicodedata.category(char)[0] in "LMN" else "\0"
                   for char in unicodedata.normalize("NFC", owner))
    return re.sub("\0+", "_", kept).lstrip("._") or "owner"


NAME_BYTES = 100
"""The most UTF-8 bytes of an owner's name a statement's file name keeps (a file name has at most
255 bytes, its temporary sibling's some more)."""


def _cut(text: str, limit: int) -> str:
    """The longest start of `text` whose UTF-8 form has at most `limit` bytes."""
    return text.encode()[:limit].decode(errors="ignore")


def name_key(name: str) -> str:
    """`name` as a file system that ignores case and Unicode normalisation compares it."""
    return unicodedata.normalize("NFC", name.casefold())


def statement_name(owner: str | None, taken: set[str]) -> str:
    """The file name of `owner`'s statement, none of `taken` (names already given, as `name_key`s):
    `unallocated.csv` for None, else `owner=<name>.csv` with the name as `_safe` writes it and cut
    past NAME_BYTES, each with a hash of the whole name added, so no two owners share a file, not
    even where file names ignore case (macOS, Windows: `Alpha`, `alpha`) or normalise Unicode."""
    if owner is None:
        return "unallocated.csv"
    safe, digest = _safe(owner), hashlib.sha256(owner.encode("utf-8", "surrogatepass")).hexdigest()
    if len(safe.encode()) > NAME_BYTES:
        safe = f"{_cut(safe, NAME_BYTES)}-{digest[:8]}"
    name, size = f"owner={safe}.csv", 8
    while name_key(name) in taken and size <= len(digest):
        name, size = f"owner={safe}-{digest[:size]}.csv", size + 8
    return name


def _plain_keys(table: pa.Table, keys: list[str]) -> pa.Table:
    """`table` with its dictionary `keys` decoded (batches' dictionaries differ; groups are few)."""
    for key in keys:
        column = table.column(key)
        if pa.types.is_dictionary(column.type):
            table = table.set_column(table.schema.get_field_index(key), key, pc.cast(column, pa.string()))
    return table


@exact
def statements_stage(data: dict[str, Any]) -> dict[str, Any]:
    """One CSV statement per owner (and one for unallocated) and summary.json (written last), staged.

    What an earlier attempt staged goes to the trash first, so nothing stale is ever published.
    """
    from seedance_tasks.cost.statements import statement

    job = _job(data)
    root = job.root
    _retire_tree(job, "out", storage.new_run_id())
    keys = ["x_Owner", "BillingCurrency", "ServiceName", "x_OwnerSource", "AllocatedMethodId"]
    # per batch in Arrow, then once more over the batches' groups (exact decimal128 sums: a month
    # stays far below their 26 integer digits, see money.MAX_DIGITS), to Python once at the end
    parts = [_plain_keys(pa.Table.from_batches([batch]).group_by(keys, use_threads=False).aggregate(
        [("x_Cost", "sum"), ("BilledCost", "sum"), ("x_Cost", "count")]), keys)
        for batch in _allocation_batches(job, [*keys, "x_Cost", "BilledCost"])]
    groups: dict[tuple, list] = {}
    if parts:
        merged = pa.concat_tables(parts, promote_options="permissive").group_by(keys, use_threads=False).aggregate(
            [("x_Cost_sum", "sum"), ("BilledCost_sum", "sum"), ("x_Cost_count", "sum")])
        for row in merged.to_pylist():
            groups[tuple(row[key] for key in keys)] = [
                row["x_Cost_sum_sum"] if row["x_Cost_sum_sum"] is not None else Decimal(0),
                row["BilledCost_sum_sum"] if row["BilledCost_sum_sum"] is not None else Decimal(0),
                row["x_Cost_count_sum"]]
    per_owner: dict[str | None, list] = {}
    for key in sorted(groups, key=lambda k: tuple("" if part is None else part for part in k)):
        per_owner.setdefault(key[0], []).append((key, groups[key]))
    written: list[str] = []
    taken: set[str] = set()
    for owner, rows in per_owner.items():
        name = statement_name(owner, taken)
        taken.add(name_key(name))
        storage.write_bytes_atomic(root.fs, job.work_path("out", "statements", name),
                                   statement(job.month, owner, job.basis, rows))
        written.append(name)

    ingest = storage.read_json(root.fs, job.work_path("ingest.json"))
    totals_json = storage.read_json(root.fs, job.work_path("totals.json"))
    findings = storage.read_json(root.fs, job.work_path("rules.json"))
    currencies = Totals.from_json(totals_json).currencies()
    summary = {
        "month": job.month,
        "basis": job.basis,
        "format": job.format,
        "currencies": {
            currency: {
                "total": fmt(entry["total"]),
                "by_owner": {owner: fmt(amount) for owner, amount in sorted(entry["by_owner"].items())},
                "unallocated": fmt(entry["unallocated"]),
                "invoice_total": fmt(entry["billed_total"]),
                "effective_total": fmt(entry["effective_total"]),
            }
            for currency, entry in sorted(currencies.items())
        },
        "rejected": ingest["rejected"],
        "rejected_count": ingest["rejected_count"],
        "rejected_truncated": ingest["rejected_count"] > len(ingest["rejected"]),
        "rows_read": ingest["rows_read"],
        "lines": ingest["rows_in_month"],
        "allocated_lines": totals_json["lines"],
        "tag_conflicts": {"count": totals_json["conflicts"], "sample": totals_json["conflict_sample"]},
        "malformed_tags_rows": totals_json["malformed_tags"],
        "malformed_tags": _malformed_tags(job, totals_json),
        "shared": totals_json["shared"],
        "warnings": ingest.get("warnings", []) + _empty_month_warning(job, ingest)
        + _malformed_tags_warning(job, totals_json)
        + totals_json["warnings"],
        "estimated": totals_json["estimated"] or bool(ingest.get("cost_explorer", {}).get("estimated")),
        "by_service": _by_service(totals_json),
        "idle": findings["idle"],
        "over_budget": findings["over_budget"],
    }
    for currency, entry in summary["currencies"].items():  # the invariant, checked before anything is published
        allocated = sum((Decimal(v) for v in entry["by_owner"].values()), Decimal(entry["unallocated"]))
        if allocated != Decimal(entry["total"]):
            raise IntegrityError(f"{job.month} {currency}: owners + unallocated {allocated} != total {entry['total']}")
    storage.write_json_atomic(root.fs, job.work_path("out", "summary.json"), summary)
    return {"statements": len(written), "currencies": {c: e["total"] for c, e in summary["currencies"].items()}}


def _skipped_warning(job: Job) -> list[str]:
    """A warning naming the files in the billing folder that are not read (not .csv/.csv.gz/.parquet)."""
    from seedance_tasks.cost.ingest import skipped_files

    if job.format == "ce":
        return []
    skipped = skipped_files(job.billing)
    if not skipped:
        return []
    shown = ", ".join(skipped[:10]) + (f" and {len(skipped) - 10:,} more" if len(skipped) > 10 else "")
    return [f"{len(skipped):,} files in {job.billing} are not billing files (.csv, .csv.gz, .parquet) and were "
            f"not read: {shown}"]


def _rounded_warning(job: Job, rounded: int) -> list[str]:
    """A warning counting the amounts of the billing source that had more than SCALE decimal places
    and were rounded half-even to SCALE (kept, not rejected: see `money.amount_to_scale`)."""
    if not rounded:
        return []
    return [f"{rounded:,} amounts in {job.billing} had more than {SCALE} decimal places and were rounded "
            f"half-even to {SCALE} (each changed by at most 5e-{SCALE + 1})"]


def line_months(batch: pa.RecordBatch) -> dict[str, int]:
    """How many lines of `batch` each month (`YYYY-MM`, by ChargePeriodStart in UTC) holds."""
    column = batch.column("ChargePeriodStart").drop_null()
    counts = pc.value_counts(pc.add(pc.multiply(pc.year(column), 100), pc.month(column)))
    return {f"{key // 100:04d}-{key % 100:02d}": count
            for key, count in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True)}


SHOWN_MONTHS = 3
"""How many of the months the lines were dated in an empty month's warning names."""


def _empty_month_warning(job: Job, ingest: dict[str, Any]) -> list[str]:
    """A warning when the month has no valid billing line at all (an empty report is rarely what was
    meant), naming the months the valid lines are dated in (the most lines first), if any."""
    if ingest["rows_in_month"]:
        return []
    rejected = f", {ingest['rejected_count']:,} of them rejected" if ingest["rejected_count"] else ""
    found = sorted((ingest.get("other_months") or {}).items(), key=lambda item: (-item[1], item[0]))
    dated = ""
    if found:
        shown = ", ".join(f"{month} ({count:,} line{'s' if count > 1 else ''})" for month, count in found[:SHOWN_MONTHS])
        more = f" and {len(found) - SHOWN_MONTHS:,} more months" if len(found) > SHOWN_MONTHS else ""
        dated = f"; its valid lines are dated {shown}{more}: was another month meant?"
    return [f"{EMPTY_MONTH} {job.month}: {ingest['rows_read']:,} rows read from {job.billing}{rejected}, "
            f"none valid and dated in the month{dated}"]


def _malformed_tags(job: Job, totals_json: dict[str, Any]) -> list[dict[str, Any]]:
    """The first lines whose Tags are malformed, as `{"file", "row"}` (row: the file's 1-based data row)."""
    files = totals_json.get("malformed_tags_files") or []
    return [{"file": files[index] if index < len(files) else job.billing, "row": row}
            for index, row in enumerate(totals_json["malformed_tags"])]


def _malformed_tags_warning(job: Job, totals_json: dict[str, Any]) -> list[str]:
    """A warning naming the first lines whose Tags are malformed, each by file and data row (they
    are attributed as if untagged), with a hint."""
    count = totals_json.get("malformed_tags_count", 0)
    if not count:
        return []
    by_file: dict[str, list[int]] = {}
    for item in _malformed_tags(job, totals_json)[:10]:
        by_file.setdefault(item["file"], []).append(item["row"])
    shown = "; ".join(f"{name} data row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows))}"
                      for name, rows in by_file.items())
    return [f"{count:,} lines of {job.billing} have malformed Tags (not a JSON object of strings), attributed as "
            f"untagged: {shown}{' ...' if count > 10 else ''} (malformed_tags in summary.json)\n"
            "  hint: fix the Tags of those rows at the source: a JSON object of strings, e.g. "
            '{"owner": "team-a"}']


def check_stage(data: dict[str, Any]) -> dict[str, Any]:
    """Decide on the staged month before it is published: its warnings, and with
    `cost.fail_on_empty_month` an InputError (nothing published) when it has no billing line."""
    job, settings = _job(data), _settings()
    summary = storage.read_json(job.root.fs, job.work_path("out", "summary.json"))
    warnings = summary["warnings"]
    empty = [warning for warning in warnings if warning.startswith(EMPTY_MONTH)]
    if empty and settings.fail_on_empty_month:
        raise InputError(empty[0] + "; nothing published",
                         hint="check the billing source and the month; to publish an empty month set "
                         "cost.fail_on_empty_month: false")
    return {"lines": summary["lines"], "warnings": warnings}


def _by_service(totals_json: dict[str, Any]) -> dict[str, dict[str, str]]:
    result: dict[str, dict[str, str]] = {}
    for currency, service, amount in totals_json["by_service"]:
        result.setdefault(currency, {})[service or "(none)"] = fmt(Decimal(amount))
    return result


def _retire_tree(job: Job, relative: str, trash_id: str) -> int:
    """Move every file under the work folder's `relative` (`""`: all of it) to the trash, its
    `summary.json` first (the mark of a complete staged output); empty local folders go too."""
    folder = job.root.child(job.work, relative) if relative else job.root.child(job.work)
    files = sorted(storage.list_files(folder, include_hidden=True),
                   key=lambda info: (not info.path.endswith("/out/summary.json"), info.path))
    for info in files:
        storage.move_to_trash(job.root, job.root.relative(info.path), trash_id)
    if not job.root.is_s3:
        for directory, _, _ in sorted(os.walk(folder.path), reverse=True):
            journal.prune_empty_dirs(job.root, job.root.relative(directory))
    return len(files)


@exact
def report_stage(data: dict[str, Any]) -> dict[str, Any]:
    """Render report.html, then publish the month's staged outputs atomically (old ones to the trash).

    Attempt-safe: the month's interrupted journals are rolled forward or back first; a staged
    output that is still there is published (again) by this attempt's own journal; none there
    means an earlier attempt published it and only its leftovers are cleaned up.
    """
    from seedance_tasks.cost.report import render_report

    job = _job(data)
    root = job.root
    recovered = journal.recover(root, journal_kind(job.month))
    final_dir = f"month={job.month}"
    if not storage.is_file(root.fs, job.work_path("out", "summary.json")):  # a retry after publishing
        _retire_tree(job, "", storage.new_run_id())
        return {"month": job.month, "published": [], "retired": [], "run_id": None, "recovered": recovered,
                "out": root.uri_of(root.join(final_dir)), "note": "nothing staged: already published"}
    summary = storage.read_json(root.fs, job.work_path("out", "summary.json"))
    trend, skipped = [], []
    for info in storage.list_files(root):
        relative = root.relative(info.path)
        match = re.fullmatch(r"month=(\d{4}-\d{2})/summary\.json", relative)
        if match and match.group(1) < job.month:
            earlier = _trend_point(root, info.path, match.group(1))
            (trend if earlier else skipped).append(earlier or relative)
    trend = sorted(trend, key=lambda item: item["month"])[-11:] + [summary]
    result = publish(job, render_report(summary, trend).encode())
    result["recovered"] = recovered
    if skipped:
        result["trend_skipped"] = sorted(skipped)
    return result


def _trend_point(root: storage.Location, path: str, month: str) -> dict[str, Any] | None:
    """An earlier month's published summary.json as the report's trend reads it (`month` and each
    currency's `unallocated`, an amount as `money.parse_amount` reads one: finite, below 10**18), or
    None if it is not one (an unreadable or hand-edited file must not stop this month's report:
    that month is left out of the trend)."""
    try:
        earlier = storage.read_json(root.fs, path)
        currencies = earlier["currencies"]
        points = {currency: {"unallocated": fmt(parse_amount(str(entry["unallocated"])))}
                  for currency, entry in currencies.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ArithmeticError):
        return None
    return {"month": month, "currencies": points}


def publish(job: Job, report_html: bytes) -> dict[str, Any]:
    """Replace OUT/month=M/ by the staged outputs (+ `report_html`) through this attempt's own journal.

    The attempt copies what it publishes into a folder of its own (`publish-<attempt>/`, hard
    links on local disk), so the staged output stays whole for any later attempt; files of the
    old output go to the trash, nothing is deleted; then the work folder goes to the trash too.
    """
    root = job.root
    attempt = f"{storage.new_run_id()}-{job.run_key[:80]}".rstrip("._-")
    staging = f"{job.work}/publish-{attempt}"
    final_dir = f"month={job.month}"
    sources = {root.relative(info.path).removeprefix(f"{job.work}/out/"): info
               for info in storage.list_files(root.child(job.work, "out"), include_hidden=False)}
    sources["allocations.parquet"] = root.fs.get_file_info(job.work_path("allocations.parquet"))
    names = sorted([*sources, "report.html"])
    existing = {root.relative(info.path) for info in storage.list_files(root.child(final_dir))}
    finals = {f"{final_dir}/{name}" for name in names}
    entry = journal.Journal.begin(
        root, attempt, journal_kind(job.month),
        [{"staged": f"{staging}/{name}", "final": f"{final_dir}/{name}", "replace": f"{final_dir}/{name}" in existing}
         for name in names],
        sorted(existing - finals), meta={"month": job.month, "run_key": job.run_key},
    )
    for name, info in sources.items():
        _stage_copy(root, info, root.join(staging, name))
    storage.write_bytes_atomic(root.fs, root.join(staging, "report.html"), report_html)
    _check_lease(job)
    entry.commit()
    _retire_tree(job, "", attempt)  # intermediates (and this attempt's empty staging folder) to the trash
    return {"month": job.month, "published": sorted(finals), "retired": entry.retires, "run_id": attempt,
            "out": root.uri_of(root.join(final_dir))}


def _stage_copy(root: storage.Location, source, target: str) -> None:
    """`source` (a FileInfo) copied to `target` (a hard link on local disk), verified by size."""
    root.fs.create_dir(posixpath.dirname(target), recursive=True)
    if source.type != pafs.FileType.File:
        raise IntegrityError(f"cannot publish {source.path}: the staged file is missing",
                             hint="rerun the month: its stages write it again")
    if root.is_s3:
        root.fs.copy_file(source.path, target)
    else:
        os.link(source.path, target)
    faults.point("cost.staged")
    copied = root.fs.get_file_info(target)
    if copied.size != source.size:
        raise IntegrityError(f"staged copy {target} has {copied.size} bytes, its source {source.size}")


def _check_lease(job: Job) -> None:
    """LeaseLostError unless the month's lease is still ours: called right before the point of no return."""
    record = lease.current(job.root, lease_name(job.month))
    if record is None or record.holder != job.lease_holder:
        raise lease.LeaseLostError(
            f"lease {lease_name(job.month)} of {job.root.uri} is no longer held by {job.lease_holder}: "
            f"{record.describe() if record else 'nobody holds it'}",
            hint="another run took the month over; nothing was published by this one")


STAGES = ("ingest", "allocate", "rules", "statements", "check", "report")


STAGE_FUNCTIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "ingest": ingest_stage, "allocate": allocate_stage, "rules": rules_stage, "statements": statements_stage,
    "check": check_stage, "report": report_stage,
}


def run_stage(stage: str, data: dict[str, Any], *, release: bool = False) -> dict[str, Any]:
    """One stage of `data` (a Job dict) under the month's lease of `data["holder"]`: what a DAG task runs.

    Running it again with the same inputs (Airflow's retry) is safe. `release=False` keeps the
    lease for the next task of the same holder; the last task releases it.
    """
    if stage not in STAGE_FUNCTIONS:
        raise UsageError(f"unknown cost stage {stage!r}", hint="one of " + ", ".join(STAGES))
    with month_lease(_job(data), release=release) as held, reusing_memory():
        try:
            return STAGE_FUNCTIONS[stage](data)
        except SeedanceError as exc:
            if not exc.retryable:  # no retry comes: the month is free for the next run at once
                held.release()
            raise


XCOM_LIST_LIMIT = 100
"""Entries of each list of a stage's summary kept in its Airflow XCom (the metadata DB keeps every one)."""


def xcom_summary(result: dict[str, Any], what: str, limit: int = XCOM_LIST_LIMIT) -> dict[str, Any]:
    """`result` small enough for an XCom or an asset event's extra whatever the month: each list in
    it (or in a dict in it) cut to its first `limit` entries, how many were left out under
    `omitted` ({"key" or "key.sub": count}, only when some were); each cut list is logged whole,
    one entry a line, headed by `what`. Figures and other values stay whole."""
    out, omitted = dict(result), {}

    def cut(name: str, items: list) -> list:
        if len(items) <= limit:
            return items
        omitted[name] = len(items) - limit
        _log.info("%s %s: %d (the XCom shows the first %d):", what, name, len(items), limit)
        for item in items:
            _log.info("  %s", json.dumps(item, default=str, ensure_ascii=False))
        return items[:limit]

    for key, value in result.items():
        if isinstance(value, list):
            out[key] = cut(key, value)
        elif isinstance(value, dict) and key != "job":
            out[key] = {sub: cut(f"{key}.{sub}", item) if isinstance(item, list) else item
                        for sub, item in value.items()}
    if omitted:
        out["omitted"] = {**result.get("omitted", {}), **omitted}
    return out


def recover_month(tagger=None, advance: Callable[[int], None] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Every stage of one month in process (what `seedance cost recover` runs); returns a summary.

    Keyword arguments are those of `describe`; the month's lease is held from the start to the
    end. `advance(1)` (a progress bar's) is called after each of the `STAGES`.
    """
    job = describe(**kwargs)
    data = asdict(job)
    result: dict[str, Any] = {"month": job.month, "backfill": job.backfill, "apply": job.apply}
    stages = {**STAGE_FUNCTIONS, "rules": lambda item: rules_stage(item, tagger=tagger)}
    with month_lease(job) as held, reusing_memory():
        result["lease"] = {"name": lease_name(job.month), "holder": held.record.holder}
        result["recovered"] = journal.recover(job.root, journal_kind(job.month))
        for name in STAGES:
            result[name] = stages[name](data)
            if advance:
                advance(1)
    root = job.root
    result["summary"] = storage.read_json(root.fs, root.join(f"month={job.month}", "summary.json"))
    return result
