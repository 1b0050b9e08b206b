"""One month of cost recovery, as the stages the DAG runs: prepare -> ingest -> allocate -> rules
-> statements -> report (which publishes).

Each stage reads and writes a hidden work folder `OUT/_seedance/cost-work/month=M/<run>/`, so the
stages can run as separate Airflow tasks, and passes a small dict along. Outputs land in
`OUT/month=M/` only at the end, through a journal: staged files are published (the files they
replace are first copied to `OUT/_seedance/trash/<run-id>/`), then files of the old output that
the new one no longer has retire to the trash. Re-running a month gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seedance_tasks import journal, storage
from seedance_tasks.cost.allocate import ALLOCATIONS, Attributor, Totals, in_month, shared_splits
from seedance_tasks.cost.ingest import LINES, month_bounds
from seedance_tasks.cost.money import fmt
from seedance_tasks.cost.owners import load_owners
from seedance_tasks.errors import UsageError

WORK_DIR = f"{storage.SEEDANCE_DIR}/cost-work"


def journal_kind(month: str) -> str:
    """Journals are per month, so runs of different months (a backfill's) never recover each other's."""
    return f"cost-{month}"

MAX_REJECTED = 1000
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

    @cached_property
    def root(self) -> storage.Location:
        return storage.resolve(self.out)

    @property
    def work(self) -> str:
        """The work folder, relative to the output root."""
        return f"{WORK_DIR}/month={self.month}/{self.run_key}"

    def work_path(self, *parts: str) -> str:
        return self.root.join(self.work, *parts)


def _settings():
    from seedance_tasks.config import load_settings

    return load_settings().cost


def last_closed_month(now: datetime) -> str:
    first = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (first - timedelta(days=1)).strftime("%Y-%m")


def prepare(
    *, month: str, billing: str | None = None, out: str | None = None, owners: str | None = None, format: str = "focus",
    basis: str | None = None, apply: bool = False, backfill: bool | None = None,
    utilization: str | None = None, currency: str | None = None, refresh: bool = False,
    run_key: str | None = None, now: datetime | None = None,
) -> dict[str, Any]:
    """Check the arguments, finish interrupted publishes under `out`, and describe the run.

    `backfill=None` decides by the month: older than the last closed month (relative to `now`)
    is a backfill, which never tags, freezes or notifies.
    """
    settings = _settings()
    month_bounds(month)
    if format not in FORMATS:
        raise UsageError(f"unknown billing format {format!r}", hint="use focus, cur or ce")
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
    now = now or datetime.now(UTC)
    if backfill is None:
        backfill = month < last_closed_month(now)
    root = storage.resolve(out)
    journal.recover(root, journal_kind(month))
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", run_key) if run_key else storage.new_run_id(now)
    state = settings.state_uri or root.uri_of(root.join(storage.SEEDANCE_DIR, "cost"))
    job = Job(month, billing, owners, out, format, basis, apply, bool(backfill), utilization, currency,
              refresh, key, state)
    return asdict(job)


def _job(data: dict[str, Any]) -> Job:
    return Job(**data)


def _batches(job: Job, settings, info: dict[str, Any]):
    from seedance_tasks.cost import ingest

    if job.format == "focus":
        yield from ingest.read_focus(job.billing, batch_rows=settings.batch_rows,
                                     default_currency=job.currency or settings.default_currency)
    elif job.format == "cur":
        yield from ingest.read_cur(job.billing, batch_rows=settings.batch_rows)
    else:
        tag = job.billing.removeprefix("ce://").strip("/") or settings.cost_explorer_group_tag
        pages, api = ingest.cost_explorer_pages(job.month, group_tag=tag, cache=storage.resolve(job.state),
                                                refresh=job.refresh)
        api["cost_usd"] = fmt(settings.cost_explorer_page_price * api["pages_queried"])
        info["cost_explorer"] = api
        yield from ingest.read_cost_explorer(pages, group_tag=tag)


def ingest_stage(data: dict[str, Any]) -> dict[str, Any]:
    """Read the billing source, keep the month's valid lines (hidden Parquet), record rejections."""
    job, settings = _job(data), _settings()
    start, end = month_bounds(job.month)
    root = job.root
    path = job.work_path("lines.parquet")
    root.fs.create_dir(posixpath.dirname(path), recursive=True)
    info: dict[str, Any] = {"rows_read": 0, "rows_in_month": 0}
    rejected: list[dict[str, Any]] = []
    rejected_count = 0
    with root.fs.open_output_stream(path) as sink, pq.ParquetWriter(sink, LINES, compression="zstd") as writer:
        for batch, bad in _batches(job, settings, info):
            info["rows_read"] += len(batch) + len(bad)
            for item in bad:
                if item["month"] in (None, job.month):
                    rejected_count += 1
                    if len(rejected) < MAX_REJECTED:
                        rejected.append({key: item[key] for key in ("file", "row", "column", "reason")})
            kept = in_month(batch, start, end)
            info["rows_in_month"] += len(kept)
            if len(kept):
                writer.write_batch(kept)
    info.update(rejected=rejected, rejected_count=rejected_count)
    storage.write_json_atomic(root.fs, job.work_path("ingest.json"), info)
    result = {"rows_read": info["rows_read"], "rows_in_month": info["rows_in_month"], "rejected": rejected_count}
    if "cost_explorer" in info:  # pages queried (and their price) or served from the cache
        result["cost_explorer"] = info["cost_explorer"]
    return result


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
        with root.fs.open_output_stream(job.work_path("allocations.parquet")) as sink, \
                pq.ParquetWriter(sink, ALLOCATIONS, compression="zstd") as writer:
            for batch in pq.ParquetFile(source).iter_batches(batch_size=settings.batch_rows):
                for out in attributor.attribute(batch):
                    totals.add(out)
                    writer.write_batch(out)
    finally:
        source.close()
    result = totals.to_json()
    result["warnings"] = warnings
    result["shared"] = {rule_id: split.details for rule_id, split in sorted(splits.items())}
    result["malformed_tags"] = attributor.malformed_tags[:100]
    storage.write_json_atomic(root.fs, job.work_path("totals.json"), result)
    currencies = totals.currencies()
    return {"lines": totals.lines, "currencies": sorted(currencies), "tag_conflicts": totals.conflicts,
            "unallocated": {cur: fmt(entry["unallocated"]) for cur, entry in currencies.items()}}


def _allocation_batches(job: Job, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """The staged allocations.parquet of `job`, batch by batch, only `columns`."""
    with job.root.fs.open_input_file(job.work_path("allocations.parquet")) as handle:
        yield from pq.ParquetFile(handle).iter_batches(columns=columns)


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
                        state=storage.resolve(job.state), apply=job.apply, backfill=job.backfill, tagger=tagger)
    return {"idle": len(idle), "over_budget": [item["owner"] for item in budgets], "actions": actions}


def _safe(owner: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@-]+", "_", owner).lstrip("._") or "owner"


def statements_stage(data: dict[str, Any]) -> dict[str, Any]:
    """One CSV statement per owner (and one for unallocated) and summary.json, staged."""
    import csv
    import io

    job = _job(data)
    root = job.root
    keys = ["x_Owner", "BillingCurrency", "ServiceName", "x_OwnerSource", "AllocatedMethodId"]
    groups: dict[tuple, list] = {}
    for batch in _allocation_batches(job, [*keys, "x_Cost", "BilledCost"]):
        grouped = pa.Table.from_batches([batch]).group_by(keys, use_threads=False).aggregate(
            [("x_Cost", "sum"), ("BilledCost", "sum"), ("x_Cost", "count")])
        for row in grouped.to_pylist():
            entry = groups.setdefault(tuple(row[key] for key in keys), [Decimal(0), Decimal(0), 0])
            entry[0] += row["x_Cost_sum"]
            entry[1] += row["BilledCost_sum"]
            entry[2] += row["x_Cost_count"]
    per_owner: dict[str | None, list] = {}
    for key in sorted(groups, key=lambda k: tuple("" if part is None else part for part in k)):
        per_owner.setdefault(key[0], []).append((key, groups[key]))
    written = []
    for owner, rows in per_owner.items():
        buffer = io.StringIO()
        out = csv.writer(buffer, lineterminator="\n")
        out.writerow(["month", "owner", "currency", "service", "attributed_by", "allocation_method",
                      "lines", f"charged_{job.basis}", "invoice_BilledCost"])
        totals: dict[str, list] = {}
        for key, (cost, billed, count) in rows:
            out.writerow([job.month, owner or "unallocated", key[1], key[2] or "", key[3] or "", key[4] or "",
                          count, fmt(cost), fmt(billed)])
            entry = totals.setdefault(key[1], [Decimal(0), Decimal(0), 0])
            entry[0] += cost
            entry[1] += billed
            entry[2] += count
        for currency, (cost, billed, count) in sorted(totals.items()):
            out.writerow([job.month, owner or "unallocated", currency, "TOTAL", "", "", count, fmt(cost), fmt(billed)])
        name = "unallocated.csv" if owner is None else f"owner={_safe(owner)}.csv"
        if name in written:  # two owners that only differ in characters a file name cannot hold
            name = f"owner={_safe(owner)}-{hashlib.sha256(owner.encode()).hexdigest()[:8]}.csv"
        storage.write_bytes_atomic(root.fs, job.work_path("out", "statements", name), buffer.getvalue().encode())
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
        "rows_read": ingest["rows_read"],
        "lines": ingest["rows_in_month"],
        "allocated_lines": totals_json["lines"],
        "tag_conflicts": {"count": totals_json["conflicts"], "sample": totals_json["conflict_sample"]},
        "malformed_tags_rows": totals_json["malformed_tags"],
        "shared": totals_json["shared"],
        "warnings": totals_json["warnings"],
        "estimated": totals_json["estimated"] or bool(ingest.get("cost_explorer", {}).get("estimated")),
        "by_service": _by_service(totals_json),
        "idle": findings["idle"],
        "over_budget": findings["over_budget"],
    }
    for currency, entry in summary["currencies"].items():  # the invariant, checked before anything is published
        allocated = sum((Decimal(v) for v in entry["by_owner"].values()), Decimal(entry["unallocated"]))
        if allocated != Decimal(entry["total"]):
            from seedance_tasks.errors import IntegrityError

            raise IntegrityError(f"{job.month} {currency}: owners + unallocated {allocated} != total {entry['total']}")
    storage.write_json_atomic(root.fs, job.work_path("out", "summary.json"), summary)
    return {"statements": len(written), "currencies": {c: e["total"] for c, e in summary["currencies"].items()}}


