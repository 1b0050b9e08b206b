"""Signals: one night of the audit (Seedance's rules) against DuckDB running the same billing and
CPU rules as SQL, on 30 days x N resources of metric samples and an M-line FOCUS month.
Each peer runs in a fresh process; time and peak RSS side by side, with ratios.

    python bench/signals.py            # 1,000 resources, 5,000,000 lines (run it once: minutes)
    python bench/signals.py --quick    # 50 resources, 50,000 lines
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "bench" / "_work" / "signals"
NIGHT = date(2024, 10, 30)
SERVICES = ["Amazon Elastic Compute Cloud", "Amazon Simple Storage Service", "AWS Lambda", "Amazon RDS"]
DESCRIPTIONS = ["$1.624 per On Demand Linux g5.4xlarge Instance Hour", "$0.090 per GB - first 10 TB / month data "
                "transfer out beyond the global free tier", "$0.004 per 10,000 GET and all other requests",
                "$0.08 per GB-month of General Purpose (gp3) provisioned storage"]


def generate(resources: int, lines: int) -> tuple[Path, Path]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = WORK / f"{resources}x{lines}"
    billing, metrics = folder / "billing.parquet", folder / "metrics.parquet"
    if billing.exists() and metrics.exists():
        return billing, metrics
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    first = datetime(NIGHT.year, NIGHT.month, 1, tzinfo=UTC)
    day = rng.integers(0, NIGHT.day, lines)
    resource = rng.integers(0, resources, lines)
    cost = np.round(rng.gamma(2.0, 0.5, lines), 6)
    tags = np.where(rng.random(lines) < 0.9, '{"owner": "team-' + pd_str(resource % 20) + '"}', "NULL")
    table = pa.table({
        "ChargePeriodStart": pa.array([first + timedelta(days=int(d)) for d in day], pa.timestamp("us", tz="UTC")),
        "ChargePeriodEnd": pa.array([first + timedelta(days=int(d) + 1) for d in day], pa.timestamp("us", tz="UTC")),
        "BillingCurrency": pa.array(["USD"] * lines),
        "BilledCost": pa.array([f"{c:.6f}" for c in cost]), "EffectiveCost": pa.array([f"{c:.6f}" for c in cost]),
        "ServiceName": pa.array([SERVICES[r % 4] for r in resource]),
        "ChargeDescription": pa.array([DESCRIPTIONS[r % 4] for r in resource]),
        "ResourceId": pa.array([f"i-{r:06d}" for r in resource]),
        "ConsumedQuantity": pa.array([f"{q:.3f}" for q in rng.random(lines) * 10]),
        "Tags": pa.array(tags),
    })
    pq.write_table(table, billing)
    step = 900
    stamps = np.arange((first - timedelta(days=0)).timestamp(), datetime(NIGHT.year, NIGHT.month, NIGHT.day + 1,
                                                                          tzinfo=UTC).timestamp(), step)
    stamps = stamps[-30 * 86400 // step:]
    parts = []
    for mode, share in (("idle", 0.8), ("user", 0.2)):
        for r in range(resources):
            labels = json.dumps({"cpu": "0", "mode": mode, "resource_group": f"i-{r:06d}"}, sort_keys=True)
            parts.append(pa.table({"timestamp": pa.array((stamps * 1000).astype("int64")).cast(pa.timestamp("ms", tz="UTC")),
                                   "name": pa.array(["node_cpu_seconds_total"] * len(stamps)),
                                   "labels": pa.array([labels] * len(stamps)),
                                   "value": pa.array((stamps - stamps[0]) * share)}))
    pq.write_table(pa.concat_tables(parts), metrics, compression="zstd")
    return billing, metrics


def pd_str(values):
    import numpy as np

    return np.char.mod("%d", values)


SEEDANCE = """
import json, resource, sys, time
from datetime import date
from seedance_tasks.config import load_settings
from seedance_tasks.signals.audit import evaluate_rule
from seedance_tasks.signals.sources import Inputs
t = time.perf_counter()
inputs = Inputs(load_settings().signals, billing_uri=sys.argv[1], metrics_uri=sys.argv[2])
out = {r: len(evaluate_rule(r, date(2024, 10, 30), inputs)["findings"])
       for r in ("egress-jump", "cost-surge", "unallocated-share", "idle-vcpu-spend")}
