"""Preprocessing throughput: seedance's I/O-pool/CPU-pool pipeline vs a plain single-process loop vs
`torch.utils.data.DataLoader(num_workers=2)` over `webdataset.WebDataset`, same shards, same work.

The work, for every peer: read the samples from WebDataset tar shards on local disk, decode the
JPEG, resize the short side to 224 and center-crop (bilinear), convert to a uint8 array (3, 224,
224), write it as KEY.npy (plus KEY.cls) into output tar shards. Samples/s counts samples written.

Data: photo-like 640x480 JPEGs (quality 85, ~60 KB), generated once under bench/_work/preprocess/
(a few hundred distinct images repeated under distinct keys, so generation stays quick; decoding
cost does not depend on repetition), packed into shards by `seedance shards build`. Two extra rows
separate the gain of the pools from that of reduced-size JPEG decoding (`draft`): seedance with
`draft` off, and the DataLoader given the same `draft` decode.

    .venv/bin/python bench/preprocess.py            # 20,000 samples (as in the issue), 64 MiB shards
    .venv/bin/python bench/preprocess.py --quick    # 1,000 samples, 8 MiB shards
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
WORK = REPO / "bench" / "_work" / "preprocess"
SIZE = 224


def make_shards(samples: int, shard_mib: int, distinct: int = 300) -> Path:
    """Samples (KEY.jpg, KEY.cls) packed into shards; cached by sample count and shard size."""
    import numpy as np

    from seedance_tasks.shards.build import build
    from seedance_tasks.shards.sample import jpeg_bytes, photo_like
    from seedance_tasks.shards.settings import ShardSettings

    shards = WORK / f"shards-{samples}-{shard_mib}"
    if (shards / "shardindex.json").exists():
        return shards
    src = WORK / f"src-{samples}"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = [jpeg_bytes(photo_like(rng, 640, 480)) for _ in range(min(distinct, samples))]
    for number in range(samples):
        (src / f"img{number:07d}.jpg").write_bytes(images[number % len(images)])
        (src / f"img{number:07d}.cls").write_text(str(number % 1000))
    build(str(src), str(shards), settings=ShardSettings(shard_size=shard_mib << 20))
    shutil.rmtree(src)
    return shards


class NpyShardWriter:
    """Output shards for the peers: KEY.npy + KEY.cls, a new tar every `per_shard` samples."""

    def __init__(self, directory: Path, per_shard: int = 1000):
        from seedance_tasks.preprocess.transform import npy_header

        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.per_shard = per_shard
        self.header = npy_header(SIZE)
        self.count = 0
        self.shards = 0
        self.writer = None
        self.sink = None

    def add(self, key: str, array_bytes: bytes, cls: bytes) -> None:
        from seedance_tasks.shards.tario import LocalSink, TarShardWriter

        if self.writer is None:
            self.sink = LocalSink(str(self.directory / f"out-{self.shards:06d}.tar"))
            self.writer = TarShardWriter(self.sink)
        self.writer.add_sample(key, {"npy": self.header + array_bytes, "cls": cls})
        self.count += 1
        if self.writer.samples >= self.per_shard:
            self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.sink.close()
            self.writer = None
            self.shards += 1


def run_seedance(shards: Path, out: Path, draft: bool = True) -> dict:
    from seedance_tasks.preprocess.run import run
    from seedance_tasks.preprocess.settings import PreprocessSettings

    result = run(str(shards), str(out), settings=PreprocessSettings(size=SIZE, draft=draft))
    return {"samples": result["samples_out"], "shares": result["stage_shares"],
            "cpu": result["cpu_seconds"]["parent"] + result["cpu_seconds"]["workers"],
            "pools": f"{result['io_workers']} I/O thread(s) + {result['cpu_workers']} process(es)"}


def run_plain(shards: Path, out: Path) -> dict:
    """One process, one loop: read tar, decode, resize+crop, convert, write; each stage timed."""
    from seedance_tasks.preprocess.transform import to_chw
    from seedance_tasks.shards.index import resolve_shards
    from seedance_tasks.shards.tario import iter_members, iter_samples

    writer = NpyShardWriter(out)
    times = {"read": 0.0, "decode": 0.0, "resize": 0.0, "convert": 0.0, "write": 0.0}
    for shard in resolve_shards(str(shards)).shards:
        with open(shard.location.path, "rb") as stream:
            samples = iter_samples(iter_members(stream, shard.uri), shard.uri)
            while True:
                t0 = time.perf_counter()
                sample = next(samples, None)
                times["read"] += time.perf_counter() - t0
                if sample is None:
                    break
                stages = [0.0, 0.0, 0.0]
                array = to_chw(sample.members["jpg"], SIZE, draft=False, timings=stages).tobytes()
                times["decode"] += stages[0]
                times["resize"] += stages[1]
                times["convert"] += stages[2]
                t0 = time.perf_counter()
                writer.add(sample.key, array, sample.members["cls"])
                times["write"] += time.perf_counter() - t0
    writer.close()
    total = sum(times.values())
    return {"samples": writer.count, "shares": {k: round(v / total, 3) for k, v in times.items()},
            "pools": "1 process", "cpu": None}


class _Transform:
    """The DataLoader peer's per-sample work (picklable for its worker processes)."""

    def __init__(self, draft: bool):
        self.draft = draft

    def __call__(self, sample: dict) -> tuple:
        from seedance_tasks.preprocess.transform import to_chw

        # draft=False is webdataset's "pil" decoding (a full decode) followed by the same
        # resize/crop/convert; draft=True is seedance's reduced-size JPEG decode.
        return sample["__key__"], to_chw(sample["jpg"], SIZE, draft=self.draft), int(sample["cls"])


