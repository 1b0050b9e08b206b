"""AWS CUR 2.0 Parquet in, FOCUS 1.2 lines out: the column mapping AWS's own "FOCUS 1.2 with AWS
columns" export uses, so that an allocated CUR month is a FOCUS dataset the FinOps validator passes.

| FOCUS                           | from CUR 2.0                                                        |
|---------------------------------|---------------------------------------------------------------------|
| BilledCost                      | line_item_unblended_cost                                            |
| EffectiveCost                   | amortized, per line type (`cur_amortized`)                          |
| ListCost / ListUnitPrice        | pricing_public_on_demand_cost / _rate (usage and purchases; other    |
|                                 | charges: ListCost = BilledCost, no unit price)                      |
| ContractedCost / ...UnitPrice   | line_item_net_unblended_cost / _rate, else unblended (idem)         |
| ChargePeriodStart / End         | line_item_usage_start_date / _end_date                              |
| BillingPeriodStart / End        | bill_billing_period_start_date / _end_date (else the charge's month)|
| ChargeCategory / Class / Freq.  | line_item_line_item_type (`LINE_TYPES`); Refund is a Correction     |
| CommitmentDiscount{Id,Type,     | savings_plan_savings_plan_a_r_n or reservation_reservation_a_r_n,   |
|   Category,Status}              | by line type; RIFee/SavingsPlanRecurringFee are the Unused part     |
| PricingQuantity / PricingUnit   | line_item_usage_amount / pricing_unit in FOCUS unit format          |
| ConsumedQuantity / ConsumedUnit | the same, for usage that is not an unused commitment                |
| PricingCategory                 | Committed (commitment), Dynamic (Spot), else Standard               |
| ServiceName                     | product['product_name'], else product_servicecode, line_item_product_code |
| ServiceCategory / Subcategory   | by service code (`SERVICE_CATEGORIES`), else Other                  |
| BillingAccountId / Name         | bill_payer_account_id / _name (the id when there is no name)        |
| SubAccountId / Name             | line_item_usage_account_id / _name (idem)                           |
| RegionId / RegionName / AZ      | product_region_code / product_location / line_item_availability_zone |
| SkuId / SkuPriceId              | product_sku / pricing_rate_id (not on tax lines)                    |
| InvoiceId                       | bill_invoice_id                                                     |
| ProviderName, InvoiceIssuerName | "AWS" (the invoicing entity travels as x_InvoicingEntity)           |
| PublisherName                   | bill_billing_entity ("AWS", "AWS Marketplace"), else "AWS"          |
| ResourceId / Tags               | line_item_resource_id / resource_tags (`user_` prefixes dropped)    |
| x_ServiceCode, x_UsageType,     | product_servicecode, line_item_usage_type, line_item_operation,     |
|   x_Operation, x_LineItemType   | line_item_line_item_type                                            |

Everything but the amortized cost and the tags (a map per line) is computed per column (Arrow).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from decimal import Decimal, localcontext
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seedance_tasks.cost.ingest import (
    TS,
    Rejected,
    _blank_as_null,
    _carried,
    _money,
    _text,
    _timestamps,
    billing_files,
    is_parquet,
    normalise,
    unreadable_billing,
)
from seedance_tasks.cost.money import CONTEXT, float_amount, parse_amount
from seedance_tasks.errors import InputError

AMORTIZED_COLUMNS = [
    "line_item_line_item_type", "line_item_unblended_cost", "savings_plan_savings_plan_effective_cost",
    "savings_plan_total_commitment_to_date", "savings_plan_used_commitment", "reservation_effective_cost",
    "reservation_unused_amortized_upfront_fee_for_billing_period", "reservation_unused_recurring_fee",
    "reservation_reservation_a_r_n",
]
CUR_COLUMNS = [
    *AMORTIZED_COLUMNS, "line_item_usage_start_date", "line_item_usage_end_date", "line_item_currency_code",
    "line_item_usage_account_id", "line_item_usage_account_name", "bill_payer_account_id",
    "bill_payer_account_name", "bill_billing_period_start_date", "bill_billing_period_end_date", "bill_invoice_id",
    "bill_invoicing_entity", "bill_billing_entity", "line_item_resource_id", "line_item_product_code",
    "line_item_line_item_description", "line_item_usage_amount", "line_item_usage_type", "line_item_operation",
    "line_item_unblended_rate", "line_item_net_unblended_cost", "line_item_net_unblended_rate",
    "line_item_availability_zone", "pricing_public_on_demand_cost", "pricing_public_on_demand_rate", "pricing_unit",
    "pricing_term", "pricing_rate_id", "product", "product_servicecode", "product_region_code", "product_location",
    "product_sku", "savings_plan_savings_plan_a_r_n", "resource_tags",
]
"""The CUR 2.0 columns read (those a file has)."""
CARRY = [
    "ChargePeriodEnd", "BillingPeriodStart", "BillingPeriodEnd", "BillingAccountName", "SubAccountName",
    "ChargeClass", "ChargeDescription", "ChargeFrequency", "PricingCategory", "PricingQuantity", "PricingUnit",
    "ConsumedQuantity", "ConsumedUnit", "ListCost", "ListUnitPrice", "ContractedCost", "ContractedUnitPrice",
    "CommitmentDiscountId", "CommitmentDiscountType", "CommitmentDiscountCategory", "CommitmentDiscountStatus",
    "InvoiceId", "InvoiceIssuerName", "ProviderName", "PublisherName", "RegionId", "RegionName", "AvailabilityZone",
    "ServiceCategory", "ServiceSubcategory", "SkuId", "SkuPriceId",
    "x_ServiceCode", "x_UsageType", "x_Operation", "x_LineItemType", "x_InvoicingEntity",
]
"""The FOCUS (and `x_`) columns a CUR line carries besides LINES' own (see `ingest.lines_schema`)."""

