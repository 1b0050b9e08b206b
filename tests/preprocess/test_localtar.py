"""The fast local tar reader: the same members as the checked reader for plain tars, and a
fall-back (None) for every tar the checked reader would refuse or treat specially."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from seedance_tasks.errors import InputError, RefusedError
from seedance_tasks.preprocess.localtar import is_plain, iter_local_members
from seedance_tasks.preprocess.pipeline import Pipeline, Processed
from seedance_tasks.shards.build import build
from seedance_tasks.shards.index import resolve_shards
from seedance_tasks.shards.sample import make_sample_files
from seedance_tasks.shards.settings import ShardSettings
from seedance_tasks.shards.tario import iter_members


def checked(path: Path) -> list[tuple[str, bytes]]:
    with open(path, "rb") as stream:
        return list(iter_members(stream, str(path)))


def write_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]], *, fmt=tarfile.USTAR_FORMAT) -> Path:
    with tarfile.open(path, "w", format=fmt) as archive:
        for info, data in members:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def test_built_shards_read_the_same_as_the_checked_reader(tmp_path):
    make_sample_files(tmp_path / "src", 12, png=(3,))
    build(str(tmp_path / "src"), str(tmp_path / "shards"), settings=ShardSettings(max_samples=5))
    tars = sorted((tmp_path / "shards").glob("*.tar"))
    assert len(tars) == 3
    total = 0
    for tar in tars:
        fast = iter_local_members(str(tar))
        assert fast is not None and is_plain(str(tar))
        members = list(fast)
        assert members == checked(tar)
        total += len(members)
    indexed = sum(shard.nsamples for shard in resolve_shards(str(tmp_path / "shards")).shards)
    assert indexed >= 10 and total == 3 * indexed  # image, cls, json of every sample the index counts


def test_python_tarfile_ustar_with_dot_slash_names_and_long_prefix(tmp_path):
    long_dir = "d" * 120  # > 100 characters: ustar puts it in the prefix field
    members = [(tarfile.TarInfo("./a.jpg"), b"x" * 1000), (tarfile.TarInfo(f"{long_dir}/b.cls"), b"7"),
               (tarfile.TarInfo("c.txt"), b"")]
    tar = write_tar(tmp_path / "plain.tar", members)
    fast = iter_local_members(str(tar))
    assert fast is not None
    assert list(fast) == checked(tar) == [("a.jpg", b"x" * 1000), (f"{long_dir}/b.cls", b"7"), ("c.txt", b"")]


def _symlink() -> tarfile.TarInfo:
    info = tarfile.TarInfo("zz.jpg")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return info


def _directory() -> tarfile.TarInfo:
    info = tarfile.TarInfo("dir")
    info.type = tarfile.DIRTYPE
    return info


@pytest.mark.parametrize("case", ["symlink", "dotdot", "absolute", "directory", "gnu", "pax", "truncated",
                                  "no-end-marker", "bad-checksum"])
def test_anything_but_a_plain_tar_falls_back_to_the_checked_reader(tmp_path, case):
    good = [(tarfile.TarInfo("k1.jpg"), b"j" * 700), (tarfile.TarInfo("k1.cls"), b"1")]
    extra = {"symlink": [(_symlink(), b"")], "dotdot": [(tarfile.TarInfo("../x.jpg"), b"x")],
             "absolute": [(tarfile.TarInfo("/x.jpg"), b"x")], "directory": [(_directory(), b"")]}.get(case, [])
    fmt = {"gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}.get(case, tarfile.USTAR_FORMAT)
    if case == "pax":
        good[0][0].pax_headers = {"comment": "needs a PAX header"}
    tar = write_tar(tmp_path / f"{case}.tar", good + extra, fmt=fmt)
    data = bytearray(tar.read_bytes())
    if case == "truncated":
        data = data[:1000]  # inside k1.jpg's data
    elif case == "no-end-marker":
        data = data[: 512 + 1024 + 512 + 512]  # both members, then nothing
    elif case == "bad-checksum":
        data[0] ^= 0x01  # k1.jpg -> j1.jpg with the old checksum
    tar.write_bytes(bytes(data))
    assert iter_local_members(str(tar)) is None and not is_plain(str(tar))
    if case in ("symlink", "dotdot", "absolute"):
        with pytest.raises(RefusedError):
            checked(tar)
    elif case in ("truncated", "no-end-marker", "bad-checksum"):
        with pytest.raises(InputError):
            checked(tar)
    else:  # a directory, GNU or PAX headers: read by the checked reader, the same samples
        assert [name for name, _ in checked(tar)] == ["k1.jpg", "k1.cls"]


def test_the_pipeline_still_refuses_a_hostile_local_shard(tmp_path):
    good = [(tarfile.TarInfo("k1.jpg"), b"j" * 700), (tarfile.TarInfo("k1.cls"), b"1")]
    write_tar(tmp_path / "shard-000000.tar", [*good, (_symlink(), b"")])
    shards = resolve_shards(str(tmp_path / "shard-000000.tar")).shards
    with pytest.raises(RefusedError, match="symbolic link"):
        list(Pipeline(shards, size=16, io_workers=1, cpu_workers=1, batch_size=2))
    write_tar(tmp_path / "shard-000001.tar", good)  # the same samples without the link: read, not refused
    items = list(Pipeline(resolve_shards(str(tmp_path / "shard-000001.tar")).shards, size=16, io_workers=1,
                          cpu_workers=1))
    processed = [item for item in items if isinstance(item, Processed)]
    assert [(item.key, item.error is not None, item.members) for item in processed] == [("k1", True, {"cls": b"1"})]
