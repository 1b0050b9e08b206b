"""Cost recovery: seedance's monthly allocation vs DuckDB's, and the whole `seedance cost recover`.

Generates one month of FOCUS billing (Parquet; JSON tags with key variants such as `owner`,
`Owner`, ` owner`, `TEAM `; 40 owners; two currencies; CMDB rules for untagged lines), each size
in its own generator process before any peer runs, then runs every peer in a fresh process of its
own (bench/_peers.py: own peak RSS, VmHWM; rounds in turns, median and spread):

  1. seedance in process: parse + attribute (tags, then CMDB rules) + aggregate by owner and currency
  2. DuckDB: the same attribution in one SQL query
  3. `seedance cost recover` end to end (ingest, allocate, rules, statements, report, publish)

3 rounds at 5,000,000 rows, then 1 round at each scale size (20M, 50M by default) to show how time
and peak memory grow; owner totals must agree to the last digit in every run. `--quick`: 200,000
rows and a 1,000,000-row scale step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "bench" / "_work" / "cost"
MONTH = "2024-09"
OWNERS = [f"team-{index:02d}" for index in range(40)]
KEY_VARIANTS = ["owner", "Owner", " owner", "OWNER", "team", "Team ", "TEAM"]

OWNERS_YAML = """owner_tags: [owner, team]
rules:
  - {id: platform-accounts, owner: platform, match: {sub_account: "acct-00*"}}
  - {id: observability, owner: observability, match: {service: "AmazonCloudWatch"}}
"""


def generate(path: Path, rows: int, seed: int = 7) -> None:
    """One month of FOCUS lines as Parquet (row groups of 1M rows)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    pool = []
    for owner in OWNERS:
        for key in KEY_VARIANTS:
            for env in ("prod", "dev", "staging"):
                pool.append(json.dumps({key: owner, "environment": env, "application": f"app-{len(pool) % 97}"}))
    for index in range(200):  # conflicts: owner and team disagree (owner wins)
        pool.append(json.dumps({"owner": OWNERS[index % 40], "team": OWNERS[(index + 1) % 40]}))
    for env in ("prod", "dev"):  # tagged, but with no owner key
        pool.append(json.dumps({"environment": env}))
    tags_pool = pa.array(pool + [None], pa.string())
    services = pa.array(["Amazon Elastic Compute Cloud", "Amazon Simple Storage Service", "AmazonCloudWatch",
                         "Amazon SageMaker", "Amazon Elastic Kubernetes Service", "AWS Lambda",
                         "Amazon Relational Database Service", "Amazon Virtual Private Cloud",
                         "Amazon FSx", "Elastic Load Balancing"], pa.string())
    accounts = pa.array([f"acct-{index:03d}" for index in range(200)], pa.string())
    resources = pa.array([f"arn:aws:ec2:us-east-1:123456789012:instance/i-{index:017x}" for index in range(200_000)])
    start = np.datetime64("2024-09-01T00:00:00", "us").astype(np.int64)
    hour = 3_600_000_000
    writer = None
    chunk = 1_000_000
    for offset in range(0, rows, chunk):
        n = min(chunk, rows - offset)
        hours = rng.integers(0, 30 * 24, n)
        tag_index = rng.integers(0, len(pool), n)
        tag_index[rng.random(n) < 0.12] = len(pool)  # untagged
        cents = rng.integers(-2_000, 2_000_000_000, n, dtype=np.int64)  # 1e-10 units: up to 0.2 USD
        effective = (cents * rng.uniform(0.6, 1.0, n)).astype(np.int64)
        table = pa.table({
            "BillingAccountId": pa.array(np.full(n, "payer-1")),
            "SubAccountId": accounts.take(pa.array(rng.integers(0, 200, n))),
            "ChargePeriodStart": pa.array(start + hours * hour, pa.timestamp("us", "UTC")),
            "ChargePeriodEnd": pa.array(start + (hours + 1) * hour, pa.timestamp("us", "UTC")),  # hourly lines
            "BillingCurrency": pa.array(np.where(rng.random(n) < 0.95, "USD", "EUR")),
            "BilledCost": _decimal(cents),
            "EffectiveCost": _decimal(effective),
            "ServiceName": services.take(pa.array(rng.integers(0, len(services), n))),
            "ResourceId": resources.take(pa.array(rng.integers(0, len(resources), n))),
            "ChargeCategory": pa.array(np.full(n, "Usage")),
            "Tags": tags_pool.take(pa.array(tag_index)),
        })
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema, compression="zstd")
        writer.write_table(table, row_group_size=chunk)
    writer.close()


def _decimal(units):
    """int64 amounts in 1e-10 units as decimal128(38, 10), built from the buffers."""
    import numpy as np
    import pyarrow as pa

    words = np.empty((len(units), 2), np.int64)
    words[:, 0] = units
    words[:, 1] = units >> 63
    return pa.Array.from_buffers(pa.decimal128(38, 10), len(units), [None, pa.py_buffer(words.tobytes())])