LINE_TYPES: dict[str, tuple[str, str | None, str]] = {
    # line item type: (ChargeCategory, ChargeClass, ChargeFrequency)
    "Usage": ("Usage", None, "Usage-Based"),
    "DiscountedUsage": ("Usage", None, "Usage-Based"),
    "SavingsPlanCoveredUsage": ("Usage", None, "Usage-Based"),
    "SavingsPlanNegation": ("Usage", None, "Usage-Based"),
    "RIFee": ("Usage", None, "Recurring"),  # the reservation's unused part: FOCUS's Unused commitment
    "SavingsPlanRecurringFee": ("Usage", None, "Recurring"),  # idem, the plan's
    "SavingsPlanUpfrontFee": ("Purchase", None, "One-Time"),
    "Fee": ("Purchase", None, "One-Time"),
    "Tax": ("Tax", None, "One-Time"),
    "Credit": ("Credit", None, "One-Time"),
    "Refund": ("Credit", "Correction", "One-Time"),
    "BundledDiscount": ("Credit", None, "Usage-Based"),
    "EdpDiscount": ("Credit", None, "Usage-Based"),
    "PrivateRateDiscount": ("Credit", None, "Usage-Based"),
    "SppDiscount": ("Credit", None, "Usage-Based"),
    "DistributorDiscount": ("Credit", None, "Usage-Based"),
}
"""CUR line item types as FOCUS charges; any other type is an Adjustment, One-Time."""
SAVINGS_PLAN_TYPES = {"SavingsPlanCoveredUsage", "SavingsPlanNegation", "SavingsPlanRecurringFee",
                      "SavingsPlanUpfrontFee"}
RESERVATION_TYPES = {"DiscountedUsage", "RIFee", "Fee"}
UNUSED_TYPES = {"RIFee", "SavingsPlanRecurringFee"}

