"""Attribution: tag-key variants and conflicts, re-tagging mid-month, effective-dated CMDB rules,
shared-cost splits that sum exactly (largest remainder), FOCUS 1.3 Allocated* columns."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction

import pyarrow.parquet as pq
import pytest

from seedance_tasks.cost.money import largest_remainder
from seedance_tasks.cost.owners import tag_owner
from seedance_tasks.cost.recover import recover_month
from tests.cost.helpers import line, write_focus, write_owners


def _run(tmp_path, rows, month="2024-09", **owners_content):
    billing = write_focus(tmp_path / "billing.csv", rows)
    owners = write_owners(tmp_path / "owners.yaml", **owners_content)
    result = recover_month(month=month, billing=str(billing), owners=str(owners), out=str(tmp_path / "out"))
    allocations = pq.read_table(tmp_path / "out" / f"month={month}" / "allocations.parquet").to_pylist()
    return result["summary"], allocations


def test_tag_keys_match_case_insensitively_ignoring_spaces_and_first_listed_wins():
    keys = ["owner", "team"]
    assert tag_owner({" OWNER ": "ml"}, keys) == ("ml", "owner", None)
    assert tag_owner({"Team": "infra"}, keys) == ("infra", "team", None)
    assert tag_owner({"team": "infra", "Owner": "ml"}, keys)[:2] == ("ml", "owner")
    assert tag_owner({"owner": "  ", "team": "infra"}, keys)[:2] == ("infra", "team")  # blank = absent
    assert tag_owner({"costcenter": "x"}, keys) == (None, None, None)


def test_tag_conflicts_are_recorded_on_the_line_and_in_the_summary(tmp_path):
    rows = [
        line("2024-09-01 00:00:00", "1", tags={"owner": "ml", "team": "infra"}),  # two keys disagree
        line("2024-09-02 00:00:00", "2", tags={"Owner": "ml", " owner": "data"}),  # two spellings disagree
        line("2024-09-03 00:00:00", "4", tags={"owner": "ml", "Team": "ml"}),  # agree: no conflict
    ]
    summary, allocations = _run(tmp_path, rows)
    assert summary["currencies"]["USD"]["by_owner"] == {"data": "2", "ml": "5"} or \
        summary["currencies"]["USD"]["by_owner"] == {"ml": "5", "data": "2"}
    assert summary["tag_conflicts"]["count"] == 2
    assert summary["tag_conflicts"]["sample"] == [
        {"row": 1, "tags": {"owner": ["ml"], "team": ["infra"]}},
        {"row": 2, "tags": {"owner": ["data", "ml"]}},
    ]
    assert [row["x_TagConflict"] is not None for row in allocations] == [True, True, False]
    assert allocations[0]["x_OwnerSource"] == "tag:owner"


def test_resource_retagged_mid_month_is_split_by_line_date(tmp_path):
    rows = [line(f"2024-09-{day:02d} 00:00:00", "10", resource="i-abc",
                 tags={"owner": "research" if day < 16 else "platform"}) for day in range(1, 31)]
    summary, _ = _run(tmp_path, rows)
    assert summary["currencies"]["USD"]["by_owner"] == {"platform": "150", "research": "150"}


def test_cmdb_rules_are_effective_dated_and_tried_in_order(tmp_path):
    rules = [
        {"id": "old-mapping", "owner": "legacy", "match": {"sub_account": "4*"}, "valid_to": "2024-09-15"},
        {"id": "new-mapping", "owner": "modern", "match": {"sub_account": "4*"}, "valid_from": "2024-09-15"},
        {"id": "s3", "owner": "storage", "match": {"service": "Amazon S3"}},
        {"id": "by-tag", "owner": "envs", "match": {"tag": {" ENV": "prod"}}},
    ]
    rows = [
        line("2024-09-14 23:00:00", "1", sub_account="4001"),
        line("2024-09-15 00:00:00", "2", sub_account="4001"),
        line("2024-09-16 00:00:00", "4", sub_account="5001", service="Amazon S3"),
        line("2024-09-16 00:00:00", "8", sub_account="5001", tags={"env": "prod"}),
        line("2024-09-16 00:00:00", "16", sub_account="4001", tags={"team": "ml"}),  # tags first
        line("2024-09-16 00:00:00", "32", sub_account="5001"),
    ]
    summary, allocations = _run(tmp_path, rows, rules=rules)
    usd = summary["currencies"]["USD"]
    assert usd["by_owner"] == {"envs": "8", "legacy": "1", "ml": "16", "modern": "2", "storage": "4"}
    assert usd["unallocated"] == "32"
    assert [row["x_OwnerSource"] for row in allocations] == [
        "rule:old-mapping", "rule:new-mapping", "rule:s3", "rule:by-tag", "tag:team", None]
    # a backfill of an older month uses the mapping in force then
    old, _ = _run(tmp_path, [line("2024-06-01 00:00:00", "5", sub_account="4001")], month="2024-06", rules=rules)
    assert old["currencies"]["USD"]["by_owner"] == {"legacy": "5"}


@pytest.mark.parametrize("total, weights, quantum", [
    (Decimal("100"), [1, 1, 1], Decimal("0.01")),
    (Decimal("-2.6137"), [Fraction(2, 3), Fraction(1, 3)], Decimal("0.01")),
    (Decimal("0.000000080000"), [5, 3, 2, 7], Decimal("0.01")),
    (Decimal("8760.00"), [Fraction(1, 7)] * 7, Decimal("0.01")),
    (Decimal("0.05"), [1] * 9, Decimal("0.01")),
])
def test_largest_remainder_sums_exactly(total, weights, quantum):
    parts = largest_remainder(total, weights, quantum)
    assert sum(parts) == total
    unit = min(quantum, Decimal(1).scaleb(total.normalize().as_tuple().exponent))
    exact = [total * Decimal(Fraction(w).numerator) / Decimal(Fraction(w).denominator)
             / (sum(Decimal(Fraction(x).numerator) / Decimal(Fraction(x).denominator) for x in weights))
             for w in weights]
    assert all(abs(part - share) < unit for part, share in zip(parts, exact, strict=True))


def test_largest_remainder_gives_leftover_units_to_largest_remainders():
    assert largest_remainder(Decimal("100"), [1, 1, 1], Decimal("0.01")) == [
        Decimal("33.34"), Decimal("33.33"), Decimal("33.33")]
    assert largest_remainder(Decimal("1"), [Fraction(1, 10), Fraction(9, 10)], Decimal("0.01")) == [
        Decimal("0.10"), Decimal("0.90")]
    with pytest.raises(ValueError):
        largest_remainder(Decimal("1"), [0, 0], Decimal("0.01"))


def test_shared_costs_split_exactly_by_usage_and_storage_recency(tmp_path):
    usage = tmp_path / "usage"
    usage.mkdir()
    (usage / "kafka-2024-09.csv").write_text("owner,partitions,bytes\nml,10,100\ndata,20,100\nweb,0,100\n")
    (usage / "lake-2024-09.csv").write_text(
        "owner,gb_months,last_access\nml,100,2024-09-25\ndata,100,2024-07-15\narchive,100,2023-01-01\n")
    shared = [
        {"id": "kafka", "match": {"resource_id": "arn:*:kafka:*"}, "method": "usage_share",
         "usage": "usage/kafka-{month}.csv", "weights": {"partitions": "0.5", "bytes": "0.5"}},
        {"id": "lake", "match": {"service": "Amazon S3"}, "method": "storage_recency", "usage": "usage/lake-{month}.csv",
         "recency": [{"max_age_days": 30, "weight": "1"}, {"max_age_days": 90, "weight": "0.5"}, {"weight": "0.2"}]},
    ]
    rows = [
        line("2024-09-01 00:00:00", "100.00", "90.01", resource="arn:aws:kafka:us-east-1:1:cluster/a",
             tags={"owner": "platform"}),
        line("2024-09-02 00:00:00", "0.07", resource="arn:aws:kafka:us-east-1:1:cluster/a"),
        line("2024-09-03 00:00:00", "17", service="Amazon S3"),
        line("2024-09-04 00:00:00", "5", tags={"owner": "ml"}),
    ]
    summary, allocations = _run(tmp_path, rows, shared=shared)
    kafka = [row for row in allocations if row["AllocatedMethodId"] == "kafka"]
    # weights: ml 0.5*1/3+0.5*1/3 = 1/3, data 0.5*2/3+0.5*1/3 = 1/2, web 0.5*0+0.5*1/3 = 1/6
    first = {row["x_Owner"]: row["EffectiveCost"] for row in kafka if row["x_Row"] == 1}
    assert first == {"data": Decimal("45.01"), "ml": Decimal("30.00"), "web": Decimal("15.00")}
    assert sum(row["BilledCost"] for row in kafka if row["x_Row"] == 1) == Decimal("100.00")
    assert sum(row["EffectiveCost"] for row in kafka if row["x_Row"] == 2) == Decimal("0.07")
    details = json.loads(kafka[0]["AllocatedMethodDetails"])
    assert details["method"] == "usage_share" and details["rounding"] == "largest-remainder"
    lake = {row["x_Owner"]: row["EffectiveCost"] for row in allocations if row["AllocatedMethodId"] == "lake"}
    # weights 100*1 : 100*0.5 : 100*0.2 = 10:5:2 of 17
    assert lake == {"ml": Decimal("10"), "data": Decimal("5"), "archive": Decimal("2")}
    usd = summary["currencies"]["USD"]
    assert Decimal(usd["total"]) == Decimal("90.01") + Decimal("0.07") + 17 + 5
    assert sum(map(Decimal, usd["by_owner"].values())) + Decimal(usd["unallocated"]) == Decimal(usd["total"])
    assert usd["unallocated"] == "0" and "platform" not in usd["by_owner"]  # the shared rule comes first
    assert set(summary["shared"]) == {"kafka", "lake"}


def test_missing_usage_file_leaves_lines_unsplit_with_a_warning(tmp_path):
    shared = [{"id": "kafka", "match": {"service": "MSK"}, "method": "usage_share",
               "usage": "nowhere/{month}.csv", "weights": {"bytes": "1"}}]
    summary, allocations = _run(tmp_path, [line("2024-09-01 00:00:00", "3", service="MSK")], shared=shared)
    assert summary["currencies"]["USD"]["unallocated"] == "3"
    assert "kafka" in summary["warnings"][0] and allocations[0]["AllocatedMethodId"] is None


@pytest.mark.parametrize("content, problem", [
    (b"owner,bytes\nml,10\ndata,20,extra\n", "row 3 has more fields than the header"),
    (b"owner,bytes\n\xff\xfe,10\n", "can't decode"),
    (b"owner,bytes\nml,ten\n", "ten"),
])
def test_a_malformed_usage_file_leaves_lines_unsplit_with_a_warning_naming_it(tmp_path, content, problem):
    (tmp_path / "usage").mkdir()
    (tmp_path / "usage" / "msk-2024-09.csv").write_bytes(content)
    shared = [{"id": "kafka", "match": {"service": "MSK"}, "method": "usage_share",
               "usage": "usage/msk-{month}.csv", "weights": {"bytes": "1"}}]
    summary, allocations = _run(tmp_path, [line("2024-09-01 00:00:00", "3", service="MSK")], shared=shared)
    assert summary["currencies"]["USD"]["unallocated"] == "3" and allocations[0]["AllocatedMethodId"] is None
    [warning] = [w for w in summary["warnings"] if "kafka" in w]
    assert "msk-2024-09.csv malformed" in warning and problem in warning and "not split" in warning


@pytest.mark.parametrize("bad", ["-30", "nan", "NaN", "inf", "-Infinity"])
def test_a_negative_or_non_finite_usage_leaves_its_row_out_of_the_split_with_a_warning(tmp_path, bad):
    (tmp_path / "usage").mkdir()
    (tmp_path / "usage" / "msk-2024-09.csv").write_text(f"owner,bytes\nml,10\ndata,{bad}\nweb,30\n")
    shared = [{"id": "kafka", "match": {"service": "MSK"}, "method": "usage_share",
               "usage": "usage/msk-{month}.csv", "weights": {"bytes": "1"}}]
    summary, allocations = _run(tmp_path, [line("2024-09-01 00:00:00", "4", service="MSK")], shared=shared)
    # data's row is out: ml and web split 10:30 (a negative would have swollen their shares of the total)
    parts = {row["x_Owner"]: row["EffectiveCost"] for row in allocations if row["AllocatedMethodId"] == "kafka"}
    assert parts == {"ml": Decimal("1"), "web": Decimal("3")}
    uri = tmp_path / "usage" / "msk-2024-09.csv"
    [warning] = [w for w in summary["warnings"] if "kafka" in w]
    why = "is negative" if bad == "-30" else "is not a finite number"
    assert warning == (f"shared rule kafka: usage file {uri}: 1 row(s) left out of the split: row 3 (owner 'data'): "
                       f"bytes {bad!r} {why}\n  hint: fix the usage file: each usage value is a finite number >= 0 "
                       "(an owner without usage is 0); the split uses the other rows until then")


def test_a_negative_storage_usage_leaves_its_row_out_and_the_others_still_split(tmp_path):
    (tmp_path / "usage").mkdir()
    (tmp_path / "usage" / "lake-2024-09.csv").write_text(
        "owner,gb_months,last_access\nml,100,2024-09-25\ndata,-50,2024-09-25\narchive,100,2024-09-20\n")
    shared = [{"id": "lake", "match": {"service": "Amazon S3"}, "method": "storage_recency",
               "usage": "usage/lake-{month}.csv", "recency": [{"weight": "1"}]}]
    summary, allocations = _run(tmp_path, [line("2024-09-03 00:00:00", "10", service="Amazon S3")], shared=shared)
    parts = {row["x_Owner"]: row["EffectiveCost"] for row in allocations if row["AllocatedMethodId"] == "lake"}
    assert parts == {"ml": Decimal("5"), "archive": Decimal("5")}
    [warning] = [w for w in summary["warnings"] if "lake" in w]
    assert "lake-2024-09.csv: 1 row(s) left out of the split: row 3 (owner 'data'): gb_months '-50' is negative" \
        in warning and "\n  hint: " in warning


def test_owner_codes_stay_right_when_threads_meet_new_owners_together():
    """Batches are attributed on two threads: a new owner seen by both at once gets one code, and
    every code names its own owner (a wrong one would charge one owner's lines to another)."""
    import sys
    import threading

    from seedance_tasks.cost.allocate import _Codes

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for _ in range(100):
            codes, owners = _Codes(), [f"owner-{number}" for number in range(300)]
            seen: list[dict[str, int]] = [{} for _ in range(4)]

            def attribute(found: dict[str, int], codes: _Codes = codes, owners: list[str] = owners) -> None:
                for owner in owners:
                    found[owner] = codes.code(owner)

            threads = [threading.Thread(target=attribute, args=(found,)) for found in seen]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert codes.values == sorted(codes.values, key=owners.index) and len(codes.values) == len(owners)
            assert all(codes.values[code] == owner for found in seen for owner, code in found.items())
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.parametrize("content, problem", [
    ({"budgets": {"ml": {"amount": "-5"}}}, "'budgets.ml.amount': Input should be greater than or equal to 0"),
    ({"rules": [{"id": "r", "owner": "ml", "match": {"service": "x"}, "valid_from": "2025-01-01",
                 "valid_to": "2025-01-01"}]}, "rule r: valid_to 2025-01-01 is not after valid_from 2025-01-01"),
    ({"approvals": [{"owner": "ml", "from_month": "2024-09", "to_month": "2024-07", "up_to": "5"}]},
     "approval of ml: to_month 2024-07 is before from_month 2024-09"),
    ({"approvals": [{"owner": "ml", "from_month": "2024-09", "to_month": "2024-09", "up_to": "-1"}]},
     "'approvals.0.up_to': Input should be greater than or equal to 0"),
    ({"shared": [{"id": "s", "match": {"service": "*"}, "method": "storage_recency", "usage": "u.csv",
                  "recency": [{"weight": "-1"}]}]}, "'shared.0.recency.0.weight'"),
    ({"rules": [{"id": "r", "owner": "ml", "match": {}}]}, "a match needs at least one condition"),
])
def test_an_owners_file_that_cannot_mean_anything_is_refused_naming_the_key(tmp_path, content, problem):
    from seedance_tasks.cost.owners import load_owners
    from seedance_tasks.errors import ConfigError

    path = write_owners(tmp_path / "owners.yaml", **content)
    with pytest.raises(ConfigError) as caught:
        load_owners(str(path))
    assert problem in caught.value.message and str(path) in caught.value.message, caught.value.message
    assert caught.value.hint


@pytest.mark.parametrize("text, problem", [
    ("owner_tags: [owner]\nowner_tags: [team]\n", "line 2, column 1: key 'owner_tags' is given twice (first on line 1)"),
    ("owner_tags: [owner]\nrules:\n  - {id: r, owner: ml, match: {service: x}, valid_from: 2026-02-30}\n",
     "line 3"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nowner_tags: [*e]\n", "alias bomb"),
    ("owner_tags: !!python/object/apply:os.system [echo hi]\n", "python/object"),
])
def test_an_owners_file_is_read_with_the_hardened_yaml_loader(tmp_path, text, problem):
    from seedance_tasks.cost.owners import load_owners
    from seedance_tasks.errors import ConfigError

    path = tmp_path / "owners.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_owners(str(path))
    message = caught.value.message
    assert f"owners file {path} is not valid YAML" in message and problem in message, message
    assert caught.value.hint


def test_an_owners_file_that_is_not_utf8_is_refused_naming_it(tmp_path):
    from seedance_tasks.cost.owners import load_owners
    from seedance_tasks.errors import ConfigError

    path = tmp_path / "owners.yaml"
    path.write_bytes(b"owner_tags: [own\xe9r]\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text") as caught:
        load_owners(str(path))
    assert str(path) in caught.value.message and caught.value.hint