print(json.dumps({"seconds": time.perf_counter() - t, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "findings": out}))
"""

DUCKDB = """
import json, resource, sys, time
import duckdb
t = time.perf_counter()
db = duckdb.connect()
db.execute(f"create view b as select cast(ChargePeriodStart as date) d, cast(EffectiveCost as decimal(38,10)) c, "
           f"ServiceName s, ResourceId r, ChargeDescription x, cast(ConsumedQuantity as double) q, "
           f"json_extract_string(case when Tags = 'NULL' then null else Tags end, '$.owner') o "
           f"from read_parquet('{sys.argv[1]}')")
night = "date '2024-10-30'"
surge = db.execute(f'''with daily as (select s, d, sum(c) c from b group by s, d),
 hist as (select s, median(c) m from daily where d < {night} and d >= {night} - 28 group by s),
 mad as (select daily.s, median(abs(c - m)) mad from daily join hist using (s) where d < {night} group by daily.s)
 select count(*) from daily join hist using (s) join mad using (s) where d = {night} and c > m + 3 * mad and c >= m * 1.2''').fetchone()[0]
unalloc = db.execute(f"select sum(case when o is null then c else 0 end) / sum(c) > 0.05 from b "
                     f"where d >= date '2024-10-01' and d <= {night}").fetchone()[0]
egress = db.execute(f'''select count(*) from (select s, sum(case when d > {night} - 28 then c else 0 end) now,
 sum(case when d <= {night} - 28 then c else 0 end) before from b where regexp_matches(x, '(?i)data transfer out')
 and d > {night} - 56 group by s) where before > 0 and (now - before) / before >= 0.4''').fetchone()[0]
idle = db.execute(f'''with m as (select json_extract_string(labels, '$.resource_group') g,
 json_extract_string(labels, '$.mode') mode, max(value) - min(value) inc from read_parquet('{sys.argv[2]}')
 where name = 'node_cpu_seconds_total' and timestamp >= {night} and timestamp < {night} + 1 group by all),
 u as (select g, 1 - sum(case when mode = 'idle' then inc else 0 end) / sum(inc) util from m group by g),
 spend as (select r, sum(case when d > {night} - 7 then c else 0 end) now, sum(case when d <= {night} - 7 then c else 0 end) before
 from b where regexp_matches(x, '(?i)instance hour') and d > {night} - 14 group by r)
 select count(*) from spend join u on u.g = spend.r where before > 0 and (now - before) / before >= 0.1 and util < 0.3''').fetchone()[0]
print(json.dumps({"seconds": time.perf_counter() - t, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "findings": {"egress-jump": egress, "cost-surge": surge, "unallocated-share": int(bool(unalloc)),
                               "idle-vcpu-spend": idle}}))
"""


def fresh(code: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 resources, 50,000 lines")
    args = parser.parse_args()
    resources, lines = (50, 50_000) if args.quick else (1000, 5_000_000)
    began = time.perf_counter()
    billing, metrics = generate(resources, lines)
    print(f"data: {resources:,} resources x 30 days of samples, {lines:,} billing lines "
          f"({time.perf_counter() - began:.1f} s to generate, cached in {billing.parent})")
    ours, theirs = fresh(SEEDANCE, str(billing), str(metrics)), fresh(DUCKDB, str(billing), str(metrics))
    print(f"{'peer':<10}{'seconds':>10}{'peak RSS MB':>14}  findings")
    for name, result in (("seedance", ours), ("duckdb", theirs)):
        print(f"{name:<10}{result['seconds']:>10.2f}{result['rss_mb']:>14.0f}  {result['findings']}")
    print(f"ratio seedance/duckdb: time {ours['seconds'] / theirs['seconds']:.2f}x, "
          f"peak RSS {ours['rss_mb'] / theirs['rss_mb']:.2f}x")


if __name__ == "__main__":
    main()