def _by_service(totals_json: dict[str, Any]) -> dict[str, dict[str, str]]:
    result: dict[str, dict[str, str]] = {}
    for currency, service, amount in totals_json["by_service"]:
        result.setdefault(currency, {})[service or "(none)"] = fmt(Decimal(amount))
    return result


def report_stage(data: dict[str, Any]) -> dict[str, Any]:
    """Write report.html, then publish the month's outputs atomically (old ones to the trash)."""
    from seedance_tasks.cost.report import render_report

    job = _job(data)
    root = job.root
    if not storage.is_file(root.fs, job.work_path("out", "summary.json")):  # a retry after publishing
        return publish(job)
    summary = storage.read_json(root.fs, job.work_path("out", "summary.json"))
    trend = []
    for info in storage.list_files(root):
        relative = root.relative(info.path)
        match = re.fullmatch(r"month=(\d{4}-\d{2})/summary\.json", relative)
        if match and match.group(1) < job.month:
            trend.append(storage.read_json(root.fs, info.path))
    trend = sorted(trend, key=lambda item: item["month"])[-11:] + [summary]
    html = render_report(summary, trend)
    storage.write_bytes_atomic(root.fs, job.work_path("out", "report.html"), html.encode())
    if storage.is_file(root.fs, job.work_path("allocations.parquet")):  # a retried task finds it moved
        storage.move(root.fs, job.work_path("allocations.parquet"), job.work_path("out", "allocations.parquet"))
    return publish(job)


