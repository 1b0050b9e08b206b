"""Builders for the cost actions tests: idle resources in moto_server and a published month whose
idle findings name them (through the real cost recovery: billing, utilization, owners)."""

from __future__ import annotations

import csv
from datetime import date, timedelta
from pathlib import Path

from seedance_tasks import storage
from seedance_tasks.cost.recover import recover_month
from tests.cost.helpers import line, write_focus, write_owners

MONTH = "2024-08"


def make_instance() -> tuple[str, str]:
    """A running EC2 instance (with its root EBS volume) on the loopback AWS: (ARN, instance id)."""
    ec2 = storage.boto3_client("ec2")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="t3.micro")["Instances"][0]
    return f"arn:aws:ec2:us-east-1:123456789012:instance/{instance['InstanceId']}", instance["InstanceId"]


def make_database(name: str) -> str:
    """An available RDS instance: its ARN."""
    rds = storage.boto3_client("rds")
    return rds.create_db_instance(DBInstanceIdentifier=name, Engine="postgres", DBInstanceClass="db.t3.micro",
                                  MasterUsername="owner", MasterUserPassword="not-a-secret-1",
                                  AllocatedStorage=20)["DBInstance"]["DBInstanceArn"]


def instance_state(instance_id: str) -> dict:
    """State name, tags and volume ids of an instance, as AWS reports them."""
    ec2 = storage.boto3_client("ec2")
    item = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return {"state": item["State"]["Name"], "tags": {t["Key"]: t["Value"] for t in item.get("Tags", [])},
            "volumes": [m["Ebs"]["VolumeId"] for m in item.get("BlockDeviceMappings", [])]}


def snapshots_of(volume_id: str) -> list[dict]:
    """Every EBS snapshot of `volume_id`, with tags as a dict."""
    found = storage.boto3_client("ec2").describe_snapshots(OwnerIds=["self"], Filters=[
        {"Name": "volume-id", "Values": [volume_id]}])["Snapshots"]
    return [{"id": s["SnapshotId"], "tags": {t["Key"]: t["Value"] for t in s.get("Tags", [])}} for s in found]


def db_snapshots(name: str) -> list[dict]:
    """Every manual RDS snapshot of DB instance `name` (not the automated ones)."""
    return storage.boto3_client("rds").describe_db_snapshots(DBInstanceIdentifier=name, SnapshotType="manual")["DBSnapshots"]


def publish_month(tmp_path: Path, idle: dict[str, list[str]], *, month: str = MONTH, approvers=None,
                  budgets=None, contacts=None) -> tuple[Path, Path]:
    """Publish `month` through the cost recovery: per owner (`idle`: owner -> resource ids), one
    billing line per resource (alpha 12.50 each, others 5.00) and 7 idle days at the month's end.
    Returns (outputs root, owners file)."""
    rows, usage = [], []
    year, number = int(month[:4]), int(month[5:7])
    end = date(year + number // 12, number % 12 + 1, 1)
    for owner, resources in idle.items():
        for resource in resources:
            rows.append(line(f"{month}-05 00:00:00", "12.50" if owner == "alpha" else "5.00",
                             tags={"owner": owner}, resource=resource))
            for offset in range(1, 8):
                usage.append({"resource_id": resource, "date": (end - timedelta(days=offset)).isoformat(),
                              "cpu_percent": "0.5", "network_in_bytes": "0", "network_out_bytes": "0"})
    billing = write_focus(tmp_path / "billing" / "focus.csv", rows)
    utilization = tmp_path / "utilization.csv"
    with utilization.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["resource_id", "date", "cpu_percent", "network_in_bytes",
                                                    "network_out_bytes"])
        writer.writeheader()
        writer.writerows(usage)
    owners = write_owners(tmp_path / "owners.yaml",
                          budgets=budgets or {"alpha": {"amount": "10", "currency": "USD"},
                                              "beta": {"amount": "100", "currency": "USD"}},
                          **({"approvers": approvers} if approvers else {}),
                          **({"contacts": contacts} if contacts else {}))
    out = tmp_path / "out"
    recover_month(month=month, billing=str(billing), owners=str(owners), out=str(out), utilization=str(utilization),
                  backfill=True)
    return out, owners