SERVICE_CATEGORIES: dict[str, tuple[str, str]] = {
    "AmazonEC2": ("Compute", "Virtual Machines"),
    "AmazonLightsail": ("Compute", "Virtual Machines"),
    "AWSLambda": ("Compute", "Serverless Compute"),
    "AmazonECS": ("Compute", "Containers"),
    "AmazonEKS": ("Compute", "Containers"),
    "AmazonECR": ("Compute", "Containers"),
    "AmazonWorkSpaces": ("Compute", "End User Computing"),
    "AmazonS3": ("Storage", "Object Storage"),
    "AmazonGlacier": ("Storage", "Backup Storage"),
    "AWSBackup": ("Storage", "Backup Storage"),
    "AmazonEFS": ("Storage", "File Storage"),
    "AmazonFSx": ("Storage", "File Storage"),
    "AmazonRDS": ("Databases", "Relational Databases"),
    "AmazonDynamoDB": ("Databases", "NoSQL Databases"),
    "AmazonDocDB": ("Databases", "NoSQL Databases"),
    "AmazonElastiCache": ("Databases", "Caching"),
    "AmazonRedshift": ("Databases", "Data Warehouses"),
    "AmazonTimestream": ("Databases", "Time Series Databases"),
    "AmazonAthena": ("Analytics", "Analytics Platforms"),
    "AWSGlue": ("Analytics", "Data Processing"),
    "ElasticMapReduce": ("Analytics", "Data Processing"),
    "AmazonKinesis": ("Analytics", "Streaming Analytics"),
    "AmazonMSK": ("Analytics", "Streaming Analytics"),
    "AmazonES": ("Analytics", "Search"),
    "AmazonQuickSight": ("Analytics", "Business Intelligence"),
    "AmazonSageMaker": ("AI and Machine Learning", "Machine Learning"),
    "AmazonBedrock": ("AI and Machine Learning", "Generative AI"),
    "AmazonCloudWatch": ("Management and Governance", "Observability"),
    "AWSCloudTrail": ("Management and Governance", "Compliance"),
    "AWSConfig": ("Management and Governance", "Compliance"),
    "AWSCostExplorer": ("Management and Governance", "Cost Management"),
    "AWSSupportBusiness": ("Management and Governance", "Support"),
    "AWSSupportEnterprise": ("Management and Governance", "Support"),
    "AmazonVPC": ("Networking", "Network Infrastructure"),
    "AWSELB": ("Networking", "Application Networking"),
    "AmazonCloudFront": ("Networking", "Content Delivery"),
    "AmazonRoute53": ("Networking", "Network Routing"),
    "AWSDirectConnect": ("Networking", "Network Connectivity"),
    "AWSDataTransfer": ("Networking", "Network Connectivity"),
    "AmazonApiGateway": ("Integration", "API Management"),
    "AWSQueueService": ("Integration", "Messaging"),
    "AmazonSNS": ("Integration", "Messaging"),
    "AWSStepFunctions": ("Integration", "Workflow Orchestration"),
    "AWSSecretsManager": ("Security", "Secret Management"),
    "awskms": ("Security", "Secret Management"),
    "AmazonGuardDuty": ("Security", "Threat Detection and Response"),
    "AWSSecurityHub": ("Security", "Security Posture Management"),
    "AWSIAM": ("Identity", "Identity and Access Management"),
    "AmazonCognito": ("Identity", "Identity and Access Management"),
    "CodeBuild": ("Developer Tools", "Continuous Integration and Deployment"),
    "AWSCodePipeline": ("Developer Tools", "Continuous Integration and Deployment"),
    "AWSCodeCommit": ("Developer Tools", "Source Code Management"),
}
"""FOCUS 1.2 ServiceCategory and ServiceSubcategory of the common AWS service codes; others are
"Other" / "Other (Other)"."""
_UNITS = [(r"^Hrs$", "Hours"), (r"-Hrs$", "-Hours"), (r"-Hr$", "-Hours"), (r"-Mo$", "-Months"),
          (r"-Month$", "-Months"), (r"^Hours?$", "Hours")]
"""AWS pricing units written the FOCUS unit way (`Hrs` -> `Hours`, `GB-Mo` -> `GB-Months`)."""


def _dec(value: Any) -> Decimal:
    """A CUR amount as the Decimal it was meant to be (a double: its shortest repr); ValueError if none."""
    if value is None:
        return Decimal(0)
    return float_amount(value) if isinstance(value, float) else parse_amount(str(value))


