"""Shard writing speed: seedance's shard builder vs webdataset.ShardWriter vs GNU tar, same files, one run.

Data: a directory of samples in WebDataset's convention (KEY.jpg with incompressible payloads of
40-180 KB, KEY.cls, KEY.json), generated once under bench/_work/shards/ and read once before timing
so every peer starts from a warm page cache. Each peer reads the same files in the same order and
writes tars to local disk: seedance `shards.build` (sized shards + index with sha256),
`webdataset.ShardWriter(maxsize=...)` (sized shards), `tar cf` (one archive, no sizing). Prints
input MB/s, the ratio against each peer, and how close full shards come to the requested size.

    .venv/bin/python bench/shards.py            # 4,000 samples (~450 MB), 64 MiB shards
    .venv/bin/python bench/shards.py --quick    # 500 samples (~55 MB), 8 MiB shards
    .venv/bin/python bench/shards.py --small    # 40,000 small samples (4-16 KB, ~400 MB), 8 MiB shards
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
WORK = REPO / "bench" / "_work" / "shards"


def make_source(directory: Path, samples: int, payload_range: tuple[int, int] = (40_000, 180_000)) -> int:
    marker = directory / ".complete"
    if marker.exists() and json.loads(marker.read_text())["samples"] == samples:
        return json.loads(marker.read_text())["bytes"]
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    import random

    rng = random.Random(0)
    total = 0
    for number in range(samples):
        key = f"img{number:07d}"
        payload = os.urandom(rng.randint(*payload_range))  # JPEG-like: incompressible
        (directory / f"{key}.jpg").write_bytes(payload)
        (directory / f"{key}.cls").write_text(str(number % 1000))
        meta = json.dumps({"id": number, "source": "bench"})
        (directory / f"{key}.json").write_text(meta)
        total += len(payload) + len(str(number % 1000)) + len(meta)
    marker.write_text(json.dumps({"samples": samples, "bytes": total}))
    return total


def warm(directory: Path) -> None:
    for path in directory.iterdir():
        path.read_bytes()


def run_seedance(src: Path, out: Path, shard_size: int) -> list[int]:
    from seedance_tasks.shards.build import build
    from seedance_tasks.shards.settings import ShardSettings

    # The peers write bytes without decoding them, and the payloads are random bytes: no decode check.
    report = build(str(src), str(out), settings=ShardSettings(shard_size=shard_size, check_decode=False))
    if report["rejected"] or not report["samples"]:
        raise SystemExit(f"seedance rejected samples: {report['rejected'][:3]}")
    return [p.stat().st_size for p in sorted(out.glob("*.tar"))]


def run_webdataset(src: Path, out: Path, shard_size: int) -> list[int]:
    import webdataset as wds

    out.mkdir(parents=True)
    names = sorted(p.name for p in src.iterdir() if not p.name.startswith("."))
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name.split(".", 1)[0], []).append(name)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=shard_size, maxcount=10**9, verbose=0) as writer:
        for key in sorted(groups):
            sample = {"__key__": key}
            for name in groups[key]:
                sample[name.split(".", 1)[1]] = (src / name).read_bytes()
            writer.write(sample)
    return [p.stat().st_size for p in sorted(out.glob("*.tar"))]


def run_gnu_tar(src: Path, out: Path, shard_size: int) -> list[int]:
    out.mkdir(parents=True)
    subprocess.run(["tar", "--sort=name", "--exclude=.complete", "-cf", str(out / "all.tar"), "-C", str(src), "."],
                   check=True)
    return [(out / "all.tar").stat().st_size]


def size_report(sizes: list[int], requested: int) -> str:
    full = sizes[:-1]
    if not full:
        return "one archive (no size limit)"
    worst = max(abs(size - requested) / requested for size in full)
    over = sum(size > requested for size in full)
    return f"{len(sizes)} shards; full ones within {worst:.1%} of {requested >> 20} MiB, {over} over"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 samples, 8 MiB shards")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--shard-size-mib", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=2, help="best of N runs per peer")
    parser.add_argument("--small", action="store_true",
                        help="small samples (4-16 KB payloads, e.g. thumbnails or tokens): per-member costs dominate")
    args = parser.parse_args()
    samples = args.samples or (500 if args.quick else 40_000 if args.small else 4000)
    shard_size = (args.shard_size_mib or (8 if args.quick or args.small else 64)) << 20
    src = WORK / f"src-{samples}{'-small' if args.small else ''}"
    total = make_source(src, samples, (4_000, 16_000) if args.small else (40_000, 180_000))
    warm(src)
    peers = [("seedance shards build", run_seedance), ("webdataset.ShardWriter", run_webdataset),
             ("GNU tar (one archive)", run_gnu_tar)]
    results = {}
    for name, runner in peers:
        best = None
        for attempt in range(args.repeat):
            out = WORK / f"out-{runner.__name__}-{attempt}"
            shutil.rmtree(out, ignore_errors=True)
            started = time.perf_counter()
            sizes = runner(src, out, shard_size)
            elapsed = time.perf_counter() - started
            shutil.rmtree(out, ignore_errors=True)
            if best is None or elapsed < best[0]:
                best = (elapsed, sizes)
        results[name] = best
    print(f"\nshard writing: {samples:,} samples, {total / 1e6:.0f} MB of payload, warm page cache, "
          f"{os.cpu_count()} CPU(s), best of {args.repeat}")
    ours = total / 1e6 / results["seedance shards build"][0]
    print(f"{'writer':<26}{'MB/s':>8}{'seedance x':>12}  shard sizes")
    for name, (elapsed, sizes) in results.items():
        rate = total / 1e6 / elapsed
        print(f"{name:<26}{rate:>8.0f}{ours / rate:>11.2f}x  {size_report(sizes, shard_size)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
