"""Preprocessing throughput, like for like: seedance's I/O-pool/CPU-pool pipeline against
`torch.utils.data.DataLoader(num_workers=2)` over `webdataset.WebDataset`, both doing the SAME
decode and writing the SAME bytes.

The work, for every peer: read the samples from WebDataset tar shards on local disk, decode the
JPEG, resize the short side to 224 and center-crop (bilinear), convert to a uint8 array (3, 224,
224), write it as KEY.npy (plus KEY.cls) into output tar shards with their sha256. The
DataLoader's per-sample function is the plain Pillow transform (`to_chw(..., fast=False)`:
`Image.open`, `Image.resize(BILINEAR, box=...)`, `np.asarray(...).transpose`); seedance runs the
same decode and its fast resize (`seedance_tasks.preprocess.fastresize`: Pillow's own fixed-point
bilinear arithmetic in C, with AVX2, written straight to CHW). The bytes are the same: the bench
digests every output member of both and fails if they differ.

Rows:
- headline: seedance vs the DataLoader, both decoding every JPEG in full;
- reduced-size decode (libjpeg DCT scaling through PIL's `draft`), its own rows: seedance and the
  DataLoader both with it, and its quality cost, the PSNR of its outputs against the full
  decode's (mean and min over every sample);
- the transform alone in one process, on images already in memory, Pillow's and seedance's: the
  CPU a sample costs without any pipeline. CPU-bound on the same cores, a pipeline running
  Pillow's transform cannot beat the DataLoader by more than the DataLoader's CPU per sample over
  Pillow's transform alone (the "ceiling" line); the rest of seedance's lead is its resize.

Every peer runs in a fresh process (`bench/_peers.py`): seconds are its timed section, CPU is
user+system of its whole process tree (worker processes included, reaped or not), memory is its
own VmHWM and the peak summed RSS of its process tree (`run_tree`). Rounds run in turns. After
each peer's first round the parent reads its output shards and digests every member (sha256 per
`KEY.ext`); peers doing the same decode must have identical digests, or the bench fails.

Data: photo-like 640x480 JPEGs (quality 85), generated once under bench/_work/preprocess/ (a few
hundred distinct images repeated under distinct keys), packed by `seedance shards build`.

    .venv/bin/python bench/preprocess.py            # 10,000 samples, 32 MiB shards, 3 rounds
    .venv/bin/python bench/preprocess.py --quick    # 1,000 samples, 8 MiB shards, 2 rounds
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
WORK = REPO / "bench" / "_work" / "preprocess"
SIZE = 224

import _peers  # noqa: E402

FULL, REDUCED = "full", "reduced"
PEERS = {  # name -> (runner, decode)
    "seedance, full decode": ("seedance", FULL),
    "DataLoader(2) + WebDataset, full decode": ("dataloader", FULL),
    "seedance, reduced decode (draft)": ("seedance", REDUCED),
    "DataLoader(2), reduced decode (draft)": ("dataloader", REDUCED),
}
TRANSFORM = "transform alone (1 process, in memory)"
TRANSFORM_IMAGES = 1000
HEADLINE = ("seedance, full decode", "DataLoader(2) + WebDataset, full decode")
SAME_DECODE_PEER = {"seedance, full decode": "DataLoader(2) + WebDataset, full decode",
                    "seedance, reduced decode (draft)": "DataLoader(2), reduced decode (draft)"}


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




# --------------------------------------------------------------------------- peers (child side)
def tree_cpu_seconds() -> float:
    """User+system seconds of this process and every descendant, reaped ones included."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            t = process.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def run_seedance(shards: Path, out: Path, draft: bool) -> dict:
    from seedance_tasks.preprocess.run import run
    from seedance_tasks.preprocess.settings import PreprocessSettings

    result = run(str(shards), str(out), settings=PreprocessSettings(size=SIZE, draft=draft))
    return {"samples": result["samples_out"], "shares": result["stage_shares"],
            "pools": (f"{result['cpu_workers']} process(es), whole shards each" if result["parallel"] == "shards"
                      else f"{result['io_workers']} I/O thread(s) + {result['cpu_workers']} process(es)"),
            "cpu_parts": result["cpu_seconds"], "stage_seconds": result["stage_seconds"]}


