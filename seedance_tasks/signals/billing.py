"""Billing signals, on the cost pipeline's normalised FOCUS lines: egress-jump,
idle-provisioned-iops, idle-vcpu-spend, cost-surge, unallocated-share. Money stays Decimal."""

from __future__ import annotations

import statistics
from datetime import date, timedelta
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from seedance_tasks.cost.money import display
from seedance_tasks.signals.model import Finding, Skipped, dollars, require_metrics, severity_for
from seedance_tasks.signals.sources import daily, in_days, increase

HUNDRED = Decimal(100)
WINDOW = 28  # "the trailing four weeks"


def _currencies(billing: pa.Table):
    """(currency, its lines) per currency; one currency (the usual case) costs no copy."""
    currencies = sorted(pc.unique(billing["currency"]).to_pylist())
    if len(currencies) == 1:
        yield currencies[0], billing
        return
    for currency in currencies:
        yield currency, billing.filter(pc.equal(billing["currency"], currency))


def _lines_in(inputs, start: date, end: date) -> pa.Table:
    """The billing lines; Skipped when none is dated in [start, end), the window a rule looks at."""
    billing = inputs.billing
    if not in_days(billing, start, end, ["cost"]).num_rows:
        raise Skipped(f"no billing lines in the window {start}..{end - timedelta(days=1)}")
    return billing


def _of_kind(table: pa.Table, kind: str) -> pa.Table:
    return table.filter(pc.equal(table["kind"], kind))


def _total(table: pa.Table, start: date, end: date, value: str = "cost") -> Decimal:
    """Sum of `value` over the days in [start, end), as a Decimal."""
    total = pc.sum(in_days(table, start, end, [value]).column(value)).as_py()
    return Decimal(0) if total is None else Decimal(str(total))


def _change(now: Decimal, before: Decimal) -> Decimal | None:
    return None if before == 0 else (now - before) / before * HUNDRED


class EgressJump:
    id = "egress-jump"
    family = "billing"
    needs = ("billing",)
    metrics: tuple[str, ...] = ()
    description = ("data-transfer-out cost up >= 40% over the trailing four weeks against the four before, "
                   "while object-storage request quantity moved < 10%")

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        end, mid = day + timedelta(days=1), day + timedelta(days=1 - WINDOW)
        start = mid - timedelta(days=WINDOW)
        findings = []
        for currency, lines in _currencies(_lines_in(inputs, start, end)):
            egress, requests = _of_kind(lines, "egress"), _of_kind(lines, "requests")
            requests_now, requests_before = _total(requests, mid, end, "quantity"), _total(requests, start, mid, "quantity")
            # no request lines in either window: unchanged; appeared from none: moved without bound
            moved = _change(requests_now, requests_before) if requests_before else (None if requests_now else Decimal(0))
            for (service,), days in sorted(daily(egress, ["service"], start, end).items(), key=str):
                now = sum((v for d, v in days.items() if d >= mid), Decimal(0))
                before = sum((v for d, v in days.items() if d < mid), Decimal(0))
                jump = _change(now, before)
                if jump is None or jump < settings.egress_jump_percent:
                    continue
                if moved is None or abs(moved) >= settings.egress_requests_max_change_percent:
                    continue
                at_stake = dollars((now - before) * 30 / WINDOW, currency)
                findings.append(Finding(
                    self.id, f"{service}", severity_for(at_stake, settings),
                    f"{service}: data transfer out {jump:.0f}% up in four weeks while requests moved {moved:.1f}%: "
                    "cross-region replication or uncompressed transfer?",
                    {"egress_now": str(now), "egress_before": str(before), "jump_percent": round(float(jump), 1),
                     "requests_now": float(requests_now), "requests_before": float(requests_before),
                     "requests_change_percent": round(float(moved), 1)},
                    at_stake, currency,
                ))
        return findings


