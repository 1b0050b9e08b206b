"""A month of AWS CUR 2.0 as AWS's Data Exports write it (Parquet, CUR 2.0 column names and types,
`product` and `resource_tags` maps), one line per line item type a bill has: on-demand, Spot,
Savings Plans (covered usage, negation, recurring and upfront fees), reservations (discounted
usage, RIFee, upfront Fee), tax, credit, refund and EDP discount. Amounts are the kind of doubles
CUR holds; unit prices times quantities give the costs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PAYER, ML, DATA = "111111111111", "222222222222", "333333333333"
SP_ARN = f"arn:aws:savingsplans::{PAYER}:savingsplan/4a4b1f2d-sp"
RI_ARN = f"arn:aws:rds:us-east-1:{ML}:ri:prod-db-ri"
TEXT = ["bill_bill_type", "bill_billing_entity", "bill_invoice_id", "bill_invoicing_entity", "bill_payer_account_id",
        "bill_payer_account_name", "identity_line_item_id", "line_item_availability_zone", "line_item_currency_code",
        "line_item_line_item_description", "line_item_line_item_type", "line_item_operation",
        "line_item_product_code", "line_item_resource_id", "line_item_usage_account_id",
        "line_item_usage_account_name", "line_item_usage_type", "pricing_rate_code", "pricing_rate_id",
        "pricing_term", "pricing_unit", "product_location", "product_region_code", "product_servicecode",
        "product_sku", "reservation_reservation_a_r_n", "savings_plan_savings_plan_a_r_n"]
NUMBERS = ["line_item_unblended_cost", "line_item_unblended_rate", "line_item_net_unblended_cost",
           "line_item_net_unblended_rate", "line_item_usage_amount", "pricing_public_on_demand_cost",
           "pricing_public_on_demand_rate", "savings_plan_savings_plan_effective_cost",
           "savings_plan_total_commitment_to_date", "savings_plan_used_commitment", "reservation_effective_cost",
           "reservation_unused_amortized_upfront_fee_for_billing_period", "reservation_unused_recurring_fee"]
TIMES = ["bill_billing_period_start_date", "bill_billing_period_end_date", "line_item_usage_start_date",
         "line_item_usage_end_date"]
SCHEMA = pa.schema([*((name, pa.string()) for name in TEXT), *((name, pa.float64()) for name in NUMBERS),
                    *((name, pa.timestamp("ms")) for name in TIMES),
                    ("product", pa.map_(pa.string(), pa.string())),
                    ("resource_tags", pa.map_(pa.string(), pa.string()))])
NAMES = {"AmazonEC2": "Amazon Elastic Compute Cloud", "AmazonS3": "Amazon Simple Storage Service",
         "AmazonRDS": "Amazon Relational Database Service", "AmazonCloudWatch": "AmazonCloudWatch",
         "AWSLambda": "AWS Lambda", "ComputeSavingsPlans": "Savings Plans for AWS Compute usage"}


def _line(number: int, kind: str, service: str, cost: float, *, account: str = ML, day: int = 5,
          amount: float | None = None, rate: float | None = None, unit: str = "Hrs", public_rate: float | None = None,
          usage_type: str = "USE1-BoxUsage:m5.xlarge", operation: str = "RunInstances", resource: str = "",
          tags: dict[str, str] | None = None, description: str = "", term: str = "OnDemand", **extra) -> dict:
    priced = kind not in ("Tax", "Credit", "Refund", "EdpDiscount")
    if rate is None and amount:
        rate = cost / amount
    public_rate = rate if public_rate is None else public_rate
    start = datetime(2024, 9, day, tzinfo=UTC)
    line = {name: None for name in SCHEMA.names}
    line.update({
        "bill_bill_type": "Anniversary", "bill_billing_entity": "AWS", "bill_invoice_id": "EUINIE24-1234567",
        "bill_invoicing_entity": "Amazon Web Services EMEA SARL", "bill_payer_account_id": PAYER,
        "bill_payer_account_name": "acme-payer", "identity_line_item_id": f"line-{number:04d}",
        "line_item_availability_zone": "us-east-1a" if resource.startswith("i-") else "",
        "line_item_currency_code": "USD", "line_item_line_item_description": description or f"{kind} {usage_type}",
        "line_item_line_item_type": kind, "line_item_operation": operation, "line_item_product_code": service,
        "line_item_resource_id": resource, "line_item_usage_account_id": account,
        "line_item_usage_account_name": {ML: "ml-prod", DATA: "data-prod"}[account],
        "line_item_usage_type": usage_type, "pricing_rate_code": f"{service}.{usage_type}.rate" if priced else "",
        "pricing_rate_id": f"{number}0001" if priced else "", "pricing_term": term if priced else "",
        "pricing_unit": unit if priced else "", "product_location": "US East (N. Virginia)",
        "product_region_code": "us-east-1", "product_servicecode": service,
        "product_sku": f"SKU{service[:6].upper()}{number:03d}" if priced else "",
        "line_item_unblended_cost": cost, "line_item_net_unblended_cost": cost,
        "line_item_unblended_rate": rate if priced else None, "line_item_net_unblended_rate": rate if priced else None,
        "line_item_usage_amount": amount if priced else None,
        "pricing_public_on_demand_rate": public_rate if priced else None,
        "pricing_public_on_demand_cost": (public_rate * amount) if priced and amount is not None else 0.0,
        "bill_billing_period_start_date": datetime(2024, 9, 1, tzinfo=UTC),
        "bill_billing_period_end_date": datetime(2024, 10, 1, tzinfo=UTC),
        "line_item_usage_start_date": start, "line_item_usage_end_date": start.replace(day=day + 1),
        "product": [("product_name", NAMES.get(service, service)), ("region", "us-east-1")],
        "resource_tags": list((tags or {}).items()),
    })
    line.update(extra)
    return line


def cur_lines() -> list[dict]:
    """The sample's lines (2024-09, payer 111111111111, accounts ml-prod and data-prod, USD)."""
    ec2 = {"resource": "i-0abc1234def567890", "tags": {"user_owner": "ml", "user_environment": "prod"}}
    return [
        _line(1, "Usage", "AmazonEC2", 4.608, amount=24.0, rate=0.192, **ec2),
        _line(2, "Usage", "AmazonS3", 2.3, amount=100.0, rate=0.023, unit="GB-Mo", usage_type="TimedStorage-ByteHrs",
              operation="StandardStorage", resource="acme-datasets", account=DATA, tags={"user_team": "data"}),
        _line(3, "Usage", "AmazonEC2", 0.35, amount=10.0, rate=0.035, public_rate=0.096,
              usage_type="USE1-SpotUsage:m5.large", operation="RunInstances:SV001", resource="i-0spot00000000001",
              term="Spot", tags={"user_owner": "ml"}),
        _line(4, "SavingsPlanCoveredUsage", "AmazonEC2", 1.92, amount=10.0, rate=0.192,
              savings_plan_savings_plan_a_r_n=SP_ARN, savings_plan_savings_plan_effective_cost=1.2,
              resource="i-0def1234abc567890", tags={"user_owner": "ml"}),
        _line(5, "SavingsPlanNegation", "AmazonEC2", -1.92, amount=10.0, rate=-0.192, public_rate=0.0,
              savings_plan_savings_plan_a_r_n=SP_ARN, resource="i-0def1234abc567890", tags={"user_owner": "ml"},
              description="SavingsPlanNegation used by AccountId : 222222222222 and UsageSku : SKUAMAZON004"),
        _line(6, "SavingsPlanRecurringFee", "ComputeSavingsPlans", 24.0, amount=24.0, rate=1.0, day=1,
              usage_type="ComputeSP:1yrNoUpfront", operation="", savings_plan_savings_plan_a_r_n=SP_ARN,
              savings_plan_total_commitment_to_date=24.0, savings_plan_used_commitment=20.5,
              description="1 year No Upfront Compute Savings Plan"),
        _line(7, "SavingsPlanUpfrontFee", "ComputeSavingsPlans", 100.0, amount=1.0, unit="Quantity", day=1,
              usage_type="ComputeSP:1yrAllUpfront", operation="", savings_plan_savings_plan_a_r_n=SP_ARN,
              description="1 year All Upfront Compute Savings Plan"),
        _line(8, "DiscountedUsage", "AmazonRDS", 0.0, amount=24.0, rate=0.0, public_rate=0.05,
              usage_type="InstanceUsage:db.t3.small", operation="CreateDBInstance:0002", resource=RI_ARN,
              reservation_reservation_a_r_n=RI_ARN, reservation_effective_cost=0.75, tags={"user_team": "data"}),
        _line(9, "RIFee", "AmazonRDS", 5.0, amount=720.0, rate=5.0 / 720, public_rate=5.0 / 720, day=1,
              usage_type="HeavyUsage:db.t3.small", operation="CreateDBInstance:0002",
              reservation_reservation_a_r_n=RI_ARN, reservation_unused_amortized_upfront_fee_for_billing_period=0.25,
              reservation_unused_recurring_fee=0.5),
        _line(10, "Fee", "AmazonRDS", 120.0, amount=1.0, unit="Quantity", day=1,
              usage_type="HeavyUsage:db.t3.small", operation="", reservation_reservation_a_r_n=RI_ARN,
              description="Sign up charge for subscription: prod-db-ri, planId: 2"),
        _line(11, "Tax", "AmazonEC2", 0.86, usage_type="", operation="", description="Tax for product code AmazonEC2"),
        _line(12, "Credit", "AmazonEC2", -2.0, usage_type="", operation="", day=20, description="AWS Activate Credits"),
        _line(13, "Refund", "AmazonS3", -1.0, usage_type="", operation="", day=21, account=DATA,
              description="Refund for an S3 billing error in August"),
        _line(14, "EdpDiscount", "AmazonEC2", -0.3, usage_type="USE1-BoxUsage:m5.xlarge", operation="RunInstances",
              description="Enterprise Program Discount"),
        _line(15, "Usage", "AmazonCloudWatch", 0.3, amount=30000.0, rate=0.00001, unit="Requests",
              usage_type="CW:Requests", operation="GetMetricData", account=DATA),
        _line(16, "Usage", "AWSLambda", 0.4, amount=2000000.0, rate=0.0000002, unit="Requests",
              usage_type="USE1-Request", operation="Invoke", resource=f"arn:aws:lambda:us-east-1:{ML}:function:etl",
              tags={"user_owner": "data"}),
    ]


def write_cur_month(path: Path) -> Path:
    """The sample as one CUR 2.0 Parquet file at `path` (folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(cur_lines(), schema=SCHEMA), path)
    return path