DUCKDB_SQL = r"""
WITH lines AS (
  SELECT BillingCurrency AS currency, SubAccountId, ServiceName, EffectiveCost AS cost, Tags
  FROM read_parquet($path)
  WHERE ChargePeriodStart >= TIMESTAMPTZ '2024-09-01 00:00:00+00'
    AND ChargePeriodStart < TIMESTAMPTZ '2024-10-01 00:00:00+00'
), owned AS (
  SELECT currency, cost, coalesce(
    nullif(trim(regexp_extract(Tags, '"\s*(?i:owner)\s*"\s*:\s*"([^"]*)"', 1)), ''),
    nullif(trim(regexp_extract(Tags, '"\s*(?i:team)\s*"\s*:\s*"([^"]*)"', 1)), ''),
    CASE WHEN SubAccountId LIKE 'acct-00%' THEN 'platform'
         WHEN ServiceName = 'AmazonCloudWatch' THEN 'observability' END) AS owner
  FROM lines
)
SELECT currency, owner, sum(cost)::DECIMAL(38, 10) AS cost FROM owned GROUP BY ALL ORDER BY ALL
"""
# Tag keys by regular expression: the fastest DuckDB formulation found (6x faster than json_keys +
# list_filter + ->> on this data, same result); valid here because no generated value holds a quote.


def run_seedance(data: Path, owners: Path) -> dict:
    # modules imported before the clock starts, as duckdb's code is all loaded by its import: numpy.ma
    # (pyarrow imports it on the first array built from numpy, 23 ms) and _strptime (datetime.strptime's)
    import _strptime  # noqa: F401

    import numpy.ma  # noqa: F401

    import seedance_tasks.parallel  # noqa: F401
    from seedance_tasks.cost.allocate import allocate_month
    from seedance_tasks.cost.owners import load_owners

    batch_rows = _batch_rows()  # seedance's settings file, read before the clock (not allocation work)
    started = time.perf_counter()
    totals = allocate_month(str(data), load_owners(str(owners)), MONTH, batch_rows=batch_rows)
    seconds = time.perf_counter() - started
    result = {f"{c}|{o or ''}": str(v[0].normalize()) for (c, o), v in totals.by_owner.items()}
    return {"seconds": seconds, "result": result, "lines": totals.lines}


def run_duckdb(data: Path, owners: Path) -> dict:
    import duckdb

    started = time.perf_counter()
    rows = duckdb.connect().execute(DUCKDB_SQL, {"path": str(data)}).fetchall()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "result": {f"{c}|{o or ''}": str(v.normalize()) for c, o, v in rows}}


def run_cli(data: Path, owners: Path) -> dict:
    """`seedance cost recover` as a program: its wall time and the peak RSS of its process tree."""
    import shutil

    from _peers import run_tree

    out = WORK / "out"
    shutil.rmtree(out, ignore_errors=True)
    errors = WORK / "cli.stderr"
    with errors.open("w") as sink:
        try:
            seconds, peak_mb = run_tree([sys.executable, "-m", "seedance_tasks.cli", "cost", "recover", "--month",
                                         MONTH, "--billing", str(data), "--owners", str(owners), "--out", str(out),
                                         "--json"], stdout=subprocess.DEVNULL, stderr=sink, cwd=REPO)
        except subprocess.CalledProcessError as exc:
            raise SystemExit(f"seedance cost recover failed ({exc.returncode}): {errors.read_text()[-2000:]}") from None
    summary = json.loads((out / f"month={MONTH}" / "summary.json").read_text())
    result = {}
    for currency, entry in summary["currencies"].items():
        for owner, amount in entry["by_owner"].items():
            result[f"{currency}|{owner}"] = amount
        result[f"{currency}|"] = entry["unallocated"]
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": seconds, "result": result, "peak_rss_mb": peak_mb}


def _batch_rows() -> int:
    from seedance_tasks.config import load_settings

    return load_settings().cost.batch_rows


RUNNERS = {"seedance": run_seedance, "duckdb": run_duckdb, "cli": run_cli}
PEERS = ("duckdb", "seedance", "cli")


def _data(rows: int) -> Path:
    """The month of `rows` lines, generated in a process of its own (once; kept under bench/_work)."""
    path = WORK / f"focus-{MONTH}-{rows}-v2.parquet"  # v2: every ChargePeriodEnd after its start
    if not path.exists():
        print(f"generating {rows:,} FOCUS rows -> {path} ...", flush=True)
        started = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--generate", str(rows), "--data", str(path)], check=True, cwd=REPO)
        print(f"  {time.perf_counter() - started:.1f} s, {path.stat().st_size / 1e6:.0f} MB", flush=True)
    return path