def run_dataloader(shards: Path, out: Path, draft: bool = False) -> dict:
    import torch
    import webdataset as wds

    from seedance_tasks.shards.index import resolve_shards

    urls = [shard.location.path for shard in resolve_shards(str(shards)).shards]
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_Transform(draft))
    # The default collate: workers stack each batch into one tensor in shared memory (torch's
    # fast path), the main process writes the arrays out.
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, num_workers=2)
    writer = NpyShardWriter(out)
    for keys, arrays, classes in loader:
        arrays = arrays.numpy()
        for key, array, cls in zip(keys, arrays, classes.tolist(), strict=True):
            writer.add(key, array.tobytes(), str(cls).encode())
    writer.close()
    return {"samples": writer.count, "shares": None, "pools": "2 worker processes", "cpu": None}


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 samples, 8 MiB shards")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--shard-size-mib", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs per peer, in reversed order every other round (the machine's load drifts)")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    samples = args.samples or (1000 if args.quick else 20_000)
    shard_mib = args.shard_size_mib or (8 if args.quick else 64)
    shards = make_shards(samples, shard_mib)
    import torch  # noqa: F401  - imported before timing, so no peer pays for it
    import webdataset  # noqa: F401
    for tar in shards.glob("*.tar"):  # warm page cache for every peer alike
        tar.read_bytes()
    peers = [
        ("seedance pipeline", lambda o: run_seedance(shards, o)),
        ("plain loop, 1 process", lambda o: run_plain(shards, o)),
        ("DataLoader(2) + WebDataset", lambda o: run_dataloader(shards, o)),
        ("  seedance, draft off", lambda o: run_seedance(shards, o, draft=False)),
        ("  DataLoader(2), draft decode", lambda o: run_dataloader(shards, o, draft=True)),
    ]
    results = {}
    runs: dict[str, list[dict]] = {name: [] for name, _ in peers}
    for round_number in range(args.rounds):  # reversed order every other round: fair to load drift
        order = peers if round_number % 2 == 0 else peers[::-1]
        for name, runner in order:
            out = WORK / "out"
            shutil.rmtree(out, ignore_errors=True)
            started = time.perf_counter()
            cpu_started = _cpu_seconds()
            result = runner(out)
            result["seconds"] = time.perf_counter() - started
            if result["cpu"] is None:  # this process plus its reaped children (DataLoader workers)
                result["cpu"] = _cpu_seconds() - cpu_started
            shutil.rmtree(out, ignore_errors=True)
            if result["samples"] != samples:
                print(f"{name}: wrote {result['samples']} of {samples} samples", file=sys.stderr)
                return 1
            runs[name].append(result)
            print(f"  round {round_number + 1}, {name}: {samples / result['seconds']:.0f} samples/s",
                  file=sys.stderr, flush=True)
    results = {}
    for name, attempts in runs.items():
        seconds = sum(r["seconds"] for r in attempts)
        results[name] = {**attempts[0], "seconds": seconds, "samples_per_s": samples * len(attempts) / seconds,
                         "cpu_ms_per_sample": 1000 * sum(r["cpu"] for r in attempts) / (samples * len(attempts))}
    loader = results["DataLoader(2) + WebDataset"]["samples_per_s"]
    print(f"\npreprocessing: {samples:,} 640x480 JPEGs -> uint8 (3, {SIZE}, {SIZE}) .npy shards, "
          f"{len(list(shards.glob('*.tar')))} input shards, {os.cpu_count()} CPU(s), {args.rounds} round(s), "
          f"load average {os.getloadavg()[0]:.1f}")
    loader_cpu = results["DataLoader(2) + WebDataset"]["cpu_ms_per_sample"]
    print(f"{'peer':<32}{'samples/s':>10}{'vs DataLoader':>15}{'CPU ms/sample':>15}{'vs DataLoader':>15}  "
          f"{'pools':<34}stage shares")
    for name, result in results.items():
        shares = result["shares"]
        text = ", ".join(f"{k} {v:.0%}" for k, v in shares.items()) if shares else "-"
        print(f"{name:<32}{result['samples_per_s']:>10.0f}{result['samples_per_s'] / loader:>14.2f}x"
              f"{result['cpu_ms_per_sample']:>15.2f}{loader_cpu / result['cpu_ms_per_sample']:>14.2f}x  "
              f"{result['pools']:<34}{text}")
    print("(CPU ms/sample: user+system time of every process of the peer, so it does not depend on what else "
          "the machine runs; 'vs' = how many times less CPU than the DataLoader)")
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
