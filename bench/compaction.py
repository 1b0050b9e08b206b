"""Compaction benchmark: seedance vs polars sink_parquet, DuckDB COPY and plain cp, same lakes.

Generates Hive-partitioned lakes of small (1-4 MB) Parquet files, event-log rows with
embeddings and TPC-H lineitem (tpchgen-cli), then compacts each with every tool and prints
MB/s (input bytes / wall time), peak RSS and output sizes side by side, with ratios to polars.

Fairness (see docs/compaction.md, "Benchmark"): every peer runs in its own fresh process
(`bench/_peers.py`) and its peak RSS is that process's VmHWM; rounds run in turns (each round
starts one peer later) and the spread over rounds is printed; before every run the lake is read
once (page cache warm for everyone) and the previous run's output is removed and synced (no
write-back of someone else's bytes during a run); every tool gets the same two threads and the
same codec (zstd level 3, polars' default) with min/max statistics on.

    python bench/compaction.py                      # both data sets, 1 GB each, 3 rounds (~4 min idle)
    python bench/compaction.py --size-gb 2.1        # the issue's 2.1 GB lakes
    python bench/compaction.py --quick              # 0.2 GB each, 2 rounds: a smoke run
    python bench/compaction.py --dataset lineitem   # one data set only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import _peers  # noqa: E402

WORK = REPO / "bench" / "_work" / "compaction"
TARGET = 512 * 1024**2
THREADS = 2  # every peer: the cores of the machine this bench was tuned on, set explicitly
ZSTD_LEVEL = 3  # polars' default zstd level; seedance and DuckDB are set to the same


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


# --------------------------------------------------------------------------- the peers (in a child)


def run_seedance(lake: Path, out: Path) -> None:
    from seedance_tasks.compaction.run import compact_dataset
    from seedance_tasks.config import load_settings, settings_with

    settings = settings_with(load_settings(), "compaction", min_age="0", workers=THREADS,
                             compression="zstd", compression_level=ZSTD_LEVEL)
    report = compact_dataset(str(out), settings)
    if report["skipped"] or report["quarantined"]:
        raise SystemExit(f"seedance skipped or quarantined something: {report['skipped']} {report['quarantined']}")


def run_duckdb(lake: Path, out: Path) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {THREADS}")
    for part in _partitions(lake):
        target = out / part.name
        con.execute(
            f"COPY (SELECT * FROM read_parquet('{part}/*.parquet')) TO '{target}' "
            f"(FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL {ZSTD_LEVEL}, FILE_SIZE_BYTES {TARGET}, "
            f"PER_THREAD_OUTPUT false)"
        )


def run_polars(lake: Path, out: Path) -> None:
    import polars as pl

    for part in _partitions(lake):
        (out / part.name).mkdir(parents=True, exist_ok=True)
        pl.scan_parquet(str(part / "*.parquet")).sink_parquet(
            str(out / part.name / "part-0.parquet"), compression="zstd", compression_level=ZSTD_LEVEL,
            statistics=True,
        )


PEERS = {"seedance": run_seedance, "duckdb": run_duckdb, "polars": run_polars}


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
    PREPARE[name](lake, out)
    started = time.perf_counter()
    cpu = _cpu_s()
    PEERS[name](lake, out)
    _peers.report(time.perf_counter() - started, cpu_s=_cpu_s() - cpu)


def _cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- the parent


def _peer_env() -> dict:
    """The same thread budget for every tool (pyarrow's pools, polars, BLAS-style pools)."""
    env = dict(os.environ)
    env.update(POLARS_MAX_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS), ARROW_NUM_THREADS=str(THREADS))
    return env


def _warm(lake: Path) -> None:
    """Read every input once so each run starts with the lake in the page cache."""
    subprocess.run(["cat", *map(str, sorted(lake.rglob("*.parquet")))], stdout=subprocess.DEVNULL, check=True)


def _outputs(out: Path) -> list[Path]:
    return [p for p in out.rglob("*") if p.is_file() and "_seedance" not in p.relative_to(out).parts
            and not p.name.startswith((".", "_"))]


def _output_facts(out: Path) -> dict:
    """Files, bytes, rows and the write settings found in the outputs (codec, statistics, row groups)."""
    import pyarrow.parquet as pq

    files = _outputs(out)
    rows = row_groups = 0
    codecs, stats = set(), set()
    for path in files:
        meta = pq.read_metadata(path)
        rows += meta.num_rows
        row_groups += meta.num_row_groups
        if meta.num_row_groups:
            column = meta.row_group(0).column(0)
            codecs.add(column.compression.lower())
            stats.add("min/max" if column.is_stats_set and column.statistics.has_min_max else "none")
    return {"files": len(files), "out_bytes": sum(p.stat().st_size for p in files), "rows": rows,
            "row_groups": row_groups, "codec": ",".join(sorted(codecs)), "stats": ",".join(sorted(stats))}