def cur_amortized(line: dict[str, Any]) -> Decimal | None:
    """The amortized (effective) cost of one CUR 2.0 line, per AWS's CUR rules; None if unblended is missing.

    SavingsPlanCoveredUsage -> the plan's effective cost; SavingsPlanRecurringFee -> the unused
    commitment (total commitment to date - used); SavingsPlanNegation and SavingsPlanUpfrontFee
    -> 0 (the covered usage carries it); DiscountedUsage -> the reservation's effective cost;
    RIFee -> unused amortized upfront + unused recurring fee; a reservation's upfront Fee -> 0;
    anything else -> unblended cost. ValueError (saying which value) for an amount that is not one.
    """
    kind = line.get("line_item_line_item_type")
    if kind == "SavingsPlanCoveredUsage":
        return _dec(line.get("savings_plan_savings_plan_effective_cost"))
    if kind == "SavingsPlanRecurringFee":
        return _dec(line.get("savings_plan_total_commitment_to_date")) - _dec(line.get("savings_plan_used_commitment"))
    if kind in ("SavingsPlanNegation", "SavingsPlanUpfrontFee"):
        return Decimal(0)
    if kind == "DiscountedUsage":
        return _dec(line.get("reservation_effective_cost"))
    if kind == "RIFee":
        return _dec(line.get("reservation_unused_amortized_upfront_fee_for_billing_period")) + _dec(
            line.get("reservation_unused_recurring_fee")
        )
    if kind == "Fee" and line.get("reservation_reservation_a_r_n"):
        return Decimal(0)
    unblended = line.get("line_item_unblended_cost")
    return None if unblended is None else _dec(unblended)


def _cur_tags(value: Any) -> str | None:
    """CUR `resource_tags` (a map, a struct or JSON-object text) as FOCUS Tags text, `user_` dropped
    from the keys; text that is no JSON object stays as it is (the attribution names it malformed)."""
    if not value:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
        if not isinstance(value, dict):
            return json.dumps(value)
    pairs = value.items() if isinstance(value, dict) else value
    tags = {(key[5:] if key.startswith("user_") else key): item for key, item in pairs if item is not None}
    return json.dumps(tags, sort_keys=True) if tags else None


def _lookup(kinds: pa.Array, mapping: dict[str, Any], default: Any, kind: pa.DataType = pa.string()) -> pa.Array:
    """Per row, `mapping[value]` (else `default`) of a text column, decided once per distinct value."""
    encoded = kinds if pa.types.is_dictionary(kinds.type) else pc.dictionary_encode(_text(kinds))
    values = pa.array([mapping.get(value, default) for value in encoded.dictionary.to_pylist()] + [None], kind)
    indices = pc.fill_null(encoded.indices, len(encoded.dictionary))
    return values.take(indices)