def _size(text: str) -> int:
    text = text.strip().upper().replace("_", "")
    scale = {"K": 10**3, "M": 10**6}.get(text[-1:], 1)
    return int(float(text[:-1]) * scale) if scale > 1 else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=_size, default=5_000_000, help="rows of the main comparison (5M)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds in turns at --rows (3)")
    parser.add_argument("--scale", default="20M,50M", help="sizes run once each for the growth table ('' for none)")
    parser.add_argument("--quick", action="store_true", help="200,000 rows, scale 1M")
    parser.add_argument("--run", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--generate", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--owners", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "bench"))
    from _peers import measure, ratio_spread, report, rounds, spread

    if args.generate:  # written aside, then renamed: a half-written file is never taken for data
        partial = args.data.with_name(args.data.name + ".partial")
        generate(partial, args.generate)
        partial.replace(args.data)
        return 0
    if args.run:
        result = RUNNERS[args.run](args.data, args.owners)
        report(**result)
        return 0

    rows = 200_000 if args.quick else args.rows
    scale = [1_000_000] if args.quick else [_size(item) for item in args.scale.split(",") if item.strip()]
    WORK.mkdir(parents=True, exist_ok=True)
    owners = WORK / "owners.yaml"
    owners.write_text(OWNERS_YAML)
    paths = {size: _data(size) for size in [rows, *scale]}  # all generated before any peer runs

    def run(size: int):
        return lambda name: measure([__file__, "--run", name, "--data", paths[size], "--owners", owners], cwd=REPO)

    def show(name, index, result):
        print(f"  round {index + 1} {name:9} {result['seconds']:7.2f} s {result['peak_rss_mb']:8.0f} MB", flush=True)

    print(f"{args.rounds} rounds in turns at {rows:,} rows:", flush=True)
    main_runs = rounds(PEERS, run(rows), args.rounds, on_result=show)
    grown = {rows: {name: sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2] for name, runs in main_runs.items()}}
    same = all(r["result"] == main_runs["duckdb"][0]["result"] for runs in main_runs.values() for r in runs)
    for size in scale:
        print(f"1 round at {size:,} rows:", flush=True)
        runs = rounds(PEERS, run(size), 1, on_result=show)
        grown[size] = {name: found[0] for name, found in runs.items()}
        same = same and all(found[0]["result"] == runs["duckdb"][0]["result"] for found in runs.values())

    duck, ours, cli = (main_runs[name] for name in PEERS)
    print(f"\ncost allocation of {rows:,} FOCUS rows ({MONTH}, 40 owners + 2 CMDB owners, USD + EUR), "
          f"{args.rounds} rounds in turns, each peer a fresh process: median (min-max)")
    print(f"{'':36}{'seconds':>22}{'peak RSS MB':>22}{'DuckDB/peer':>22}")
    print(f"{'DuckDB, one SQL query':36}{spread(duck):>22}{spread(duck, 'peak_rss_mb', '{:.0f}'):>22}{'1.00x':>22}")
    print(f"{'seedance allocation, in process':36}{spread(ours):>22}{spread(ours, 'peak_rss_mb', '{:.0f}'):>22}"
          f"{ratio_spread(ours, duck):>22}")
    print(f"{'seedance cost recover, end to end':36}{spread(cli):>22}{spread(cli, 'peak_rss_mb', '{:.0f}'):>22}"
          f"{ratio_spread(cli, duck):>22}")
    print("(DuckDB/peer > 1: the peer is faster than DuckDB)")
    print(f"\ngrowth (median run at {rows:,}, one run above; batches of {_batch_rows():,} rows):")
    print(f"{'rows':>12}{'seedance s':>12}{'RSS MB':>9}{'DuckDB s':>10}{'RSS MB':>9}{'recover s':>11}{'RSS MB':>9}")
    for size, found in sorted(grown.items()):
        print(f"{size:>12,}{found['seedance']['seconds']:>12.2f}{found['seedance']['peak_rss_mb']:>9.0f}"
              f"{found['duckdb']['seconds']:>10.2f}{found['duckdb']['peak_rss_mb']:>9.0f}"
              f"{found['cli']['seconds']:>11.2f}{found['cli']['peak_rss_mb']:>9.0f}")
    print(f"owner totals identical across the three in every run (to the last digit): {'yes' if same else 'NO'}")
    if not same:
        for key in sorted(set(duck[0]["result"]) | set(ours[0]["result"])):
            if duck[0]["result"].get(key) != ours[0]["result"].get(key) or (
                    ours[0]["result"].get(key) != cli[0]["result"].get(key)):
                print(f"  {key}: duckdb {duck[0]['result'].get(key)} seedance {ours[0]['result'].get(key)} "
                      f"cli {cli[0]['result'].get(key)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
