"""Responsibility rules: idle resources (with missing datapoints, young and GPU-busy exemptions),
over budget (the exact 20% boundary, approvals), and their side effects: dry-run vs apply of
tagging against the loopback AWS server, idempotence, untagging, no re-freeze in backfills."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from seedance_tasks import storage
from seedance_tasks.config import load_settings
from seedance_tasks.cost import rules
from seedance_tasks.cost.owners import OwnersFile
from seedance_tasks.cost.recover import recover_month
from tests.cost.helpers import line, write_focus, write_owners

SETTINGS = load_settings().cost
AS_OF = date(2024, 10, 1)  # the day after September


def _utilization(path, series: dict[str, list[tuple]], extra: dict[str, dict] | None = None):
    """series: resource -> [(day, cpu, net_in, net_out, gpu)] with None for a missing value."""
    lines = ["resource_id,date,cpu_percent,network_in_bytes,network_out_bytes,gpu_percent,is_gpu,created,owner"]
    for resource, points in series.items():
        attrs = (extra or {}).get(resource, {})
        for day, cpu, net_in, net_out, gpu in points:
            cells = [resource, day.isoformat(), *("" if v is None else str(v) for v in (cpu, net_in, net_out, gpu)),
                     attrs.get("is_gpu", ""), attrs.get("created", ""), attrs.get("owner", "")]
            lines.append(",".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def _week(cpu="1.5", net_in="0", net_out="0", gpu=None, days=7, end=AS_OF):
    return [(end - timedelta(days=offset), cpu, net_in, net_out, gpu) for offset in range(days, 0, -1)]


def test_idle_rule_flags_only_fully_observed_quiet_resources(tmp_path):
    week = _week()
    series = {
        "idle": week,
        "busy-cpu": week[:-1] + [(AS_OF - timedelta(days=1), "5", "0", "0", None)],  # 5% is not < 5%
        "chatty": week[:3] + [(AS_OF - timedelta(days=4), "1", "0", "1", None)] + week[4:],
        "gap": week[:2] + week[3:],  # a missing day is not a zero
        "blank-cpu": week[:-1] + [(AS_OF - timedelta(days=1), None, "0", "0", None)],
        "young": week,
        "gpu-busy": _week(gpu="80"),
        "gpu-idle": _week(gpu="0"),
        "old-data": _week(end=AS_OF - timedelta(days=3)),  # last 3 days missing
    }
    extra = {"young": {"created": (AS_OF - timedelta(days=3)).isoformat()}}
    points, attrs = rules.read_utilization(str(_utilization(tmp_path / "u.csv", series, extra)))
    idle, active = rules.idle_findings(points, attrs, AS_OF, SETTINGS)
    assert [item["resource_id"] for item in idle] == ["gpu-idle", "idle"]
    assert active == ["busy-cpu", "chatty"]


def _owners(**content):
    content.setdefault("owner_tags", ["owner"])
    return OwnersFile.model_validate(content)


def _currencies(spend):
    return {"USD": {"by_owner": {"ml": Decimal(spend)}}}


def test_over_budget_is_strictly_more_than_twenty_percent():
    owners = _owners(budgets={"ml": {"amount": "100"}})
    assert rules.budget_findings(owners, _currencies("120"), "2024-09", Decimal(20)) == []
    found = rules.budget_findings(owners, _currencies("120.000000000001"), "2024-09", Decimal(20))
    assert [(item["owner"], item["approved"]) for item in found] == [("ml", False)]
    assert rules.budget_findings(owners, {"EUR": {"by_owner": {"ml": Decimal(500)}}}, "2024-09", Decimal(20)) == []


def test_an_approval_covers_only_its_months_and_amount():
    owners = _owners(budgets={"ml": {"amount": "100"}},
                     approvals=[{"owner": "ml", "from_month": "2024-08", "to_month": "2024-09", "up_to": "150"}])
    assert rules.budget_findings(owners, _currencies("150"), "2024-09", Decimal(20))[0]["approved"] is True
    assert rules.budget_findings(owners, _currencies("150.01"), "2024-09", Decimal(20))[0]["approved"] is False
    assert rules.budget_findings(owners, _currencies("130"), "2024-10", Decimal(20))[0]["approved"] is False


@pytest.fixture
def instances(s3_server):
    ec2 = storage.boto3_client("ec2")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    made = ec2.run_instances(ImageId=image, MinCount=3, MaxCount=3)["Instances"]
    return [f"arn:aws:ec2:us-east-1:123456789012:instance/{item['InstanceId']}" for item in made]


def _tags(arn):
    ec2 = storage.boto3_client("ec2")
    found = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [arn.rsplit("/", 1)[1]]}])["Tags"]
    return {item["Key"]: item["Value"] for item in found}


def _outbox(out):
    path = out / "_seedance" / "cost" / "outbox.jsonl"
    return [json.loads(row) for row in path.read_text().splitlines()] if path.exists() else []


def test_idle_tagging_dry_run_then_apply_idempotent_then_untag_when_active(tmp_path, instances):
    idle_arn, other_arn, _ = instances
    rows = [line("2024-09-10 00:00:00", "42.5", resource=idle_arn, tags={"owner": "ml"}),
            line("2024-09-10 00:00:00", "1", resource=other_arn, tags={"owner": "web"})]
    billing = write_focus(tmp_path / "b.csv", rows)
    owners = write_owners(tmp_path / "owners.yaml")
    quiet = _utilization(tmp_path / "quiet.csv", {idle_arn: _week(), other_arn: _week(cpu="50")})
    out = tmp_path / "out"
    now = datetime(2024, 10, 1, 3, tzinfo=UTC)  # the scheduled run right after September
    common = dict(month="2024-09", billing=str(billing), owners=str(owners), out=str(out), now=now)

    dry = recover_month(utilization=str(quiet), **common)
    assert dry["backfill"] is False and dry["rules"]["actions"]["mode"] == "dry-run"
    assert any(idle_arn in item for item in dry["rules"]["actions"]["planned"])
    assert _tags(idle_arn) == {} and _outbox(out) == []
    assert dry["summary"]["idle"][0] == {"resource_id": idle_arn, "owner": "ml", "cost": {"USD": "42.5"},
                                         "max_cpu_percent": "1.5", "days": 7}

    applied = recover_month(utilization=str(quiet), apply=True, **common)
    assert applied["rules"]["actions"]["tagged"] == [idle_arn]
    assert _tags(idle_arn) == {"cost-review": "pending"} and _tags(other_arn) == {}
    assert [(item["key"], item["owner"]) for item in _outbox(out)] == [(f"idle:{idle_arn}", "ml")]

    again = recover_month(utilization=str(quiet), apply=True, **common)
    assert again["rules"]["actions"]["tagged"] == [] and again["rules"]["actions"]["notified"] == []
    assert len(_outbox(out)) == 1  # no repeat notification

    busy = _utilization(tmp_path / "busy.csv", {idle_arn: _week(cpu="30"), other_arn: _week(cpu="50")})
    woke = recover_month(utilization=str(busy), apply=True, **common)
    assert woke["rules"]["actions"]["untagged"] == [idle_arn]
    assert _tags(idle_arn) == {}
    assert recover_month(utilization=str(quiet), apply=True, **common)["rules"]["actions"]["notified"] == [
        f"idle:{idle_arn}"]  # idle again later: a new notification


def test_over_budget_freezes_next_months_quota_once_and_never_in_a_backfill(tmp_path):
    rows = [line("2024-09-05 00:00:00", "130", tags={"owner": "ml"}),
            line("2024-08-05 00:00:00", "500", tags={"owner": "ml"})]
    billing = write_focus(tmp_path / "b.csv", rows)
    owners = write_owners(tmp_path / "owners.yaml", owner_tags=["owner"], budgets={"ml": {"amount": "100"}})
    out = tmp_path / "out"
    now = datetime(2024, 10, 1, 3, tzinfo=UTC)
    common = dict(billing=str(billing), owners=str(owners), out=str(out), now=now, apply=True)

    backfill = recover_month(month="2024-08", **common)  # older than the last closed month
    assert backfill["backfill"] is True and backfill["summary"]["over_budget"][0]["owner"] == "ml"
    assert backfill["rules"]["actions"]["frozen"] == [] and _outbox(out) == []

    current = recover_month(month="2024-09", **common)
    assert current["rules"]["actions"]["frozen"] == ["ml:2024-10"]
    ledger = json.loads((out / "_seedance" / "cost" / "quota-ledger.json").read_text())
    assert ledger["ml:2024-10"]["roi_document"] == "requested" and ledger["ml:2024-10"]["spend"] == "130"
    assert [item["key"] for item in _outbox(out)] == ["budget:ml:2024-09"]

    rerun = recover_month(month="2024-09", **common)
    assert rerun["rules"]["actions"]["frozen"] == [] and rerun["rules"]["actions"]["notified"] == []
    forced = recover_month(month="2024-09", backfill=True, **common)
    assert forced["rules"]["actions"]["mode"] == "backfill" and len(_outbox(out)) == 1


def test_airflow_notifier_is_pluggable(tmp_path):
    from seedance_tasks.cost.notify import Notifier

    state = storage.resolve(str(tmp_path / "state"))
    notifier = Notifier(state, "airflow:tests.cost.sample_notifier.FileNotifier",
                        {"path": str(tmp_path / "sent.txt"), "text": "{owner}: {subject}"})
    assert notifier.send("k1", "ml", "Over budget", "body", {}) is True
    assert notifier.send("k1", "ml", "Over budget", "body", {}) is False
    assert (tmp_path / "sent.txt").read_text() == "ml: Over budget\n"


def test_idle_rule_reads_cloudwatch_daily_datapoints(tmp_path, instances):
    quiet, gappy, busy = instances
    cloudwatch = storage.boto3_client("cloudwatch")
    for arn, skip_day, cpu in ((quiet, None, 1.0), (gappy, 3, 1.0), (busy, None, 40.0)):
        iid = arn.rsplit("/", 1)[1]
        for offset in range(1, 8):
            if offset == skip_day:
                continue  # no datapoint that day: not a zero
            stamp = datetime(2024, 10, 1, 12, tzinfo=UTC) - timedelta(days=offset)
            cloudwatch.put_metric_data(Namespace="AWS/EC2", MetricData=[
                {"MetricName": name, "Dimensions": [{"Name": "InstanceId", "Value": iid}], "Timestamp": stamp,
                 "Value": value} for name, value in (("CPUUtilization", cpu), ("NetworkIn", 0.0), ("NetworkOut", 0.0))])
    points, attrs = rules.cloudwatch_utilization([quiet, gappy, busy, "vol-123"], AS_OF, 7)
    assert len(points[quiet]) == 7 and len(points[gappy]) == 6 and "vol-123" not in points
    idle, active = rules.idle_findings(points, attrs, AS_OF, SETTINGS)
    assert [item["resource_id"] for item in idle] == [quiet] and active == [busy]

    billing = write_focus(tmp_path / "b.csv", [line("2024-09-10 00:00:00", "3", resource=quiet, tags={"owner": "ml"})])
    summary = recover_month(month="2024-09", billing=str(billing), owners=str(write_owners(tmp_path / "o.yaml")),
                            out=str(tmp_path / "out"), utilization="cloudwatch")["summary"]
    assert [(item["resource_id"], item["owner"]) for item in summary["idle"]] == [(quiet, "ml")]
