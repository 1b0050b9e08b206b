"""Responsibility rules: idle resources (technical) and over-budget owners (financial).

Both evaluate to a deterministic list of findings for the month (written to the summary), and
then to side effects -- tagging `cost-review=pending` through the resource tagging API, removing
it from resources active again, freezing next month's quota in the quota ledger, notifying
owners -- which happen only with `apply`, never in a backfill, and at most once each.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from seedance_tasks import storage
from seedance_tasks.cost.ingest import decode_text
from seedance_tasks.cost.money import display, fmt
from seedance_tasks.cost.notify import Ledger, Notifier, state_lease
from seedance_tasks.cost.owners import OwnersFile
from seedance_tasks.errors import InputError


@dataclass
class Datapoint:
    cpu: Decimal | None
    network: Decimal | None  # in + out bytes; None if either is missing
    gpu: Decimal | None


UTILIZATION_HINT = ("each row: resource_id, date (YYYY-MM-DD), cpu_percent, network_in_bytes, network_out_bytes "
                    "(numbers >= 0, or empty for a missing datapoint); optional gpu_percent, is_gpu, "
                    "created (YYYY-MM-DD), owner")


def _number(text: str) -> Decimal | None:
    """A utilization value: None for an empty, NULL or NaN cell; ValueError unless a number >= 0."""
    if not text or text.upper() in ("NULL", "NAN"):
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"not a number: {text!r}") from None
    if not value.is_finite():
        raise ValueError(f"not a finite number: {text!r}")
    if value < 0:
        raise ValueError(f"negative: {text!r}")
    return value


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a YYYY-MM-DD date: {text!r}") from None


def _required(text: str) -> str:
    if not text:
        raise ValueError("missing (a short row?)")
    return text


_UTILIZATION_CELLS = {
    "resource_id": _required, "date": lambda text: _day(_required(text)), "cpu_percent": _number,
    "network_in_bytes": _number, "network_out_bytes": _number, "gpu_percent": _number,
    "created": lambda text: _day(text) if text else None,
}
"""How each utilization column is read; ValueError says what is wrong with a cell."""


def _utilization_row(row: dict[str, str | None]) -> tuple[str, date, Datapoint, dict[str, str]]:
    """(resource, day, datapoint, attributes) of one CSV row; ValueError(column, reason) for a bad cell."""
    cells = {key: (value or "").strip() for key, value in row.items() if isinstance(key, str)}
    values: dict[str, Any] = {}
    for column, read in _UTILIZATION_CELLS.items():
        try:
            values[column] = read(cells.get(column, ""))
        except ValueError as exc:
            raise ValueError(column, str(exc)) from None
    inbound, outbound = values["network_in_bytes"], values["network_out_bytes"]
    point = Datapoint(values["cpu_percent"], None if inbound is None or outbound is None else inbound + outbound,
                      values["gpu_percent"])
    attrs = {key: cells[key] for key in ("is_gpu", "created", "owner") if cells.get(key)}
    return values["resource_id"], values["date"], point, attrs


def read_utilization(uri: str) -> tuple[dict[str, dict[date, Datapoint]], dict[str, dict[str, str]]]:
    """Daily datapoints per resource from a CSV, and per-resource attributes.

    Columns: resource_id, date (YYYY-MM-DD), cpu_percent, network_in_bytes, network_out_bytes,
    and optionally gpu_percent, is_gpu, created (YYYY-MM-DD), owner. An empty cell is a missing
    datapoint, not a zero. A malformed row (a short row, a bad date, a value that is not a number
    >= 0) is an InputError naming the file, its data row and column.
    """
    location = storage.resolve(uri)
    try:
        text = decode_text(storage.read_bytes(location.fs, location.path))
    except (FileNotFoundError, OSError) as exc:
        raise InputError(f"utilization file not readable: {uri} ({exc})", hint="check --utilization") from None
    except ValueError as exc:
        raise InputError(f"utilization file {uri}: {exc}", hint="save it as UTF-8 text (UTF-16 with a byte-order "
                         "mark is read too)") from None
    points: dict[str, dict[date, Datapoint]] = defaultdict(dict)
    attributes: dict[str, dict[str, str]] = {}
    try:
        for number, row in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=1):
            try:
                resource, day, point, attrs = _utilization_row(row)
            except ValueError as exc:
                column, reason = exc.args
                raise InputError(f"utilization file {uri}, row {number}, column {column}: {reason}",
                                 hint=UTILIZATION_HINT) from None
            points[resource][day] = point
            attributes.setdefault(resource, {}).update(attrs)
    except csv.Error as exc:
        raise InputError(f"utilization file {uri}: not CSV ({exc})", hint=UTILIZATION_HINT) from None
    return dict(points), attributes


def idle_findings(
    points: dict[str, dict[date, Datapoint]], attributes: dict[str, dict[str, str]], as_of: date, settings
) -> tuple[list[dict[str, Any]], list[str]]:
    """(idle resources, active resources) as of the day after the window's last day.

    Idle: a datapoint for every one of the `idle_days` days before `as_of`, each with CPU below
    `idle_cpu_percent` and network in+out of 0. A missing day means "don't know", never idle.
    Exempt: resources created less than `min_resource_age` before `as_of`, and GPU nodes whose
    GPU reached `gpu_busy_percent`. Active: any datapoint in the window with CPU at or above the
    threshold or any network traffic.
    """
    days = [as_of - timedelta(days=offset) for offset in range(settings.idle_days, 0, -1)]
    min_age = timedelta(seconds=settings.min_resource_age)
    idle, active = [], []
    for resource in sorted(points):
        series = points[resource]
        window = [series.get(day) for day in days]
        seen = [point for point in window if point is not None]
        if any((p.cpu is not None and p.cpu >= settings.idle_cpu_percent) or (p.network or 0) > 0 for p in seen):
            active.append(resource)
            continue
        attrs = attributes.get(resource, {})
        created = attrs.get("created")
        if created and as_of - date.fromisoformat(created) < min_age:
            continue
        if any(p.gpu is not None and p.gpu >= settings.gpu_busy_percent for p in seen):
            continue
        if any(p is None or p.cpu is None or p.network is None for p in window):
            continue
        idle.append({
            "resource_id": resource,
            "max_cpu_percent": fmt(max(p.cpu for p in seen)),
            "days": len(days),
            "owner_hint": attrs.get("owner"),
        })
    return idle, active


def budget_findings(
    owners: OwnersFile, currencies: dict[str, dict[str, Any]], month: str, overbudget_percent: Decimal
) -> list[dict[str, Any]]:
    """Owners whose spend exceeds their budget by strictly more than `overbudget_percent` percent.

    Each finding says whether an approval covers that month and amount (then nothing is frozen).
    """
    findings = []
    for owner, budget in sorted(owners.budgets.items()):
        spend = currencies.get(budget.currency, {}).get("by_owner", {}).get(owner, Decimal(0))
        limit = budget.amount * (1 + overbudget_percent / 100)
        if spend <= limit:
            continue
        approval = next(
            (a for a in owners.approvals
             if a.owner == owner and a.currency == budget.currency and a.from_month <= month <= a.to_month
             and spend <= a.up_to),
            None,
        )
        findings.append({
            "owner": owner, "currency": budget.currency, "spend": fmt(spend), "budget": fmt(budget.amount),
            "over_percent": fmt(round((spend / budget.amount - 1) * 100, 2)) if budget.amount else None,
            "approved": approval is not None,
            "approval": None if approval is None else {"from_month": approval.from_month, "to_month": approval.to_month,
                                                         "up_to": fmt(approval.up_to)},
        })
    return findings


def over_text(finding: dict[str, Any]) -> str:
    """How far over its budget an over-budget finding is, as a person reads it: ` (+12.5%)`, or
    nothing for a zero budget (no percentage of it)."""
    over = finding.get("over_percent")
    return "" if over is None else f" (+{over}%)"


def next_month(month: str) -> str:
    year, number = int(month[:4]), int(month[5:7])
    return f"{year + number // 12}-{number % 12 + 1:02d}"


class Tagger:
    """Puts and removes the review tag through the resource tagging API (only ARNs can be tagged)."""

    def __init__(self, key: str, value: str, client=None):
        self.key, self.value = key, value
        self.client = client or storage.boto3_client("resourcegroupstaggingapi")

    def pending(self) -> set[str]:
        """ARNs that carry the review tag now."""
        found, token = set(), ""
        while True:
            page = self.client.get_resources(
                TagFilters=[{"Key": self.key, "Values": [self.value]}], PaginationToken=token
            )
            found.update(item["ResourceARN"] for item in page.get("ResourceTagMappingList", []))
            token = page.get("PaginationToken") or ""
            if not token:
                return found

    def _each(self, arns: list[str], call) -> dict[str, str]:
        failed = {}
        for index in range(0, len(arns), 20):  # TagResources/UntagResources take 20 ARNs a call
            response = call(arns[index:index + 20])
            for arn, error in (response.get("FailedResourcesMap") or {}).items():
                failed[arn] = error.get("ErrorMessage") or error.get("ErrorCode") or "failed"
        return failed

    def tag(self, arns: list[str]) -> dict[str, str]:
        return self._each(arns, lambda chunk: self.client.tag_resources(
            ResourceARNList=chunk, Tags={self.key: self.value}))

    def untag(self, arns: list[str]) -> dict[str, str]:
        return self._each(arns, lambda chunk: self.client.untag_resources(ResourceARNList=chunk, TagKeys=[self.key]))


def act(
    *, month: str, idle: list[dict[str, Any]], active: list[str], budgets: list[dict[str, Any]],
    settings, state: storage.Location, apply: bool, backfill: bool, tagger: Tagger | None = None,
    owners: OwnersFile | None = None, root: storage.Location | None = None,
) -> dict[str, Any]:
    """Carry out (apply) or plan (dry-run) the findings' side effects; nothing at all in a backfill.

    Idempotent: a resource already tagged is not tagged or notified again; a quota already
    frozen for that month is not frozen or notified again. The notification state and the quota
    ledger are written under `notify.state_lease` on `root` (the cost outputs root; default
    `state`), so the actions workflow notifying at the same time loses nothing. Returns what was
    done and planned.
    """
    actions: dict[str, Any] = {"mode": "backfill" if backfill else "apply" if apply else "dry-run",
                               "tagged": [], "untagged": [], "frozen": [], "notified": [], "planned": [],
                               "failed": {}}
    if backfill:
        actions["planned"] = ["none: a backfill never tags, freezes or notifies"]
        return actions
    arns = [item["resource_id"] for item in idle if item["resource_id"].startswith("arn:")]
    freeze = [item for item in budgets if not item["approved"]]
    if not apply:
        actions["planned"] = (
            [f"tag {arn} {settings.review_tag_key}={settings.review_tag_value}" for arn in arns]
            + [f"untag {arn} if tagged" for arn in active if arn.startswith("arn:")]
            + [f"freeze {item['owner']}'s quota for {next_month(month)}" for item in freeze]
        )
        return actions
    failed: dict[str, str] = {}
    if arns or active:
        tagger = tagger or Tagger(settings.review_tag_key, settings.review_tag_value)
        tagged_now = tagger.pending()
        to_tag = [arn for arn in arns if arn not in tagged_now]
        to_untag = sorted(arn for arn in active if arn in tagged_now)
        failed = tagger.tag(to_tag) if to_tag else {}
        failed.update(tagger.untag(to_untag) if to_untag else {})
        actions["failed"] = failed
        actions["tagged"] = [arn for arn in to_tag if arn not in failed]
        actions["untagged"] = [arn for arn in to_untag if arn not in failed]
    if not (arns or actions["untagged"] or freeze):
        return actions
    with state_lease(root or state, settings.actions.lock_wait):
        _record_and_notify(actions, month=month, idle=idle, arns=[arn for arn in arns if arn not in failed],
                           freeze=freeze, settings=settings, state=state, owners=owners)
    return actions


def _record_and_notify(actions: dict[str, Any], *, month: str, idle: list[dict[str, Any]], arns: list[str],
                       freeze: list[dict[str, Any]], settings, state: storage.Location,
                       owners: OwnersFile | None) -> None:
    """`act`'s writes to the notification state and the quota ledger (under their lease)."""
    notifier = Notifier(state, settings.notifier, settings.notifier_kwargs, owners=owners)
    for arn in actions["untagged"]:
        notifier.forget(f"idle:{arn}")
    if arns:
        owner_of = {item["resource_id"]: item.get("owner") or item.get("owner_hint") or "unallocated" for item in idle}
        for arn in arns:
            sent = notifier.send(
                f"idle:{arn}", owner_of[arn], f"Idle resource {arn} flagged for cost review",
                f"{arn} had CPU below {settings.idle_cpu_percent}% and no network traffic on each of the last "
                f"{settings.idle_days} days of {month}; it is tagged {settings.review_tag_key}="
                f"{settings.review_tag_value}. Stop it, or use it: the tag goes away once it is active.",
                {"month": month, "resource_id": arn},
            )
            if sent:
                actions["notified"].append(f"idle:{arn}")
    quota = Ledger(state, "quota-ledger.json")
    for item in freeze:
        target = next_month(month)
        key = f"{item['owner']}:{target}"
        if key not in quota:
            quota.record(key, {"owner": item["owner"], "quota_month": target, "because_month": month,
                               "spend": item["spend"], "budget": item["budget"], "currency": item["currency"],
                               "roi_document": "requested", "at": datetime.now().astimezone().isoformat()})
            actions["frozen"].append(key)
        sent = notifier.send(
            f"budget:{item['owner']}:{month}", item["owner"], f"Over budget in {month}: {target} quota frozen",
            f"{item['owner']} spent {display(item['spend'], item['currency'])} in {month} against a budget of "
            f"{display(item['budget'], item['currency'])}{over_text(item)}. The {target} quota is frozen until an "
            "ROI document is approved.",
            {"month": month, **item},
        )
        if sent:
            actions["notified"].append(f"budget:{item['owner']}:{month}")


