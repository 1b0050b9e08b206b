"""Helpers the preprocess tests share."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from seedance_tasks.shards.tario import iter_members, iter_samples


def read_output(directory: Path) -> dict[str, dict[str, bytes]]:
    """Every sample of the output shards in `directory`, by key (each key must come out once)."""
    samples: dict[str, dict[str, bytes]] = {}
    for tar in sorted(directory.glob("*.tar")):
        with open(tar, "rb") as stream:
            for sample in iter_samples(iter_members(stream, str(tar)), str(tar)):
                assert sample.key not in samples, f"{sample.key} written twice"
                samples[sample.key] = sample.members
    return samples


def write_shard(path: Path, members: list[tuple[str, bytes]]) -> None:
    """A plain ustar shard at `path` (its folder made) holding `members` ([(name, bytes)]) in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


CRASHING = """
import os

import seedance_tasks.preprocess.transform as transform

decode = transform.to_chw


def to_chw(data, *args, **kwargs):  # stands in for a decoder crash or the OOM killer, in the worker
    if data == b"KILLS ITS WORKER":
        os._exit(9)
    return decode(data, *args, **kwargs)


transform.to_chw = to_chw  # the pool's workers import this script, so they run it too

if __name__ == "__main__":
    import json, sys
    from seedance_tasks.preprocess.run import run
    from seedance_tasks.preprocess.settings import PreprocessSettings

    result = run(sys.argv[1], sys.argv[2], settings=PreprocessSettings(**json.loads(sys.argv[3])))
    print(json.dumps({"out": result["samples_out"], "failed": result["failed"], "parallel": result["parallel"],
                      "shards": result["shards"]}))
"""


def run_crashing(tmp_path: Path, shards: Path, out: Path, **settings) -> dict:
    """`seedance preprocess run` of `shards` into `out` (with `settings`) in a process whose decoder
    kills its worker on an image of the bytes `KILLS ITS WORKER`; returns its summary's figures."""
    import json
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    script = tmp_path / "crashing.py"
    script.write_text(CRASHING)
    done = subprocess.run([sys.executable, str(script), str(shards), str(out), json.dumps(settings)], cwd=repo,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
