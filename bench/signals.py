"""Signals: one night of the audit (Seedance's rules) against DuckDB running the same rules as SQL.

Rules compared: egress-jump, cost-surge (service and owner), unallocated-share and idle-vcpu-spend,
on N resources x 30 days of `node_cpu_seconds_total` samples (every 15 min, idle and user mode)
and M FOCUS lines over the 8 weeks the rules read (egress-jump compares the last four weeks with
the four before). Leaks are planted so that every rule fires: Lambda's data transfer out +60%
with requests flat, RDS at 2.5x on the night, 10% of the resources' compute spend +30% over the
last week (at CPU between 12% and 45%), 10% of the lines untagged. The SQL takes its thresholds
and description patterns from the same `signals:` settings; both peers must find the same
findings (signal and key) before anything is printed. Each peer runs in its own fresh process
and reports its own time and peak RSS (VmHWM).

    python bench/signals.py                    # 1,000 resources, 5,000,000 lines (minutes)
    python bench/signals.py --quick            # 50 resources, 50,000 lines
    python bench/signals.py --resources 200 --lines 1000000
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "bench" / "_work" / "signals"
NIGHT = date(2024, 10, 30)
DAYS = 56
SERVICES = ["Amazon Elastic Compute Cloud", "Amazon Simple Storage Service", "AWS Lambda", "Amazon RDS"]
DESCRIPTIONS = ["$1.624 per On Demand Linux g5.4xlarge Instance Hour", "$0.090 per GB - first 10 TB / month data "
                "transfer out beyond the global free tier", "$0.004 per 10,000 GET and all other requests",
                "$0.08 per GB-month of General Purpose (gp3) provisioned storage"]
UTILS = [0.12, 0.22, 0.28, 0.35, 0.45]  # CPU busy shares (none at the 30% threshold)
RULES = ("egress-jump", "cost-surge", "unallocated-share", "idle-vcpu-spend")


def generate(resources: int, lines: int) -> tuple[Path, Path]:
    """FOCUS lines (Parquet) and metric samples (Parquet), generated vectorised, cached by size."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    folder = WORK / f"{resources}x{lines}"
    billing, metrics = folder / "billing.parquet", folder / "metrics.parquet"
    if billing.exists() and metrics.exists():
        return billing, metrics
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    back = rng.integers(0, DAYS, lines)  # days before the night
    resource = rng.integers(0, resources, lines)
    service, kind = resource % 4, (resource // 4) % 4
    cost = rng.gamma(2.0, 0.5, lines)
    cost = np.where((kind == 1) & (service == 2) & (back < 28), cost * 1.6, cost)  # egress-jump
    cost = np.where((service == 3) & (back == 0), cost * 2.5, cost)  # cost-surge
    cost = np.where((kind == 0) & (resource % 10 == 0) & (back < 7), cost * 1.3, cost)  # idle-vcpu-spend
    night = np.datetime64(NIGHT.isoformat(), "s")
    start = pa.array((night - back.astype("timedelta64[D]")).astype("datetime64[us]")).cast(pa.timestamp("us", "UTC"))
    end = pa.array((night - (back - 1).astype("timedelta64[D]")).astype("datetime64[us]")).cast(
        pa.timestamp("us", "UTC"))
    costs = pc.cast(pa.array(np.round(cost, 6)), pa.string())
    owner = pc.binary_join_element_wise('{"owner": "team-', pc.cast(pa.array(resource % 20), pa.string()), '"}', "")
    tags = pc.if_else(pa.array(rng.random(lines) < 0.9), owner, pa.scalar(None, pa.string()))
    ids = pc.binary_join_element_wise("i-", pc.utf8_lpad(pc.cast(pa.array(resource), pa.string()), 6, "0"), "")
    table = pa.table({
        "ChargePeriodStart": start, "ChargePeriodEnd": end,
        "BillingCurrency": pa.array(np.full(lines, "USD")),
        "BilledCost": costs, "EffectiveCost": costs,
        "ServiceName": pa.DictionaryArray.from_arrays(pa.array(service, pa.int32()), pa.array(SERVICES)),
        "ChargeDescription": pa.DictionaryArray.from_arrays(pa.array(kind, pa.int32()), pa.array(DESCRIPTIONS)),
        "ResourceId": ids,
        "ConsumedQuantity": pc.cast(pa.array(np.round(rng.random(lines) * 10, 3)), pa.string()),
        "Tags": tags,
    })
    pq.write_table(table, billing)

    step = 900
    stop = (night + np.timedelta64(1, "D")).astype("datetime64[s]").astype(np.int64)
    stamps = np.arange(stop - 30 * 86400, stop, step)
    busy = np.array(UTILS)[(np.arange(resources) * 7) % len(UTILS)]
    parts = []
    for mode, share in (("idle", 1 - busy), ("user", busy)):
        labels = pa.array([json.dumps({"cpu": "0", "mode": mode, "resource_group": f"i-{r:06d}"}, sort_keys=True)
                           for r in range(resources)])
        series = np.repeat(np.arange(resources), len(stamps))
        parts.append(pa.table({
            "timestamp": pa.array(np.tile(stamps * 1000, resources)).cast(pa.timestamp("ms", "UTC")),
            "name": pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(series), np.int32)),
                                                   pa.array(["node_cpu_seconds_total"])),
            "labels": labels.take(pa.array(series)),
            "value": pa.array(np.tile(stamps - stamps[0], resources) * np.repeat(share, len(stamps)), pa.float64()),
        }))
    pq.write_table(pa.concat_tables(parts).cast(pa.schema([
        ("timestamp", pa.timestamp("ms", "UTC")), ("name", pa.string()), ("labels", pa.string()),
        ("value", pa.float64())])), metrics, compression="zstd")
    return billing, metrics