class _Transform:
    """The DataLoader peer's per-sample work (picklable for its worker processes): the plain
    Pillow transform (`to_chw` with `fast=False`), the same decode and output bytes as seedance's."""

    def __init__(self, draft: bool):
        self.draft = draft

    def __call__(self, sample: dict) -> tuple:
        from seedance_tasks.preprocess.transform import to_chw

        return sample["__key__"], to_chw(sample["jpg"], SIZE, draft=self.draft, fast=False), int(sample["cls"])


def run_dataloader(shards: Path, out: Path, draft: bool) -> dict:
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
    del loader  # joins (and reaps) the worker processes, so their CPU time is counted
    return {"samples": writer.count, "shares": None, "pools": "2 worker processes"}


def run_transform_only(shards: Path, count: int) -> dict:
    """`to_chw` alone, one process, on the first `count` images already in memory: CPU per sample."""
    from seedance_tasks.preprocess.transform import to_chw
    from seedance_tasks.shards.index import resolve_shards
    from seedance_tasks.shards.tario import iter_members, iter_samples

    images = []
    for shard in resolve_shards(str(shards)).shards:
        with open(shard.location.path, "rb") as stream:
            for sample in iter_samples(iter_members(stream, shard.uri), shard.uri):
                images.append(sample.members["jpg"])
                if len(images) >= count:
                    break
        if len(images) >= count:
            break
    result: dict = {"images": len(images)}
    for decode in (FULL, REDUCED):
        for fast, which in ((False, "pillow"), (True, "seedance")):
            timings = [0.0, 0.0, 0.0]
            started = time.process_time()
            for data in images:
                to_chw(data, SIZE, draft=decode == REDUCED, timings=timings, fast=fast)
            result[f"cpu_ms_{decode}_{which}"] = 1000 * (time.process_time() - started) / len(images)
            result[f"stages_ms_{decode}_{which}"] = [round(1000 * t / len(images), 2) for t in timings]
    return result


def child(args) -> int:
    """One peer, in this fresh process; prints its result through `_peers.report`."""
    import torch  # noqa: F401 - every peer's libraries are imported before timing, alike
    import webdataset  # noqa: F401

    import seedance_tasks.preprocess.run  # noqa: F401
    import seedance_tasks.preprocess.transform  # noqa: F401
    import seedance_tasks.shards.index  # noqa: F401

    shards, out = Path(args.shards), Path(args.out)
    if args.peer == TRANSFORM:
        started = time.perf_counter()
        result = run_transform_only(shards, args.samples)
        _peers.report(seconds=time.perf_counter() - started, **result)
        return 0
    runner, decode = PEERS[args.peer]
    cpu_started = tree_cpu_seconds()
    started = time.perf_counter()
    if runner == "seedance":
        result = run_seedance(shards, out, draft=decode == REDUCED)
    else:
        result = run_dataloader(shards, out, draft=decode == REDUCED)
    seconds = time.perf_counter() - started
    result["cpu"] = tree_cpu_seconds() - cpu_started
    _peers.report(seconds=seconds, **result)
    return 0


# --------------------------------------------------------------------------- checks (parent side)
def digest_output(directory: Path) -> tuple[str, int]:
    """sha256 over every output member (`KEY.ext` -> sha256 of its bytes, sorted by name), and the sample count."""
    from seedance_tasks.shards.tario import iter_members

    members: dict[str, bytes] = {}
    for tar in sorted(directory.glob("*.tar")):
        with open(tar, "rb") as stream:
            for name, data in iter_members(stream, str(tar)):
                if name in members:
                    raise SystemExit(f"error: {tar}: member {name} written twice")
                members[name] = hashlib.sha256(data).digest()
    total = hashlib.sha256()
    for name in sorted(members):
        total.update(name.encode() + b"\0" + members[name])
    return total.hexdigest(), sum(1 for name in members if name.endswith(".npy"))


