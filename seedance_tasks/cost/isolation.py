"""Isolating an idle resource through boto3: snapshot first, then isolate, every step tagged.

What a FinOps team expects (and what is undone by starting the resource again):

- EC2 instance: an EBS snapshot of every attached volume, then the instance is stopped (compute
  billing ends; storage stays, and the snapshots keep the data even if someone deletes the
  volumes later). With `isolation_security_group`, it is also moved into that group (its old
  groups are kept in the `seedance:original-security-groups` tag) so nothing reaches it.
- EBS volume: a snapshot.
- RDS instance: a DB snapshot (`create_db_snapshot`), then the instance is stopped.

The resource and every snapshot carry `cost-review=pending` (the review tag of `cost` settings)
plus `seedance:action-key`, `seedance:month` and `seedance:owner`. Before acting, the snapshot
of that key is looked up: a retried task finds it and takes no second one. A resource younger
than the tuning window (`cost.actions.tuning_window`, by its launch/creation time) is flagged
and left alone. Dry run: the same look-ups, nothing written; the plan lists what would be done.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from seedance_tasks import storage

ACTION_KEY_TAG = "seedance:action-key"
ORIGINAL_GROUPS_TAG = "seedance:original-security-groups"


@dataclass(frozen=True)
class Resource:
    """An idle resource the workflow can act on."""

    kind: str  # ec2-instance | ebs-volume | rds-instance
    ident: str  # i-…, vol-…, the DB instance identifier
    resource_id: str  # as the billing data named it


_INSTANCE = re.compile(r"(?:^|:instance/)(i-[0-9a-f]+)$")
_VOLUME = re.compile(r"(?:^|:volume/)(vol-[0-9a-f]+)$")
_RDS = re.compile(r"^arn:aws[a-z-]*:rds:[^:]*:[^:]*:db:([A-Za-z][A-Za-z0-9-]*)$")


def parse_resource(resource_id: str) -> Resource | None:
    """The resource an id or ARN names (EC2 instance, EBS volume, RDS DB instance), else None."""
    text = resource_id.strip()
    for kind, pattern in (("ec2-instance", _INSTANCE), ("ebs-volume", _VOLUME), ("rds-instance", _RDS)):
        match = pattern.search(text)
        if match and (kind == "rds-instance" or text == match.group(1) or text.startswith("arn:")):
            return Resource(kind, match.group(1), resource_id)
    return None


def action_key(month: str, resource: Resource) -> str:
    """The ledger and tag key of isolating `resource` for `month`."""
    return f"isolate:{month}:{resource.ident}"


def _snapshot_name(month: str, ident: str) -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", f"seedance-cost-{month}-{ident}")[:255]


class Isolator:
    """The boto3 side of isolation: look up, snapshot, tag, stop. Clients default to
    `storage.boto3_client` (the standard AWS chain, or AWS_ENDPOINT_URL in tests)."""

    def __init__(self, settings, *, ec2=None, rds=None, now: datetime | None = None):
        self.settings = settings  # the `cost` section
        self.actions = settings.actions
        self._ec2, self._rds = ec2, rds
        self.now = now or datetime.now(UTC)

    @property
    def ec2(self):
        if self._ec2 is None:
            self._ec2 = storage.boto3_client("ec2")
        return self._ec2

    @property
    def rds(self):
        if self._rds is None:
            self._rds = storage.boto3_client("rds")
        return self._rds

    def _tags(self, key: str, month: str, owner: str | None) -> list[dict[str, str]]:
        return [{"Key": self.settings.review_tag_key, "Value": self.settings.review_tag_value},
                {"Key": ACTION_KEY_TAG, "Value": key}, {"Key": "seedance:month", "Value": month},
                {"Key": "seedance:owner", "Value": owner or "unallocated"}]

    # ------------------------------------------------------------------ look-ups (dry run too)

    def describe(self, resource: Resource) -> dict[str, Any] | None:
        """State, creation time and volumes of `resource`; None if AWS does not know it."""
        from botocore.exceptions import ClientError

        try:
            if resource.kind == "ec2-instance":
                reservations = self.ec2.describe_instances(InstanceIds=[resource.ident])["Reservations"]
                found = [i for r in reservations for i in r["Instances"]]
                if not found:
                    return None
                item = found[0]
                return {"created": item["LaunchTime"], "state": item["State"]["Name"],
                        "volumes": sorted(m["Ebs"]["VolumeId"] for m in item.get("BlockDeviceMappings", [])
                                          if "Ebs" in m),
                        "groups": sorted(g["GroupId"] for g in item.get("SecurityGroups", []))}
            if resource.kind == "ebs-volume":
                volume = self.ec2.describe_volumes(VolumeIds=[resource.ident])["Volumes"][0]
                return {"created": volume["CreateTime"], "state": volume["State"], "volumes": [resource.ident]}
            database = self.rds.describe_db_instances(DBInstanceIdentifier=resource.ident)["DBInstances"][0]
            return {"created": database.get("InstanceCreateTime"), "state": database["DBInstanceStatus"],
                    "arn": database["DBInstanceArn"], "volumes": []}
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if "NotFound" in code or code in ("InvalidInstanceID.Malformed", "InvalidVolume.Malformed"):
                return None
            raise

    def young(self, described: dict[str, Any]) -> bool:
        """True if the resource is younger than the tuning window (an unknown age counts as young)."""
        created = described.get("created")
        if created is None:
            return True
        if created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        return self.now - created < timedelta(seconds=self.actions.tuning_window)

    def _ebs_snapshot(self, key: str) -> str | None:
        found = self.ec2.describe_snapshots(OwnerIds=["self"], Filters=[
            {"Name": f"tag:{ACTION_KEY_TAG}", "Values": [key]}])["Snapshots"]
        return sorted(s["SnapshotId"] for s in found)[0] if found else None

    def _db_snapshot(self, name: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            found = self.rds.describe_db_snapshots(DBSnapshotIdentifier=name)["DBSnapshots"]
        except ClientError as exc:
            if "NotFound" in exc.response.get("Error", {}).get("Code", ""):
                return None
            raise
        return found[0]["DBSnapshotIdentifier"] if found else None

    # ------------------------------------------------------------------ the action

    def isolate(self, resource: Resource, month: str, owner: str | None, *, apply: bool) -> dict[str, Any]:
        """Snapshot and isolate `resource` (or, dry run, plan it). Idempotent: existing snapshots
        of the action's key are reused, a stopped resource is not stopped again. Returns
        {"outcome": isolated|planned|flagged|missing, "snapshots": [...], "steps": [...]}."""
        key = action_key(month, resource)
        described = self.describe(resource)
        if described is None:
            return {"outcome": "missing", "snapshots": [], "steps": [f"{resource.ident}: not found in AWS"]}
        if self.young(described):
            return {"outcome": "flagged", "snapshots": [], "created": str(described.get("created")),
                    "steps": [f"{resource.ident}: younger than the tuning window "
                              f"({self.actions.tuning_window / 86400:g} days): flagged, not acted on"]}
        steps: list[str] = []
        snapshots: list[str] = []
        tags = self._tags(key, month, owner)
        if resource.kind in ("ec2-instance", "ebs-volume"):
            for volume in described["volumes"]:
                volume_key = f"{key}:{volume}"
                existing = self._ebs_snapshot(volume_key)
                if existing:
                    snapshots.append(existing)
                    steps.append(f"snapshot of {volume}: {existing} (taken before)")
                elif apply:
                    made = self.ec2.create_snapshot(
                        VolumeId=volume, Description=f"Seedance cost review {month}: {resource.resource_id}",
                        TagSpecifications=[{"ResourceType": "snapshot", "Tags": [
                            *[t for t in tags if t["Key"] != ACTION_KEY_TAG],
                            {"Key": ACTION_KEY_TAG, "Value": volume_key}]}])
                    snapshots.append(made["SnapshotId"])
                    steps.append(f"snapshot of {volume}: {made['SnapshotId']}")
                else:
                    steps.append(f"would snapshot {volume}")
            targets = sorted({resource.ident, *described["volumes"]})
            if apply:
                self.ec2.create_tags(Resources=targets, Tags=tags)
                steps.append(f"tagged {', '.join(targets)} {self.settings.review_tag_key}="
                             f"{self.settings.review_tag_value}")
            else:
                steps.append(f"would tag {', '.join(targets)} {self.settings.review_tag_key}="
                             f"{self.settings.review_tag_value}")
            if resource.kind == "ec2-instance":
                steps += self._isolate_instance(resource, described, apply)
        else:
            name = _snapshot_name(month, resource.ident)
            existing = self._db_snapshot(name)
            if existing:
                snapshots.append(existing)
                steps.append(f"DB snapshot {existing} (taken before)")
            elif apply:
                self.rds.create_db_snapshot(DBSnapshotIdentifier=name, DBInstanceIdentifier=resource.ident, Tags=tags)
                snapshots.append(name)
                steps.append(f"DB snapshot {name}")
            else:
                steps.append(f"would take DB snapshot {name}")
            if apply:
                self.rds.add_tags_to_resource(ResourceName=described["arn"], Tags=tags)
            steps.append(("" if apply else "would ") + f"tag {resource.ident} {self.settings.review_tag_key}="
                         f"{self.settings.review_tag_value}")
            if self.actions.stop_databases and described["state"] == "available":
                if apply:
                    self.rds.stop_db_instance(DBInstanceIdentifier=resource.ident)
                steps.append(("stopped " if apply else "would stop ") + resource.ident)
        return {"outcome": "isolated" if apply else "planned", "snapshots": snapshots, "steps": steps}

    def _isolate_instance(self, resource: Resource, described: dict[str, Any], apply: bool) -> list[str]:
        steps = []
        group = self.actions.isolation_security_group
        if group and described.get("groups") != [group]:
            if apply:
                self.ec2.create_tags(Resources=[resource.ident], Tags=[
                    {"Key": ORIGINAL_GROUPS_TAG, "Value": json.dumps(described.get("groups", []))}])
                self.ec2.modify_instance_attribute(InstanceId=resource.ident, Groups=[group])
            steps.append(("moved " if apply else "would move ") + f"{resource.ident} into {group}")
        if self.actions.stop_instances and described["state"] in ("pending", "running"):
            if apply:
                self.ec2.stop_instances(InstanceIds=[resource.ident])
            steps.append(("stopped " if apply else "would stop ") + resource.ident)
        return steps