def publish(job: Job) -> dict[str, Any]:
    """Replace OUT/month=M/ by the staged outputs through a journal; nothing is deleted."""
    root = job.root
    staged_root = root.child(job.work, "out")
    final_dir = f"month={job.month}"
    staged = [staged_root.relative(info.path) for info in storage.list_files(staged_root)]
    if "summary.json" not in staged:  # published already (a retried task): never retire on an empty stage
        return {"month": job.month, "published": [], "retired": [], "run_id": None,
                "out": root.uri_of(root.join(final_dir)), "note": "nothing staged: already published"}
    finals = {f"{final_dir}/{name}" for name in staged}
    existing = [root.relative(info.path) for info in storage.list_files(root.child(final_dir))]
    run_id = storage.new_run_id()
    entry = journal.Journal.begin(
        root, run_id, journal_kind(job.month),
        [{"staged": f"{job.work}/out/{name}", "final": f"{final_dir}/{name}"} for name in staged],
        [path for path in existing if path not in finals],
        meta={"month": job.month},
    )
    for path in existing:  # keep the version about to be overwritten
        if path in finals:
            target = root.join(storage.TRASH_DIR, run_id, path)
            root.fs.create_dir(posixpath.dirname(target), recursive=True)
            root.fs.copy_file(root.join(path), target)
    entry.commit()
    for info in storage.list_files(root.child(job.work), include_hidden=True):  # intermediates to the trash
        storage.move_to_trash(root, root.relative(info.path), run_id)
    if not root.is_s3 and not storage.list_files(root.child(job.work), include_hidden=True):
        root.fs.delete_dir(root.join(job.work))  # only empty folders are left there
    return {"month": job.month, "published": sorted(finals), "retired": entry.retires, "run_id": run_id,
            "out": root.uri_of(root.join(final_dir))}


STAGES = ("ingest", "allocate", "rules", "statements", "report")


def recover_month(tagger=None, advance: Callable[[int], None] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Every stage of one month in process (what `seedance cost recover` runs); returns a summary.

    Keyword arguments are those of `prepare`; `advance(1)` (a progress bar's) is called after
    each of the `STAGES`.
    """
    job = prepare(**kwargs)
    result: dict[str, Any] = {"month": job["month"], "backfill": job["backfill"], "apply": job["apply"]}
    stages = {"ingest": ingest_stage, "allocate": allocate_stage,
              "rules": lambda data: rules_stage(data, tagger=tagger),
              "statements": statements_stage, "report": report_stage}
    for name in STAGES:
        result[name] = stages[name](job)
        if advance:
            advance(1)
    root = storage.resolve(job["out"])
    result["summary"] = storage.read_json(root.fs, root.join(f"month={job['month']}", "summary.json"))
    return result