def instance_id(resource_id: str) -> str | None:
    """The EC2 instance id of a resource id (`i-…` or an `…:instance/i-…` ARN), else None."""
    tail = resource_id.rsplit("/", 1)[-1]
    return tail if tail.startswith("i-") and (resource_id == tail or ":instance/" in resource_id) else None


def cloudwatch_utilization(
    resource_ids: list[str], as_of: date, days: int, client=None
) -> tuple[dict[str, dict[date, Datapoint]], dict[str, dict[str, str]]]:
    """Daily datapoints of EC2 instances from CloudWatch (`GetMetricData`), like `read_utilization`.

    Per instance and day: CPUUtilization Maximum, NetworkIn + NetworkOut Sums. A day CloudWatch
    has no value for stays missing (never zero). Resources that are not EC2 instances are skipped.
    """
    client = client or storage.boto3_client("cloudwatch")
    start = datetime(as_of.year, as_of.month, as_of.day) - timedelta(days=days)
    end = datetime(as_of.year, as_of.month, as_of.day)
    instances = {resource: instance_id(resource) for resource in resource_ids}
    instances = {resource: iid for resource, iid in instances.items() if iid}
    values: dict[str, dict[str, dict[date, Decimal]]] = defaultdict(lambda: defaultdict(dict))
    queries = []
    for index, (resource, iid) in enumerate(sorted(instances.items())):
        for metric, stat in (("CPUUtilization", "Maximum"), ("NetworkIn", "Sum"), ("NetworkOut", "Sum")):
            queries.append(({
                "Id": f"m{index}_{metric.lower()}",
                "MetricStat": {"Metric": {"Namespace": "AWS/EC2", "MetricName": metric,
                                          "Dimensions": [{"Name": "InstanceId", "Value": iid}]},
                               "Period": 86400, "Stat": stat},
                "ReturnData": True,
            }, resource, metric))
    for offset in range(0, len(queries), 500):  # GetMetricData takes 500 queries a call
        chunk = queries[offset:offset + 500]
        by_id = {query["Id"]: (resource, metric) for query, resource, metric in chunk}
        token = None
        while True:
            kwargs = {"MetricDataQueries": [query for query, _, _ in chunk], "StartTime": start, "EndTime": end}
            response = client.get_metric_data(**kwargs, **({"NextToken": token} if token else {}))
            for result in response.get("MetricDataResults", []):
                resource, metric = by_id[result["Id"]]
                for stamp, value in zip(result.get("Timestamps", []), result.get("Values", []), strict=False):
                    values[resource][metric][stamp.date()] = Decimal(repr(value))
            token = response.get("NextToken")
            if not token:
                break
    points: dict[str, dict[date, Datapoint]] = {}
    for resource in sorted(instances):
        series = values.get(resource, {})
        days_seen = set().union(*(set(by_day) for by_day in series.values())) if series else set()
        points[resource] = {}
        for day in sorted(days_seen):
            inbound, outbound = series.get("NetworkIn", {}).get(day), series.get("NetworkOut", {}).get(day)
            points[resource][day] = Datapoint(
                series.get("CPUUtilization", {}).get(day),
                None if inbound is None or outbound is None else inbound + outbound,
                None,
            )
    return points, {}