class IdleProvisionedIops:
    id = "idle-provisioned-iops"
    family = "billing"
    needs = ("billing", "metrics")
    metrics = ("node_disk_reads_completed_total", "node_disk_writes_completed_total")
    description = "provisioned-IOPS charges of volumes whose measured IOPS stay below 10% of provisioned"

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        end, start = day + timedelta(days=1), day + timedelta(days=1 - WINDOW)
        billing = _lines_in(inputs, start, end)
        require_metrics(inputs, self.metrics, day)
        measured: dict[str, float] = {}
        for name in self.metrics:
            for series in inputs.metric_series(name, day):
                volume = series.labels.get(settings.volume_label)
                if volume and len(series.ts) > 1:
                    span = series.ts[-1] - series.ts[0]
                    measured[volume] = measured.get(volume, 0.0) + increase(series) / span
        findings = []
        for currency, lines in _currencies(billing):
            piops = _of_kind(lines, "piops")
            costs = daily(piops, ["resource"], start, end)
            quantities = daily(piops, ["resource"], start, end, "quantity")
            for (resource,), days in sorted(costs.items(), key=str):
                if resource not in measured:
                    continue
                # IOPS-month lines: their quantity over a month is the provisioned IOPS
                provisioned = sum(quantities[(resource,)].values()) * 30 / len(days)
                if provisioned <= 0:
                    continue
                share = Decimal(str(measured[resource] / provisioned * 100))
                if share >= settings.idle_iops_percent:
                    continue
                monthly = sum(days.values(), Decimal(0)) * 30 / len(days)
                at_stake = dollars(monthly * (1 - share / HUNDRED), currency)
                findings.append(Finding(
                    self.id, resource, severity_for(at_stake, settings),
                    f"{resource}: {measured[resource]:.0f} IOPS measured of {provisioned:.0f} provisioned "
                    f"({share:.1f}%): lower the provisioned IOPS",
                    {"provisioned_iops": round(provisioned, 1), "measured_iops": round(measured[resource], 1),
                     "share_percent": round(float(share), 2), "monthly_piops_cost": str(dollars(monthly, currency))},
                    at_stake, currency,
                ))
        return findings


class IdleVcpuSpend:
    id = "idle-vcpu-spend"
    family = "billing"
    needs = ("billing", "metrics")
    metrics = ("node_cpu_seconds_total",)
    description = "compute spend of a resource rising while its CPU utilisation stays < 30%"

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        end, mid = day + timedelta(days=1), day - timedelta(days=6)
        billing = _lines_in(inputs, mid - timedelta(days=7), end)
        require_metrics(inputs, self.metrics, day)
        usage: dict[str, dict] = {}
        for series in inputs.metric_series("node_cpu_seconds_total", day):
            group = series.labels.get(settings.group_label)
            if not group:
                continue
            entry = usage.setdefault(group, {"idle": 0.0, "all": 0.0, "cpus": set(), "type": None})
            seconds = increase(series)
            entry["all"] += seconds
            entry["cpus"].add(series.labels.get("cpu"))
            entry["type"] = entry["type"] or series.labels.get("instance_type")
            if series.labels.get("mode") == "idle":
                entry["idle"] += seconds
        findings = []
        for currency, lines in _currencies(billing):
            for (resource,), days in sorted(daily(_of_kind(lines, "compute"), ["resource"], mid - timedelta(days=7),
                                                  end).items(), key=str):
                entry = usage.get(resource)
                if not entry or entry["all"] <= 0:
                    continue
                now = sum((v for d, v in days.items() if d >= mid), Decimal(0))
                before = sum((v for d, v in days.items() if d < mid), Decimal(0))
                rise = _change(now, before)
                util = Decimal(str(round((1 - entry["idle"] / entry["all"]) * 100, 2)))
                if rise is None or rise < settings.vcpu_spend_rise_percent or util >= settings.idle_vcpu_percent:
                    continue
                monthly = now * 30 / 7
                evidence = {"cpu_percent": float(util), "spend_last_7d": str(now), "spend_prior_7d": str(before),
                            "rise_percent": round(float(rise), 1), "vcpus": len(entry["cpus"])}
                at_stake = dollars(monthly * (1 - util / settings.target_cpu_percent), currency)
                advice = "right-size it"
                fitting = _cheaper_size(entry["type"], len(entry["cpus"]), util, settings)
                if fitting:
                    name, size, current = fitting
                    evidence.update({"instance_type": entry["type"], "cheaper_fit": name, "cheaper_vcpus": size.vcpus})
                    at_stake = dollars((current.hourly - size.hourly) * 730, currency)
                    advice = f"{entry['type']} -> {name} fits"
                findings.append(Finding(
                    self.id, resource, severity_for(at_stake, settings),
                    f"{resource}: compute spend up {rise:.0f}% at {util:.0f}% CPU: {advice}", evidence, at_stake,
                    currency,
                ))
        return findings


