"""Compaction benchmark: seedance vs DuckDB COPY, polars sink_parquet and plain cp, same lake.

Generates a Hive-partitioned lake of small (1-4 MB) Parquet files of event-log rows with
embeddings, then compacts it with each tool in its own process (so peak RSS is the tool's own)
and prints MB/s (input bytes / wall time) and peak RSS side by side, with ratios.

    python bench/compaction.py            # >= 2 GB lake (the issue's size)
    python bench/compaction.py --quick    # ~200 MB, a smoke run
    python bench/compaction.py --dataset lineitem   # TPC-H lineitem (tpchgen-cli) instead
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WORK = REPO / "bench" / "_work" / "compaction"
TARGET = 512 * 1024**2


def generate(lake: Path, total_bytes: int, partitions: int, seed: int = 11) -> dict:
    """Files of 1-4 MB (snappy, small row groups, as streaming writers leave them)."""
    import numpy as np
    import pyarrow.parquet as pq

    from seedance_tasks.compaction.sample import event_table

    rng = np.random.default_rng(seed)
    bytes_per_row = 215  # measured for event_table's rows at snappy
    written = files = rows = 0
    while written < total_bytes:
        part = lake / f"date=2026-11-{files % partitions + 1:02d}"
        part.mkdir(parents=True, exist_ok=True)
        n = int(rng.uniform(1, 4) * 1024**2 / bytes_per_row)
        path = part / f"part-{files:06d}.parquet"
        pq.write_table(event_table(n, rng, start_id=rows), path, compression="snappy", row_group_size=8192)
        written += path.stat().st_size
        files += 1
        rows += n
    old = time.time() - 7200
    for path in lake.rglob("*.parquet"):
        os.utime(path, (old, old))
    return {"files": files, "bytes": written, "rows": rows, "partitions": partitions}


def generate_lineitem(lake: Path, total_bytes: int, partitions: int) -> dict:
    """TPC-H lineitem from tpchgen-cli (offline), cut into ~2.5 MB snappy files over partitions."""
    import pyarrow.parquet as pq

    scale = max(total_bytes / 210e6, 0.05)  # lineitem is ~210 MB of snappy Parquet per scale factor
    parts = max(int(total_bytes / 2.5e6), partitions)
    raw = lake.parent / f"{lake.name}-raw"
    shutil.rmtree(raw, ignore_errors=True)
    subprocess.run(
        [str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", f"-s={scale:.3f}", "--tables=lineitem",
         f"--parts={parts}", "--compression=SNAPPY", "--row-group-bytes=1MB", f"--output-dir={raw}"],
        check=True,
    )
    files = written = rows = 0
    for index, path in enumerate(sorted((raw / "lineitem").glob("*.parquet"))):
        part = lake / f"shipdate_bucket={index % partitions:02d}"
        part.mkdir(parents=True, exist_ok=True)
        target = part / path.name
        path.rename(target)
        files += 1
        written += target.stat().st_size
        rows += pq.read_metadata(target).num_rows
    shutil.rmtree(raw, ignore_errors=True)
    old = time.time() - 7200
    for path in lake.rglob("*.parquet"):
        os.utime(path, (old, old))
    return {"files": files, "bytes": written, "rows": rows, "partitions": partitions}


def _partitions(lake: Path) -> list[Path]:
    return sorted(p for p in lake.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def run_seedance(lake: Path, out: Path) -> None:
    from seedance_tasks.compaction.run import compact_dataset
    from seedance_tasks.config import load_settings, settings_with

    settings = settings_with(load_settings(), "compaction", min_age="0")
    compact_dataset(str(out), settings)


def run_duckdb(lake: Path, out: Path) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    for part in _partitions(lake):
        target = out / part.name
        con.execute(
            f"COPY (SELECT * FROM read_parquet('{part}/*.parquet')) TO '{target}' "
            f"(FORMAT parquet, COMPRESSION zstd, FILE_SIZE_BYTES {TARGET}, PER_THREAD_OUTPUT false)"
        )


def run_polars(lake: Path, out: Path) -> None:
    import polars as pl

    for part in _partitions(lake):
        (out / part.name).mkdir(parents=True, exist_ok=True)
        pl.scan_parquet(str(part / "*.parquet")).sink_parquet(str(out / part.name / "part-0.parquet"), compression="zstd")


def run_cp(lake: Path, out: Path) -> None:
    subprocess.run(["cp", "-r", str(lake), str(out)], check=True)


PEERS = {"seedance": run_seedance, "duckdb": run_duckdb, "polars": run_polars, "cp": run_cp}


def prepare_seedance(lake: Path, out: Path) -> None:
    """Seedance compacts in place: give it a hard-linked twin of the lake (no bytes copied)."""
    subprocess.run(["cp", "-al", str(lake), str(out)], check=True)
    import seedance_tasks.compaction.run  # noqa: F401


# Untimed set-up: library imports and, for seedance, the hard-linked twin. Only the work is timed.
PREPARE = {
    "seedance": prepare_seedance,
    "duckdb": lambda lake, out: __import__("duckdb"),
    "polars": lambda lake, out: __import__("polars"),
}


def peer_main(name: str, lake: Path, out: Path) -> None:
    if name in PREPARE:
        PREPARE[name](lake, out)
    started = time.perf_counter()
    PEERS[name](lake, out)
    seconds = time.perf_counter() - started
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_rss_mb": max(own, children) / 1024}))


def _output_files(out: Path) -> list[int]:
    return [p.stat().st_size for p in out.rglob("*") if p.is_file() and "_seedance" not in p.parts
            and not p.name.startswith((".", "_"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~200 MB lake instead of 2 GB")
    parser.add_argument("--size-gb", type=float, default=None)
    parser.add_argument("--peers", default="seedance,polars,duckdb,cp")
    parser.add_argument("--dataset", choices=["events", "lineitem"], default="events",
                        help="events: event logs with embeddings; lineitem: TPC-H lineitem via tpchgen-cli")
    parser.add_argument("--run-peer", help=argparse.SUPPRESS)
    parser.add_argument("--lake", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_peer:
        peer_main(args.run_peer, args.lake, args.out)
        return 0

    size = args.size_gb or (0.2 if args.quick else 2.1)
    lake = WORK / f"{args.dataset}-{size:g}gb"
    if not (lake / "_generated.json").exists():
        shutil.rmtree(lake, ignore_errors=True)
        print(f"generating a {size:g} GB {args.dataset} lake of small files in {lake} ...", flush=True)
        make = generate if args.dataset == "events" else generate_lineitem
        info = make(lake, int(size * 1e9), partitions=8)
        (lake / "_generated.json").write_text(json.dumps(info))
    info = json.loads((lake / "_generated.json").read_text())
    print(f"lake ({args.dataset}): {info['files']:,} files, {info['bytes'] / 1e9:.2f} GB, {info['rows']:,} rows, "
          f"{info['partitions']} partitions; target file size 512 MiB; {os.cpu_count()} cores", flush=True)
    subprocess.run(["cat", *map(str, lake.rglob("*.parquet"))], stdout=subprocess.DEVNULL, check=True)  # warm cache

    results = {}
    for name in args.peers.split(","):
        out = WORK / f"out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        if name != "seedance":
            out.mkdir(parents=True)
        proc = subprocess.run(
            [sys.executable, __file__, "--run-peer", name, "--lake", str(lake), "--out", str(out)],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            print(f"{name} failed:\n{proc.stderr[-2000:]}")
            continue
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        sizes = _output_files(out)
        result.update(mb_s=info["bytes"] / 1e6 / result["seconds"], files=len(sizes),
                      mean_file_mb=(sum(sizes) / len(sizes) / 1e6) if sizes else 0)
        results[name] = result
        shutil.rmtree(out, ignore_errors=True)

    print()
    print(f"{'tool':<10} {'seconds':>8} {'MB/s':>8} {'peak RSS MB':>12} {'files':>6} {'mean MB':>8}  vs seedance")
    base = results.get("seedance", {}).get("mb_s")
    for name, r in results.items():
        ratio = f"{base / r['mb_s']:.2f}x" if base else "-"
        print(f"{name:<10} {r['seconds']:>8.1f} {r['mb_s']:>8.0f} {r['peak_rss_mb']:>12.0f} {r['files']:>6} "
              f"{r['mean_file_mb']:>8.0f}  seedance is {ratio} its speed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
