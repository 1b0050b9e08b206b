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