def _cheaper_size(current_type: str | None, vcpus: int, util: Decimal, settings):
    """(name, size, current size) of the cheapest configured size that fits the used vCPUs."""
    table = settings.price_table
    if not current_type or current_type not in table:
        return None
    current = table[current_type]
    needed = Decimal(vcpus or current.vcpus) * util / settings.target_cpu_percent
    fits = [(size.hourly, name, size) for name, size in table.items()
            if size.vcpus >= needed and size.hourly < current.hourly]
    if not fits:
        return None
    _, name, size = min(fits)
    return name, size, current


class CostSurge:
    id = "cost-surge"
    family = "billing"
    needs = ("billing",)
    metrics: tuple[str, ...] = ()
    description = ("a service's or owner's daily spend above median + k x MAD of its trailing 28 days, "
                   "without a matching rise of its usage quantity")

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        start, end = day - timedelta(days=WINDOW), day + timedelta(days=1)
        findings = []
        for currency, lines in _currencies(_lines_in(inputs, start, end)):
            for dimension in ("service", "owner"):
                costs = daily(lines, [dimension], start, end)
                quantities = daily(lines, [dimension], start, end, "quantity")
                for (name,), days in sorted(costs.items(), key=str):
                    if name is None or day not in days:
                        continue
                    history = [days.get(day - timedelta(days=n), Decimal(0)) for n in range(1, WINDOW + 1)]
                    median = statistics.median(history)
                    mad = statistics.median([abs(value - median) for value in history])
                    today = days[day]
                    if today <= median + settings.surge_k * mad or today < median * (1 + settings.surge_min_percent / HUNDRED):
                        continue
                    used = quantities[(name,)]
                    usage_median = statistics.median([used.get(day - timedelta(days=n), 0.0) for n in range(1, WINDOW + 1)])
                    usage_today = used.get(day, 0.0)
                    if usage_median > 0 and usage_today > usage_median * (1 + float(settings.surge_usage_percent) / 100):
                        continue  # the usage rose too: a business peak, not a leak
                    at_stake = dollars((today - median) * 30, currency)
                    findings.append(Finding(
                        self.id, f"{dimension}={name}", severity_for(at_stake, settings),
                        f"{dimension} {name}: {display(today, currency)} on {day} against a median of "
                        f"{display(median, currency)} (MAD {display(mad, currency)}) with usage flat",
                        {"spend": str(today), "median": str(median), "mad": str(mad), "k": str(settings.surge_k),
                         "usage": usage_today, "usage_median": usage_median},
                        at_stake, currency, owner=name if dimension == "owner" else None,
                    ))
        return findings


class UnallocatedShare:
    id = "unallocated-share"
    family = "billing"
    needs = ("billing",)
    metrics: tuple[str, ...] = ()
    description = "spend without an owner above 5% of the month"

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        start, end = day.replace(day=1), day + timedelta(days=1)
        findings = []
        for currency, lines in _currencies(_lines_in(inputs, start, end)):
            window = in_days(lines, start, end, ["cost", "owner"])
            total = _total(window, start, end)
            unowned = _total(window.filter(pc.is_null(window["owner"])), start, end)
            if total <= 0:
                continue
            share = unowned / total * HUNDRED
            if share <= settings.unallocated_percent:
                continue
            month = f"{day:%Y-%m}"
            at_stake = dollars(unowned * 30 / day.day, currency)
            findings.append(Finding(
                self.id, f"{month}:{currency}", severity_for(at_stake, settings),
                f"{share:.1f}% of {month}'s spend has no owner: tag it or add a CMDB rule",
                {"unowned": str(unowned), "total": str(total), "share_percent": round(float(share), 2)},
                at_stake, currency, fix={"dag_id": "seedance_cost_recovery", "conf": {"month": month}},
            ))
        return findings