PEAK = """
def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

SEEDANCE = PEAK + """
import json, sys, time
from datetime import date
from seedance_tasks.config import load_settings
from seedance_tasks.signals.audit import evaluate_rule
from seedance_tasks.signals.sources import Inputs
t = time.perf_counter()
inputs = Inputs(load_settings().signals, billing_uri=sys.argv[1], metrics_uri=sys.argv[2])
found = {r: sorted(f["key"] for f in evaluate_rule(r, date.fromisoformat(sys.argv[3]), inputs)["findings"])
         for r in json.loads(sys.argv[4])}
print(json.dumps({"seconds": time.perf_counter() - t, "rss_mb": peak_mb(), "findings": found}))
"""

DUCKDB = PEAK + """
import json, sys, time
import duckdb
billing, metrics, night, rules, cfg = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5])
t = time.perf_counter()
db = duckdb.connect()
db.execute("set TimeZone = 'UTC'")
N = f"date '{night}'"
def matches(patterns):
    return " or ".join(f"regexp_matches(x, '{p}')" for p in patterns) or "false"
owner = "coalesce(" + ", ".join(f"nullif(trim(json_extract_string(Tags, '$.{k}')), '')" for k in cfg["owner_tags"]) + ")"
db.execute(f'''create temp table b as select cast(ChargePeriodStart as date) d, cast(BillingCurrency as varchar) cur,
 cast(EffectiveCost as decimal(38, 10)) c, cast(ServiceName as varchar) s, ResourceId r,
 coalesce(try_cast(replace(cast(ConsumedQuantity as varchar), ',', '') as double), 0) q, {owner} o,
 case when {matches(cfg["egress_patterns"])} then 'egress' when {matches(cfg["iops_patterns"])} then 'piops'
  when {matches(cfg["request_patterns"])} then 'requests' when {matches(cfg["compute_patterns"])} then 'compute'
  else 'other' end kind
 from (select *, coalesce(cast(ChargeDescription as varchar), '') x from read_parquet('{billing}'))''')
found = {}
found["egress-jump"] = db.execute(f'''
 with req as (select cur, sum(case when d > {N} - 28 then q else 0 end) now, sum(case when d <= {N} - 28 then q else 0 end) before
   from b where kind = 'requests' and d > {N} - 56 and d <= {N} group by cur),
 eg as (select cur, s, sum(case when d > {N} - 28 then c else 0 end) now, sum(case when d <= {N} - 28 then c else 0 end) before
   from b where kind = 'egress' and d > {N} - 56 and d <= {N} group by cur, s)
 select coalesce(s, 'None') from eg left join req using (cur)
 where eg.before > 0 and (eg.now - eg.before) / eg.before * 100 >= {cfg["egress_jump_percent"]}
  and abs(case when coalesce(req.before, 0) > 0 then (req.now - req.before) / req.before * 100 else 0 end)
      < {cfg["egress_requests_max_change_percent"]}''').fetchall()
found["cost-surge"] = db.execute(f'''
 with keyed as (select cur, 'service' dim, s name, d, c, q from b union all select cur, 'owner', o, d, c, q from b),
 daily as (select cur, dim, name, d, sum(c) c, sum(q) q from keyed
   where name is not null and d >= {N} - 28 and d <= {N} group by all),
 today as (select * from daily where d = {N}),
 cal as (select cast(unnest(generate_series({N} - 28, {N} - 1, interval 1 day)) as date) d),
 hist as (select t.cur, t.dim, t.name, coalesce(x.c, 0) c, coalesce(x.q, 0) q from today t cross join cal
   left join daily x on x.cur = t.cur and x.dim = t.dim and x.name = t.name and x.d = cal.d),
 stats as (select cur, dim, name, median(c) m, median(q) qm from hist group by all),
 spread as (select h.cur, h.dim, h.name, median(abs(h.c - st.m)) mad from hist h join stats st using (cur, dim, name)
   group by all)
 select dim || '=' || name from today join stats using (cur, dim, name) join spread using (cur, dim, name)
 where c > m + {cfg["surge_k"]} * mad and c >= m * (1 + {cfg["surge_min_percent"]} / 100)
  and not (qm > 0 and q > qm * (1 + {cfg["surge_usage_percent"]} / 100))''').fetchall()