def psnr(full_dir: Path, reduced_dir: Path) -> dict:
    """PSNR (dB) of every reduced-decode output against the full-decode output of the same key.

    Both directories are seedance outputs: the same shard names, samples in the same order."""
    import numpy as np

    from seedance_tasks.preprocess.transform import npy_header
    from seedance_tasks.shards.tario import iter_members

    skip = len(npy_header(SIZE))
    values = []
    for tar in sorted(full_dir.glob("*.tar")):
        other = reduced_dir / tar.name
        with open(tar, "rb") as a_stream, open(other, "rb") as b_stream:
            for (name, a), (other_name, b) in zip(iter_members(a_stream, str(tar)), iter_members(b_stream, str(other)),
                                                  strict=True):
                if name != other_name:
                    raise SystemExit(f"error: {tar.name}: {name} against {other_name}")
                if not name.endswith(".npy"):
                    continue
                diff = np.frombuffer(a, np.uint8, offset=skip).astype(np.int16) - np.frombuffer(b, np.uint8, offset=skip)
                mse = float(np.mean(diff.astype(np.float32) ** 2))
                values.append(math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse))
    return {"mean": statistics.fmean(values), "min": min(values), "samples": len(values)}


# --------------------------------------------------------------------------- parent
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 samples, 8 MiB shards, 2 rounds")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--shard-size-mib", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="runs per peer, in turns (default 3; --quick 2)")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--peer", help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--shards", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        return child(args)
    samples = args.samples or (1000 if args.quick else 10_000)
    shard_mib = args.shard_size_mib or (8 if args.quick else 32)
    count = args.rounds or (2 if args.quick else 3)
    bench_started = time.perf_counter()
    shards = make_shards(samples, shard_mib)
    for tar in shards.glob("*.tar"):  # warm the page cache for every peer alike
        tar.read_bytes()
    kept = {"seedance, full decode": WORK / "kept-full", "seedance, reduced decode (draft)": WORK / "kept-reduced"}
    for directory in kept.values():
        shutil.rmtree(directory, ignore_errors=True)
    digests: dict[str, str] = {}
    log = WORK / "peer.log"

    def run_one(name: str) -> dict:
        if name == TRANSFORM:
            return _peers.measure([__file__, "--peer", name, "--shards", shards, "--out", WORK / "none",
                                   "--samples", min(samples, TRANSFORM_IMAGES)])
        out = WORK / "out"
        shutil.rmtree(out, ignore_errors=True)
        with open(log, "w") as stdout:
            _tree_s, tree_mb = _peers.run_tree(
                [sys.executable, __file__, "--peer", name, "--shards", str(shards), "--out", str(out),
                 "--samples", str(samples)], stdout=stdout, stderr=stdout)
        lines = [line for line in log.read_text().splitlines() if line.startswith(_peers.REPORT_PREFIX)]
        if not lines:
            raise SystemExit(f"error: peer {name} reported nothing:\n{log.read_text()[-3000:]}")
        result = json.loads(lines[-1][len(_peers.REPORT_PREFIX):])
        result["tree_mb"] = tree_mb
        if result["samples"] != samples:
            raise SystemExit(f"error: {name} wrote {result['samples']} of {samples} samples")
        if name not in digests:  # first round of this peer: check every output byte
            digests[name], written = digest_output(out)
            if written != samples:
                raise SystemExit(f"error: {name}: {written} .npy members in its output, not {samples}")
            if name in kept:
                out.rename(kept[name])
        shutil.rmtree(out, ignore_errors=True)
        return result

    def progress(name: str, index: int, result: dict) -> None:
        if name == TRANSFORM:
            print(f"  round {index + 1}, {name}: Pillow's {result['cpu_ms_full_pillow']:.2f} CPU ms/sample full "
                  f"decode, {result['cpu_ms_reduced_pillow']:.2f} reduced; seedance's "
                  f"{result['cpu_ms_full_seedance']:.2f} and {result['cpu_ms_reduced_seedance']:.2f}",
                  file=sys.stderr, flush=True)
            return
        print(f"  round {index + 1}, {name}: {samples / result['seconds']:.0f} samples/s, "
              f"{1000 * result['cpu'] / samples:.2f} CPU ms/sample", file=sys.stderr, flush=True)

    runs = _peers.rounds([*PEERS, TRANSFORM], run_one, count=count, on_result=progress)
    transform = runs.pop(TRANSFORM)
    for ours, theirs in SAME_DECODE_PEER.items():
        if digests[ours] != digests[theirs]:
            print(f"error: {ours} and {theirs} wrote different bytes ({digests[ours][:16]} vs {digests[theirs][:16]})",
                  file=sys.stderr)
            return 1
    quality = psnr(*kept.values())
    for directory in kept.values():
        shutil.rmtree(directory, ignore_errors=True)

    for attempts in runs.values():
        for r in attempts:
            r["samples_per_s"] = samples / r["seconds"]
            r["cpu_ms"] = 1000 * r["cpu"] / samples
    print(f"\npreprocessing: {samples:,} 640x480 JPEGs -> uint8 (3, {SIZE}, {SIZE}) .npy shards, "
          f"{len(list(shards.glob('*.tar')))} input shards, {os.cpu_count()} CPU(s), {count} round(s) in turns, "
          f"load average {os.getloadavg()[0]:.1f}, bench {time.perf_counter() - bench_started:.0f} s")
    print(f"{'peer':<41}{'samples/s':>18}{'vs DL(2) same decode':>22}{'CPU ms/sample':>20}"
          f"{'less CPU than DL(2)':>21}{'peak RSS MB own/tree':>22}  {'outputs (sha256)':<18}pools")
    for name, attempts in runs.items():
        peer = SAME_DECODE_PEER.get(name)
        versus = _peers.ratio_spread(attempts, runs[peer]) if peer else "1.00×"
        cpu_versus = _peers.ratio_spread(attempts, runs[peer], "cpu_ms") if peer else "1.00×"
        rss = f"{_peers.median(attempts, 'peak_rss_mb'):.0f}/{_peers.median(attempts, 'tree_mb'):.0f}"
        print(f"{name:<41}{_peers.spread(attempts, 'samples_per_s', '{:.0f}'):>18}{versus:>22}"
              f"{_peers.spread(attempts, 'cpu_ms'):>20}{cpu_versus:>21}{rss:>22}  {digests[name][:16]:<18}"
              f"{attempts[0]['pools']}")
    ours, theirs = runs[HEADLINE[0]], runs[HEADLINE[1]]
    print(f"headline (full decode both): seedance {_peers.ratio_spread(ours, theirs)} DataLoader(2)'s samples/s; "
          f"CPU per sample {_peers.ratio_spread(ours, theirs, 'cpu_ms')} less")
    reduced = runs["seedance, reduced decode (draft)"]
    print(f"reduced decode: seedance {_peers.ratio_spread(reduced, theirs)} the full-decode DataLoader(2); "
          f"PSNR vs full decode mean {quality['mean']:.2f} dB, min {quality['min']:.2f} dB "
          f"over {quality['samples']:,} samples")
    for decode, loader_name in ((FULL, HEADLINE[1]), (REDUCED, "DataLoader(2), reduced decode (draft)")):
        pillow, ours_alone = f"cpu_ms_{decode}_pillow", f"cpu_ms_{decode}_seedance"
        ceilings = [loader["cpu_ms"] / alone[pillow] for loader, alone in zip(runs[loader_name], transform, strict=True)]
        print(f"transform alone, {decode} decode ({transform[0]['images']} images in memory, 1 process): Pillow's "
              f"{_peers.spread(transform, pillow)} CPU ms/sample (decode/resize/convert "
              f"{transform[0][f'stages_ms_{decode}_pillow']} ms wall), seedance's {_peers.spread(transform, ours_alone)}"
              f" ({transform[0][f'stages_ms_{decode}_seedance']}); ceiling over Pillow's transform = DL(2)'s CPU "
              f"ms/sample / Pillow's = {statistics.median(ceilings):.2f}x ({min(ceilings):.2f}-{max(ceilings):.2f}): "
              "the most a pipeline with zero overhead could gain on CPU-bound cores without a faster transform")
    for name in ("seedance, full decode", "seedance, reduced decode (draft)"):
        shares = runs[name][0]["shares"]
        print(f"{name} stage shares: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    print("outputs: every member of each peer's first-round output digested; same decode => identical "
          "sha256 (checked). CPU: user+system of the peer's whole process tree.")
    if args.json:
        print(json.dumps({"runs": runs, "transform": transform, "psnr": quality, "digests": digests}, indent=2,
                         default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