def _run_one(name: str, lake: Path, expected_rows: int) -> dict:
    out = WORK / f"out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    if name != "seedance":
        out.mkdir(parents=True)
    _warm(lake)
    os.sync()  # nothing of an earlier run's output left to write back during this one
    argv = [__file__, "--run-peer", name, "--lake", str(lake), "--out", str(out)]
    if name == "cp":
        seconds, peak = _peers.run_tree(["cp", "-r", str(lake), str(out / lake.name)], env=_peer_env())
        result = {"seconds": seconds, "peak_rss_mb": peak, "cpu_s": float("nan")}
    else:
        result = _peers.measure(argv, env=_peer_env(), timeout=1800)
    result.update(_output_facts(out))
    if name != "cp" and result["rows"] != expected_rows:
        raise SystemExit(f"{name} wrote {result['rows']} rows, the lake holds {expected_rows}")
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    return result


def _lake(dataset: str, size: float) -> tuple[Path, dict]:
    lake = WORK / f"{dataset}-{size:g}gb"
    if not (lake / "_generated.json").exists():
        shutil.rmtree(lake, ignore_errors=True)
        print(f"generating a {size:g} GB {dataset} lake of small files in {lake} ...", flush=True)
        make = generate if dataset == "events" else generate_lineitem
        info = make(lake, int(size * 1e9), partitions=8)
        (lake / "_generated.json").write_text(json.dumps(info))
        os.sync()  # the fresh lake's write-back must not land in the first timed run
    return lake, json.loads((lake / "_generated.json").read_text())


def bench_dataset(dataset: str, size: float, names: list[str], count: int) -> None:
    lake, info = _lake(dataset, size)
    print(f"\n== {dataset}: {info['files']:,} files, {info['bytes'] / 1e9:.2f} GB, {info['rows']:,} rows, "
          f"{info['partitions']} partitions; target 512 MiB; {THREADS} threads each on {os.cpu_count()} cores; "
          f"zstd level {ZSTD_LEVEL}; {count} rounds in turns", flush=True)
    results = _peers.rounds(
        names, lambda name: _run_one(name, lake, info["rows"]), count=count,
        on_result=lambda name, index, r: print(f"  round {index + 1} {name:<9} {r['seconds']:6.2f} s "
                                               f"cpu {r['cpu_s']:6.2f} s {r['peak_rss_mb']:5.0f} MB", flush=True),
    )
    for runs in results.values():
        for r in runs:
            r["mb_s"] = info["bytes"] / 1e6 / r["seconds"]
    print(f"\n{'tool':<9} {'seconds':>18} {'cpu s':>18} {'MB/s':>8} {'peak RSS MB':>18} {'files':>5} {'out MB':>7} "
          f"{'row grp':>7} {'codec':>6} {'stats':>7}  vs polars: wall (polars s / tool s), cpu (polars cpu s / tool cpu s)")
    base = results.get("polars")
    for name, runs in results.items():
        last = runs[-1]
        ratio = "-"
        if base and name != "polars":
            ratio = f"wall {_peers.ratio_spread(runs, base)}"
            if name != "cp":
                ratio += f", cpu {_peers.ratio_spread(runs, base, 'cpu_s')}"
        cpu = _peers.spread(runs, "cpu_s") if name != "cp" else "-"
        print(f"{name:<9} {_peers.spread(runs):>18} {cpu:>18} {_peers.median(runs, 'mb_s'):>8.0f} "
              f"{_peers.spread(runs, 'peak_rss_mb', '{:.0f}'):>18} {last['files']:>5} {last['out_bytes'] / 1e6:>7.0f} "
              f"{last['row_groups']:>7} {last['codec']:>6} {last['stats']:>7}  {ratio}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="0.2 GB lakes and 2 rounds instead of 1 GB and 3")
    parser.add_argument("--size-gb", type=float, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--peers", default="seedance,polars,duckdb,cp")
    parser.add_argument("--dataset", choices=["events", "lineitem", "both"], default="both",
                        help="events: event logs with embeddings; lineitem: TPC-H lineitem via tpchgen-cli")
    parser.add_argument("--run-peer", help=argparse.SUPPRESS)
    parser.add_argument("--lake", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_peer:
        peer_main(args.run_peer, args.lake, args.out)
        return 0
    size = args.size_gb or (0.2 if args.quick else 1.0)
    count = args.rounds or (2 if args.quick else 3)
    names = args.peers.split(",")
    for dataset in (["events", "lineitem"] if args.dataset == "both" else [args.dataset]):
        bench_dataset(dataset, size, names, count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