def _month_bounds(starts: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The first instant of each timestamp's month and of the next month (UTC)."""
    months = starts.cast(pa.int64()).to_numpy(zero_copy_only=False).astype("datetime64[us]").astype("datetime64[M]")
    mask = starts.is_null().to_numpy(zero_copy_only=False)

    def stamps(values: np.ndarray) -> pa.Array:
        return pa.array(values.astype("datetime64[us]").astype(np.int64), pa.int64(), mask=mask).cast(TS)

    return stamps(months), stamps(months + 1)


def _units(values: pa.Array) -> pa.Array:
    text = _blank_as_null(_text(values))
    for pattern, replacement in _UNITS:
        text = pc.replace_substring_regex(text, pattern, replacement)
    return text


def focus_columns(batch: pa.RecordBatch) -> tuple[dict[str, pa.Array], dict[int, tuple[str, str]]]:
    """One CUR 2.0 batch as FOCUS-named columns (for `ingest.normalise` with `carry=CARRY`), and
    the rows whose amortized or list cost is malformed ({index: (column, reason)})."""
    length = batch.num_rows
    names = set(batch.schema.names)

    def col(name: str) -> pa.Array:
        return batch.column(name) if name in names else pa.nulls(length, pa.string())

    def text(name: str) -> pa.Array:
        return _blank_as_null(_text(col(name)))

    bad: dict[int, tuple[str, str]] = {}
    effective = []
    with localcontext(CONTEXT):
        for index, line in enumerate(batch.select([n for n in AMORTIZED_COLUMNS if n in names]).to_pylist()):
            try:
                amortized = cur_amortized(line)
            except ValueError as exc:
                amortized = None
                bad[index] = ("EffectiveCost", f"malformed EffectiveCost (amortized): {exc}")
            effective.append(None if amortized is None else str(amortized))

    kinds = text("line_item_line_item_type")
    category = _lookup(kinds, {k: v[0] for k, v in LINE_TYPES.items()}, "Adjustment")
    charge_class = _lookup(kinds, {k: v[1] for k, v in LINE_TYPES.items()}, None)
    frequency = _lookup(kinds, {k: v[2] for k, v in LINE_TYPES.items()}, "One-Time")
    usage = pc.fill_null(pc.equal(category, "Usage"), False)
    priced = pc.fill_null(pc.is_in(category, value_set=pa.array(["Usage", "Purchase"])), False)
    tax = pc.fill_null(pc.equal(category, "Tax"), False)

    plan = pc.fill_null(pc.is_in(kinds, value_set=pa.array(sorted(SAVINGS_PLAN_TYPES))), False)
    reserved = pc.fill_null(pc.is_in(kinds, value_set=pa.array(sorted(RESERVATION_TYPES))), False)
    commitment = pc.if_else(plan, text("savings_plan_savings_plan_a_r_n"),
                            pc.if_else(reserved, text("reservation_reservation_a_r_n"), pa.scalar(None, pa.string())))
    committed = pc.is_valid(commitment)
    unused = pc.fill_null(pc.is_in(kinds, value_set=pa.array(sorted(UNUSED_TYPES))), False)

    def where(condition: pa.Array, value: pa.Array | str, other: Any = None) -> pa.Array:
        if isinstance(value, str):
            value = pa.scalar(value, pa.string())
        if other is None:
            other = pa.scalar(None, value.type)
        return pc.if_else(condition, value, other)

    billed, _ = _money(col("line_item_unblended_cost"))  # its own faults are normalise's to report
    public, bad_list = _money(col("pricing_public_on_demand_cost"))
    for index, reason in bad_list.items():
        bad.setdefault(index, ("ListCost", f"malformed ListCost (pricing_public_on_demand_cost): {reason}"))
    net, bad_net = _money(col("line_item_net_unblended_cost"))
    for index, reason in bad_net.items():
        bad.setdefault(index, ("ContractedCost", f"malformed ContractedCost (line_item_net_unblended_cost): {reason}"))
    quantity, bad_quantity = _carried(col("line_item_usage_amount"), "PricingQuantity")
    for index, reason in bad_quantity.items():
        bad.setdefault(index, ("PricingQuantity", f"malformed PricingQuantity (line_item_usage_amount): {reason}"))
    unit = pc.coalesce(_units(col("pricing_unit")), pa.scalar("Units"))
    consumed = pc.and_(usage, pc.invert(unused))

    def rate(name: str) -> pa.Array:
        return pc.cast(_blank_as_null(col(name)), pa.float64()) if name in names else pa.nulls(length, pa.float64())

    spot = pc.fill_null(pc.or_(pc.equal(text("pricing_term"), "Spot"),
                               pc.match_substring(text("line_item_usage_type"), "SpotUsage")), False)
    service_code = pc.coalesce(text("product_servicecode"), text("line_item_product_code"))
    product_name = (pc.map_lookup(col("product"), "product_name", "first")
                    if "product" in names and pa.types.is_map(col("product").type) else pa.nulls(length, pa.string()))
    account, payer = text("line_item_usage_account_id"), text("bill_payer_account_id")
    start = col("line_item_usage_start_date")
    billing_start, billing_end = _month_bounds(_timestamps(start)[0])
    price_kind = where(priced, pc.if_else(committed, pa.scalar("Committed"),
                                          pc.if_else(spot, pa.scalar("Dynamic"), pa.scalar("Standard"))))
    columns = {
        "ChargePeriodStart": start,
        "ChargePeriodEnd": col("line_item_usage_end_date"),
        "BillingPeriodStart": pc.coalesce(_timestamps(_blank_as_null(col("bill_billing_period_start_date")))[0],
                                          billing_start),
        "BillingPeriodEnd": pc.coalesce(_timestamps(_blank_as_null(col("bill_billing_period_end_date")))[0],
                                        billing_end),
        "BillingCurrency": col("line_item_currency_code"),
        "BilledCost": col("line_item_unblended_cost"),
        "EffectiveCost": pa.array(effective, pa.string()),
        "ListCost": pc.if_else(priced, pc.coalesce(public, billed), billed),
        "ListUnitPrice": where(priced, rate("pricing_public_on_demand_rate")),
        "ContractedCost": pc.if_else(priced, pc.coalesce(net, billed), billed),
        "ContractedUnitPrice": where(priced, pc.coalesce(rate("line_item_net_unblended_rate"),
                                                         rate("line_item_unblended_rate"))),
        "BillingAccountId": payer,
        "BillingAccountName": pc.coalesce(text("bill_payer_account_name"), payer),
        "SubAccountId": account,
        "SubAccountName": pc.coalesce(text("line_item_usage_account_name"), account),
        "ResourceId": text("line_item_resource_id"),
        "ServiceName": pc.coalesce(_blank_as_null(product_name), service_code),
        "ServiceCategory": _lookup(service_code, {k: v[0] for k, v in SERVICE_CATEGORIES.items()}, "Other"),
        "ServiceSubcategory": _lookup(service_code, {k: v[1] for k, v in SERVICE_CATEGORIES.items()},
                                      "Other (Other)"),
        "ChargeCategory": category,
        "ChargeClass": charge_class,
        "ChargeFrequency": frequency,
        "ChargeDescription": text("line_item_line_item_description"),
        "PricingCategory": price_kind,
        "PricingQuantity": where(priced, quantity),
        "PricingUnit": where(priced, unit),
        "ConsumedQuantity": where(consumed, quantity),
        "ConsumedUnit": where(consumed, unit),
        "CommitmentDiscountId": commitment,
        "CommitmentDiscountType": where(committed, pc.if_else(plan, pa.scalar("Savings Plan"),
                                                              pa.scalar("Reserved Instance"))),
        "CommitmentDiscountCategory": where(committed, pc.if_else(plan, pa.scalar("Spend"), pa.scalar("Usage"))),
        "CommitmentDiscountStatus": where(pc.and_(committed, usage),
                                          pc.if_else(unused, pa.scalar("Unused"), pa.scalar("Used"))),
        "InvoiceId": text("bill_invoice_id"),
        "InvoiceIssuerName": pa.array(np.full(length, "AWS")),
        "ProviderName": pa.array(np.full(length, "AWS")),
        "PublisherName": pc.coalesce(text("bill_billing_entity"), pa.scalar("AWS")),
        "RegionId": text("product_region_code"),
        "RegionName": text("product_location"),
        "AvailabilityZone": text("line_item_availability_zone"),
        "SkuId": where(pc.invert(tax), text("product_sku")),
        "SkuPriceId": where(pc.invert(tax), text("pricing_rate_id")),
        "Tags": pa.array([_cur_tags(value) for value in col("resource_tags").to_pylist()], pa.string()),
        "x_ServiceCode": service_code,
        "x_UsageType": text("line_item_usage_type"),
        "x_Operation": text("line_item_operation"),
        "x_LineItemType": kinds,
        "x_InvoicingEntity": text("bill_invoicing_entity"),
    }
    if "line_item_usage_end_date" not in names:
        del columns["ChargePeriodEnd"]
    return columns, bad


def read_cur(uri: str, *, batch_rows: int = 500_000, carry: list[str] | tuple[str, ...] = ()
             ) -> Iterator[tuple[pa.RecordBatch, Rejected]]:
    """AWS CUR 2.0 Parquet lines as FOCUS lines (`focus_columns`): BilledCost = unblended,
    EffectiveCost = amortized, the account the SubAccountId, the payer the BillingAccountId.

    `carry` (`CARRY` or a part of it) adds the other FOCUS columns to the lines (`ingest.lines_schema`).
    """
    for location, path in billing_files(uri):
        source = posixpath.basename(path) if location.path == path else location.relative(path)
        if not is_parquet(path):
            raise InputError(f"--format cur reads CUR 2.0 Parquet; {source} is not Parquet",
                             hint="pass the CUR 2.0 Parquet export, or --format focus for a FOCUS CSV")
        handle = location.fs.open_input_file(path)
        try:
            parquet = pq.ParquetFile(handle, pre_buffer=False)  # bounded memory: no chunk kept once read
            wanted = [name for name in CUR_COLUMNS if name in parquet.schema_arrow.names]
            first = 1
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted):
                columns, bad = focus_columns(batch)
                out, rejected = normalise(columns, first, source, known=bad, carry=carry)
                first += batch.num_rows
                yield out, rejected
        except pa.ArrowInvalid as exc:  # not Parquet, truncated, a damaged page
            raise unreadable_billing(source, exc) from None
        finally:
            handle.close()

