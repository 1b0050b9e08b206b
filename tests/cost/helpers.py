"""Small builders for the cost tests: FOCUS CSV files and owners files, written under tmp_path."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parent.parent / "data" / "cost"
SAMPLE = DATA / "focus-1.0" / "focus_sample.csv"
SPEC = DATA / "focus-spec"
FIELDS = ["ChargePeriodStart", "ChargePeriodEnd", "BillingCurrency", "BilledCost", "EffectiveCost",
          "BillingAccountId", "SubAccountId", "ResourceId", "ResourceName", "ServiceName", "ChargeCategory", "Tags"]


def line(start: str, billed: str, effective: str | None = None, *, currency: str = "USD", tags=None,
         resource: str = "", service: str = "Compute", sub_account: str = "111", end: str = "",
         category: str = "Usage") -> dict[str, str]:
    """One FOCUS row; `tags` a dict (JSON-encoded here) or a raw string."""
    return {
        "ChargePeriodStart": start, "ChargePeriodEnd": end, "BillingCurrency": currency, "BilledCost": billed,
        "EffectiveCost": billed if effective is None else effective, "BillingAccountId": "999",
        "SubAccountId": sub_account, "ResourceId": resource, "ResourceName": "", "ServiceName": service,
        "ChargeCategory": category,
        "Tags": "NULL" if tags is None else tags if isinstance(tags, str) else json.dumps(tags),
    }


def write_focus(path: Path, rows: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_owners(path: Path, **content) -> Path:
    content.setdefault("owner_tags", ["owner", "team"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def three_months(tmp_path: Path) -> tuple[Path, Path]:
    """Billing for 2024-07..09 (alpha tagged `owner`, beta tagged `Team`, an untagged credit) + owners."""
    rows = []
    for month, amount in (("07", "10.50"), ("08", "20.25"), ("09", "30.125")):
        rows.append(line(f"2024-{month}-03 00:00:00", amount, tags={"owner": "alpha"}))
        rows.append(line(f"2024-{month}-10T00:00:00Z", "5", tags={"Team": "beta"}, resource="i-shared"))
        rows.append(line(f"2024-{month}-20 00:00:00", "-1.5", category="Credit"))
    billing = write_focus(tmp_path / "billing" / "focus.csv", rows)
    owners = write_owners(tmp_path / "owners.yaml", budgets={"alpha": {"amount": "1", "currency": "USD"}})
    return billing, owners