found["unallocated-share"] = db.execute(f'''
 select strftime({N}, '%Y-%m') || ':' || cur from b where d >= date_trunc('month', {N}) and d <= {N} group by cur
 having sum(c) > 0 and sum(case when o is null then c else 0 end) / sum(c) * 100 > {cfg["unallocated_percent"]}''').fetchall()
found["idle-vcpu-spend"] = db.execute(f'''
 with s as (select labels, json_extract_string(labels, '$.{cfg["group_label"]}') g, json_extract_string(labels, '$.mode') mode,
   value, value - lag(value) over (partition by labels order by timestamp) step from read_parquet('{metrics}')
   where name = 'node_cpu_seconds_total' and timestamp >= cast({N} as timestamptz)
   and timestamp < cast({N} + 1 as timestamptz)),
 u as (select g, sum(case when step >= 0 then step else value end) total,
   sum(case when mode = 'idle' then (case when step >= 0 then step else value end) else 0 end) idle
   from s where step is not null and g is not null and g <> '' group by g),
 spend as (select r, sum(case when d > {N} - 7 then c else 0 end) now, sum(case when d <= {N} - 7 then c else 0 end) before
   from b where kind = 'compute' and d > {N} - 14 and d <= {N} group by r)
 select r from spend join u on u.g = spend.r
 where u.total > 0 and before > 0 and (now - before) / before * 100 >= {cfg["vcpu_spend_rise_percent"]}
  and round((1 - idle / total) * 100, 2) < {cfg["idle_vcpu_percent"]}''').fetchall()
found = {rule: sorted(row[0] for row in found[rule]) for rule in rules}
print(json.dumps({"seconds": time.perf_counter() - t, "rss_mb": peak_mb(), "findings": found}))
"""


def fresh(code: str, *args: str) -> dict:
    """Run `code` in a new interpreter; its last stdout line is its JSON result."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def rule_config() -> dict:
    """The `signals:` thresholds and patterns the SQL needs, from the same settings Seedance reads."""
    sys.path.insert(0, str(REPO))
    from seedance_tasks.config import load_settings

    return load_settings().signals.model_dump(mode="json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 resources, 50,000 lines")
    parser.add_argument("--resources", type=int, default=1000)
    parser.add_argument("--lines", type=int, default=5_000_000)
    args = parser.parse_args()
    resources, lines = (50, 50_000) if args.quick else (args.resources, args.lines)
    began = time.perf_counter()
    billing, metrics = generate(resources, lines)
    print(f"data: {resources:,} resources x 30 days of node_cpu_seconds_total samples (15 min), {lines:,} FOCUS "
          f"lines over {DAYS} days ({time.perf_counter() - began:.1f} s to generate, cached in {billing.parent})")
    common = [str(billing), str(metrics), NIGHT.isoformat(), json.dumps(RULES)]
    ours = fresh(SEEDANCE, *common)
    theirs = fresh(DUCKDB, *common, json.dumps(rule_config()))
    if ours["findings"] != theirs["findings"]:
        raise SystemExit("the peers disagree:\n" + "\n".join(
            f"  {rule}: seedance {ours['findings'][rule]} duckdb {theirs['findings'][rule]}" for rule in RULES
            if ours["findings"][rule] != theirs["findings"][rule]))
    print("same findings on both sides: " + ", ".join(f"{rule} {len(keys)}" for rule, keys in ours["findings"].items()))
    print(f"{'peer':<10}{'seconds':>10}{'peak RSS MB':>14}")
    for name, result in (("seedance", ours), ("duckdb", theirs)):
        print(f"{name:<10}{result['seconds']:>10.2f}{result['rss_mb']:>14.0f}")
    print(f"ratio seedance/duckdb: time {ours['seconds'] / theirs['seconds']:.2f}x, "
          f"peak RSS {ours['rss_mb'] / theirs['rss_mb']:.2f}x")
    print(f"machine: {platform.processor() or platform.machine()}, {_cpus()} CPUs, Python {platform.python_version()}")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


if __name__ == "__main__":
    main()
