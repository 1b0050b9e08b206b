"""Checkpoint compression: seedance `auto` vs zipnn, zstd-3 and lz4 on a sequence of real checkpoints.

A GPT-style LM is trained with AdamW (fp32) on CPU and checkpointed every `--every` steps after a
warm-up (trained once, cached in bench/_work/checkpoint/); each checkpoint is model + optimizer
state (about 3x the weights). Every peer runs in its own fresh process (`bench/_peers.py`: its
own peak RSS, rounds in turns, each round starting one peer later) on the same sequence:

- seedance: `checkpoint.save` of each checkpoint in a training loop (delta against a base where
  it pays, byte-grouped zstd otherwise, keyframe every 8, codec choices reused between saves)
  into a local store, then `checkpoint.load` of each (the verified restore: reading the store,
  decoding, applying the delta chain, the BLAKE3 digest of every chunk checked), compared
  bit-exact outside the timing; then the restore of the deepest delta against its keyframe's
  (best of 2, in turns), and `save_async` (the loop's wait per call, median over every call,
  calls 1.2x a save apart);
- zipnn (PyPI; float32 byte grouping + Huffman/zstd, 2 threads), zstd-3 (2 threads) and lz4
  (frame, 1 thread): compress and decompress each checkpoint's tensor bytes as one blob in
  memory, checked bit-exact outside the timing;
- digests: sha256 and BLAKE3 over the same bytes, 4 MiB chunks on 2 threads (the floor under a
  verified restore);
- floor: on ONE thread, in CPU time (so a busy machine moves it little), zipnn's decompress of
  each checkpoint against seedance's verified restore of each, and the memory-bound steps every
  verified restore of a byte-grouped checkpoint must do whatever its entropy coder (touch the
  output's pages, merge the byte planes, BLAKE3): what the restore goal leaves for decoding.

    .venv/bin/python bench/checkpoint.py            # ~14M-parameter model, 8 checkpoints, 3 rounds
    .venv/bin/python bench/checkpoint.py --quick    # small model, 2 rounds, smoke test
    .venv/bin/python bench/checkpoint.py --limit 4 --rounds 2   # the first 4 checkpoints only
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import _peers  # noqa: E402

WORK = REPO / "bench" / "_work" / "checkpoint"
THREADS = 2  # every peer: the cores of the machine this bench was tuned on, set explicitly
PEERS = ("seedance", "zipnn", "zstd-3", "lz4", "digests", "floor")

SIZES = {  # name: (width, layers, vocab, seq, batch)
    "quick": (128, 2, 1024, 32, 8),
    "full": (384, 4, 8192, 64, 8),
}


def sequence(size: str, count: int, every: int, warmup: int) -> list[Path]:
    """The cached checkpoint files of a training run (trained once, then reused)."""
    import torch

    from seedance_tasks.checkpoint.sample import train_tiny_gpt

    width, layers, vocab, seq, batch = SIZES[size]
    folder = WORK / f"ckpts-{size}-{count}x{every}-w{warmup}"
    steps = [warmup + i * every for i in range(count)]
    paths = [folder / f"step-{step:06d}.pt" for step in steps]
    if all(path.exists() for path in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    print(f"training a {size} GPT (width {width}, {layers} layers, vocab {vocab}) to step {steps[-1]} ...",
          flush=True)
    started = time.perf_counter()
    for (_step, state), path in zip(
        train_tiny_gpt(steps, width=width, layers=layers, vocab=vocab, seq=seq, batch=batch, lr=6e-4),
        paths, strict=True,
    ):
        torch.save(state, path)
    print(f"  trained in {time.perf_counter() - started:.0f} s", flush=True)
    return paths


def tensor_blob(state) -> bytes:
    from seedance_tasks.checkpoint.store import _raw_bytes
    from seedance_tasks.checkpoint.tree import flatten

    return b"".join(_raw_bytes(tensor).tobytes() for _, tensor in flatten(state)[1])


def _load_states(folder: Path):
    import torch

    torch.set_num_threads(THREADS)
    paths = sorted(folder.glob("step-*.pt"))[: int(os.environ.get("BENCH_CKPT_LIMIT") or 10**9)]
    return [(int(p.stem.split("-")[1]), torch.load(p, weights_only=True)) for p in paths]


# --------------------------------------------------------------------------- peers (each in its own process)


def peer_seedance(folder: Path, store: Path) -> dict:
    import logging

    from seedance_tasks import checkpoint
    from seedance_tasks.checkpoint import store as ckstore

    logging.getLogger("seedance_tasks.checkpoint.store").setLevel(logging.ERROR)
    checkpoint._settings()  # imports and the parsed config, outside the timing (the peers import theirs too)
    states = _load_states(folder)
    blobs = {step: tensor_blob(state) for step, state in states}
    options = {"workers": THREADS}
    shutil.rmtree(store, ignore_errors=True)
    saves, summaries = [], []
    for step, state in states:
        gc.collect()
        start = time.perf_counter()
        summaries.append(checkpoint.save(state, str(store), "bench", step, **options))
        saves.append(time.perf_counter() - start)
    ckstore._CACHE.clear()
    restores = []
    for step, _state in states:
        gc.collect()
        start = time.perf_counter()
        back = checkpoint.load(str(store), "bench", step)
        restores.append(time.perf_counter() - start)
        if tensor_blob(back) != blobs[step]:
            raise SystemExit(f"seedance: step {step} is not bit-exact")
        del back
    depths = {s["step"]: s["depth"] for s in summaries}
    key = states[0][0]
    deepest = max(depths, key=lambda s: (depths[s], -s))
    turns: dict[int, list[float]] = {key: [], deepest: []}
    for _ in range(2):
        for step in (key, deepest):
            gc.collect()
            start = time.perf_counter()
            checkpoint.load(str(store), "bench", step)
            turns[step].append(time.perf_counter() - start)
    # save_async, spaced as a loop that saves less often than a save takes (1.2x the median save
    # apart); back to back, each call would only queue behind the running save
    stalls: dict[str, list[float]] = {"spaced": []}
    gap = 1.2 * statistics.median(saves)
    for mode in stalls:
        async_store = store.with_name(store.name + f"-async-{mode}")
        shutil.rmtree(async_store, ignore_errors=True)
        ckstore._CACHE.clear()
        for step, state in states:
            start = time.perf_counter()
            checkpoint.save_async(state, str(async_store), "bench", step, **options)
            stalls[mode].append(time.perf_counter() - start)
            if mode == "spaced":
                time.sleep(gap)
        checkpoint.wait_for_saves()
        shutil.rmtree(async_store, ignore_errors=True)
    raw = sum(s["raw_bytes"] for s in summaries)
    stored = sum(s["stored_bytes"] for s in summaries)
    shutil.rmtree(store, ignore_errors=True)
    return {"compress_s": sum(saves), "restore_s": sum(restores), "raw": raw, "stored": stored,
            "ratio": raw / stored, "first": summaries[0]["raw_bytes"] / summaries[0]["stored_bytes"],
            "kinds": "".join("K" if s["kind"] == "full" else "d" for s in summaries),
            "save_median_s": statistics.median(saves), "stall_spaced_median_s": statistics.median(stalls["spaced"]),
            "key_s": min(turns[key]), "deep_s": min(turns[deepest]), "depth": depths[deepest],
            "sampled": sum(s["codecs_sampled"] for s in summaries), "reused": sum(s["codecs_reused"] for s in summaries)}


def peer_blobs(name: str, folder: Path) -> dict:
    states = _load_states(folder)
    if name == "zipnn":
        import zipnn

        codec = zipnn.ZipNN(input_format="byte", bytearray_dtype="float32", threads=THREADS)

        def compress(data):
            return codec.compress(data)

        def decompress(packed, _size):
            return codec.decompress(packed)
    elif name == "zstd-3":
        import zstandard

        zc, zd = zstandard.ZstdCompressor(level=3, threads=THREADS), zstandard.ZstdDecompressor()

        def compress(data):
            return zc.compress(data)

        def decompress(packed, size):
            return zd.decompress(packed, max_output_size=size)
    else:
        import lz4.frame

        def compress(data):
            return lz4.frame.compress(data)

        def decompress(packed, _size):
            return lz4.frame.decompress(packed)
    raw = stored = 0
    c_time = d_time = 0.0
    first = None
    for _step, state in states:
        blob = tensor_blob(state)
        given = bytearray(blob) if name == "zipnn" else blob  # zipnn works in place: a copy, outside the timing
        gc.collect()
        start = time.perf_counter()
        packed = compress(given)
        c_time += time.perf_counter() - start
        start = time.perf_counter()
        back = decompress(packed, len(blob))
        d_time += time.perf_counter() - start
        if bytes(back) != blob:
            raise SystemExit(f"{name} did not round-trip")
        raw += len(blob)
        stored += len(packed)
        first = first or len(blob) / len(packed)
        del back, packed, given
    return {"compress_s": c_time, "restore_s": d_time, "raw": raw, "stored": stored, "ratio": raw / stored,
            "first": first}


def peer_digests(folder: Path) -> dict:
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    import blake3

    blobs = [tensor_blob(state) for _, state in _load_states(folder)]
    total = sum(len(blob) for blob in blobs)
    pieces = [memoryview(blob)[i: i + 4 * 1024**2] for blob in blobs for i in range(0, len(blob), 4 * 1024**2)]
    found = {}
    with ThreadPoolExecutor(THREADS) as pool:
        for label, digest in (("sha256", lambda p: hashlib.sha256(p).digest()),
                              ("blake3", lambda p: blake3.blake3(p).digest())):
            start = time.perf_counter()
            list(pool.map(digest, pieces))
            found[f"{label}_mbs"] = total / (time.perf_counter() - start) / 1e6
    return {"compress_s": 0.0, "restore_s": 0.0, **found}


def _cpu_best(work, tries: int = 2) -> float:
    """The least process CPU seconds of `tries` runs of `work()`."""
    best = float("inf")
    for _ in range(tries):
        gc.collect()
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def peer_floor(folder: Path, store: Path) -> dict:
    import blake3
    import numpy as np
    import zipnn

    from seedance_tasks import checkpoint
    from seedance_tasks.checkpoint import codecs
    from seedance_tasks.checkpoint.store import load_state

    states = _load_states(folder)
    shutil.rmtree(store, ignore_errors=True)
    kinds = []
    for step, state in states:
        kinds.append(checkpoint.save(state, str(store), "bench", step, workers=1)["depth"])
    blobs = [tensor_blob(state) for _, state in states]
    del states
    codec = zipnn.ZipNN(input_format="byte", bytearray_dtype="float32", threads=1)
    packed = [codec.compress(bytearray(blob)) for blob in blobs]
    zipnn_s = sum(_cpu_best(lambda p=p: codec.decompress(p)) for p in packed)
    by_depth: dict[int, list[float]] = {}
    for (step, _), depth in zip(_load_states(folder), kinds, strict=True):
        by_depth.setdefault(depth, []).append(_cpu_best(lambda s=step: load_state(str(store), "bench", s, workers=1)))
    shutil.rmtree(store, ignore_errors=True)
    raw = np.frombuffer(blobs[0], dtype=np.uint8)
    chunk = 4 * 1024**2
    planes = [codecs.group(raw[i: i + chunk], 4) for i in range(0, raw.size, chunk)]

    def merge() -> None:
        out = np.empty(raw.size, dtype=np.uint8)
        for index, grouped in enumerate(planes):
            codecs.ungroup(grouped, 4, out[index * chunk: index * chunk + grouped.size])

    pages = _cpu_best(lambda: np.ones(raw.size, dtype=np.uint8))
    merged = _cpu_best(merge)  # pages included: subtracted below
    digest = _cpu_best(lambda: [blake3.blake3(raw[i: i + chunk]).digest() for i in range(0, raw.size, chunk)])
    count = len(blobs)
    return {"compress_s": 0.0, "restore_s": 0.0, "raw": sum(map(len, blobs)), "zipnn_cpu_s": zipnn_s / count,
            "restore_cpu_s": sum(map(sum, by_depth.values())) / count,
            "depth_cpu_s": {str(d): statistics.median(v) for d, v in sorted(by_depth.items())},
            "pages_cpu_s": pages, "merge_cpu_s": max(merged - pages, 0.0), "blake3_cpu_s": digest}


def run_peer(name: str, folder: Path, store: Path) -> None:
    started = time.perf_counter()
    if name == "seedance":
        result = peer_seedance(folder, store)
    elif name == "digests":
        result = peer_digests(folder)
    elif name == "floor":
        result = peer_floor(folder, store)
    else:
        result = peer_blobs(name, folder)
    _peers.report(time.perf_counter() - started, **result)


# --------------------------------------------------------------------------- parent


def _mbs(results: list[dict], key: str) -> str:
    for result in results:
        result[f"{key}_mbs"] = result["raw"] / result[key] / 1e6 if result[key] else float("nan")
    return _peers.spread(results, f"{key}_mbs", "{:,.0f}")


def _print_floor(runs: list[dict], raw_each: float) -> None:
    """The one-thread CPU budget of a restore: what zipnn spends, what seedance spends, what any
    verified restore of byte planes spends before decoding anything, and what the goal leaves."""
    def ms(key: str) -> str:
        return _peers.spread(runs, key, "{:.0f}") if not isinstance(runs[0][key], dict) else ""

    for run in runs:
        for key in ("zipnn_cpu_s", "restore_cpu_s", "pages_cpu_s", "merge_cpu_s", "blake3_cpu_s"):
            run[key.replace("_s", "_ms")] = run[key] * 1000
        run["memory_ms"] = run["pages_cpu_ms"] + run["merge_cpu_ms"] + run["blake3_cpu_ms"]
        run["budget_ms"] = run["zipnn_cpu_ms"] / 1.2 - run["memory_ms"]
        run["zipnn_decode_ms"] = run["zipnn_cpu_ms"] - run["pages_cpu_ms"] - run["merge_cpu_ms"]
        run["best_case"] = run["zipnn_cpu_ms"] / (run["memory_ms"] + run["zipnn_decode_ms"])
    depths = ", ".join(f"depth {d} {1000 * _peers.median([{'v': r['depth_cpu_s'][d]} for r in runs], 'v'):.0f}"
                       for d in runs[0]["depth_cpu_s"])
    print(f"\nrestore budget on ONE thread, CPU ms per checkpoint of {raw_each / 1e6:.1f} MB (mean over the "
          f"sequence, best of 2 each):")
    print(f"  zipnn decompress {ms('zipnn_cpu_ms')}; seedance verified restore {ms('restore_cpu_ms')} "
          f"({depths})")
    print(f"  steps every verified restore of byte planes does before any decoding: output pages "
          f"{ms('pages_cpu_ms')} + plane merge {ms('merge_cpu_ms')} + BLAKE3 {ms('blake3_cpu_ms')} = "
          f"{ms('memory_ms')}")
    print(f"  1.2x zipnn leaves {ms('budget_ms')} ms for reading and entropy-decoding every level of a "
          f"checkpoint's chain")
    print(f"  zipnn's own decoding (its time less pages and merge) is {ms('zipnn_decode_ms')}: with a decoder as fast "
          f"as zipnn's and one level only (a keyframe), a verified restore runs at best "
          f"{_peers.spread(runs, 'best_case', '{:.2f}')}x zipnn's speed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, 2 rounds, smoke test")
    parser.add_argument("--count", type=int, default=8, help="checkpoints in the sequence")
    parser.add_argument("--every", type=int, default=10, help="training steps between checkpoints")
    parser.add_argument("--warmup", type=int, default=30, help="training steps before the first checkpoint")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every peer in turns (default 3, quick 2)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N checkpoints of the sequence")
    parser.add_argument("--skip", action="append", default=[],
                        help="skip a peer (zipnn, zstd-3, lz4, digests, floor)")
    parser.add_argument("--run-peer", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_peer:
        run_peer(args.run_peer, Path(args.folder), WORK / f"store-{args.run_peer}")
        return 0
    size = "quick" if args.quick else "full"
    rounds = args.rounds or (2 if args.quick else 3)
    paths = sequence(size, args.count, args.every, args.warmup)
    folder = paths[0].parent
    names = [name for name in PEERS if name not in args.skip]
    if args.limit:
        paths = paths[: args.limit]
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "BENCH_CKPT_LIMIT": str(len(paths))}

    def run_one(name: str) -> dict:
        return _peers.measure([__file__, "--run-peer", name, "--folder", str(folder)], env=env, timeout=1800)

    def note(name: str, index: int, result: dict) -> None:
        print(f"  round {index + 1}: {name:<9} {result['seconds']:6.1f} s in its process, "
              f"peak RSS {result['peak_rss_mb']:,.0f} MB", flush=True)

    print(f"{len(paths)} checkpoints (fp32 weights + AdamW state), {args.every} steps apart, after "
          f"{args.warmup} warm-up steps; {rounds} rounds of {', '.join(names)} in turns, each in a fresh process; "
          f"{THREADS} threads each", flush=True)
    results = _peers.rounds(names, run_one, rounds, note)
    raw_each = next(runs[0]["raw"] for runs in results.values() if "raw" in runs[0]) / len(paths)

    print(f"\n{len(paths)} checkpoints of {raw_each / 1e6:.1f} MB; median (min–max) over {rounds} rounds")
    header = (f"{'peer':<10} {'sequence':>9} {'1 ckpt':>8} {'compress MB/s':>22} {'restore MB/s':>24} "
              f"{'peak RSS MB':>12}")
    print(header)
    print("-" * len(header))
    for name in [n for n in names if n not in ("digests", "floor")]:
        runs = results[name]
        restore_label = " (verified)" if name == "seedance" else ""
        print(f"{name:<10} {_peers.median(runs, 'ratio'):>8.3f}x {_peers.median(runs, 'first'):>7.3f}x "
              f"{_mbs(runs, 'compress_s'):>22} {_mbs(runs, 'restore_s') + restore_label:>24} "
              f"{_peers.median(runs, 'peak_rss_mb'):>12,.0f}")
    if "seedance" in results:
        _print_seedance(results, paths, rounds)
    if "floor" in results:
        _print_floor(results["floor"], raw_each)
    if "digests" in results:
        digests = results["digests"]
        print(f"digests on the same bytes, 4 MiB chunks on {THREADS} threads: sha256 "
              f"{_peers.spread(digests, 'sha256_mbs', '{:,.0f}')} MB/s (format 1), BLAKE3 "
              f"{_peers.spread(digests, 'blake3_mbs', '{:,.0f}')} MB/s (format 2)")
    print(f"\nload average (1 min) before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
          f"cores; whole bench {time.perf_counter() - started:.0f} s")
    return 0


def _print_seedance(results: dict, paths: list, rounds: int) -> None:
    ours = results["seedance"]
    print("\nseedance: compress = checkpoint.save into a local store (files written, manifest committed); restore = "
          "checkpoint.load (read, decode, delta chain, BLAKE3 of every chunk). Peers: one blob each, in memory.")
    print(f"seedance kinds {ours[0]['kinds']} (K keyframe, d delta); codec choices sampled {ours[0]['sampled']}, "
          f"reused {ours[0]['reused']} (tensor-saves)")
    if "zipnn" in results:
        zipnn = results["zipnn"]
        print("\nagainst zipnn, per round (rounds paired):")
        print(f"  verified restore vs zipnn decompress: {_peers.ratio_spread(ours, zipnn, 'restore_s')} faster "
              "(goal >= 1.2x)")
        print(f"  compress vs zipnn compress:           {_peers.ratio_spread(ours, zipnn, 'compress_s')} faster "
              "(goal >= 1.5x)")
        print(f"  sequence ratio:          {_peers.median(ours, 'ratio'):.3f}x vs {_peers.median(zipnn, 'ratio'):.3f}x "
              f"= {_peers.median(ours, 'ratio') / _peers.median(zipnn, 'ratio'):.3f}x smaller (must stay > 1)")
        print(f"  single-checkpoint ratio: {_peers.median(ours, 'first'):.3f}x vs {_peers.median(zipnn, 'first'):.3f}x "
              f"= {_peers.median(ours, 'first') / _peers.median(zipnn, 'first'):.3f}x smaller (must stay > 1)")
    print(f"\nsave_async: the loop waits {_peers.spread(ours, 'stall_spaced_median_s', '{:.3f}')} s a call (median over "
          f"all {len(paths)} calls, calls 1.2x a save apart) where save() takes "
          f"{_peers.spread(ours, 'save_median_s', '{:.3f}')} s (median)")
    print(f"restore of the deepest delta (depth {ours[0]['depth']}): {_peers.spread(ours, 'deep_s', '{:.3f}')} s vs "
          f"keyframe {_peers.spread(ours, 'key_s', '{:.3f}')} s (best of 2 in turns, each round)")


if __name__ == "__main__":
    sys.exit(main())
