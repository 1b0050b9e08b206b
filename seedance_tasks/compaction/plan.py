"""Plan a compaction: list the dataset once, group files by partition, choose what to rewrite.

A partition (the directory holding the files, e.g. `date=2026-11-01/`) is compacted when it
has at least two small Parquet files old enough to be finished and rewriting them would leave
fewer files; everything else stays put, so a compacted lake is left alone by the next run.
Hidden files (`_`/`.` prefix) are not data.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs

from seedance_tasks import storage
from seedance_tasks.errors import IntegrityError, MetadataError, RefusedError, SeedanceError
from seedance_tasks.storage import Location

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
SYMLINK_REASON = "symlink: not followed"
UNDECODABLE_REASON = "file name is not UTF-8 (shown with \\xNN escapes): not read, left as it is; rename it to compact it"

TABLE_FORMATS = {
    "_delta_log": ("a Delta Lake", "run Delta's own OPTIMIZE (and VACUUM) on this table"),
    ".hoodie": ("an Apache Hudi", "use Hudi's clustering / compaction service on this table"),
    "metadata": ("an Apache Iceberg", "run Iceberg's rewrite_data_files procedure on this table"),
}
_ICEBERG_METADATA = (".metadata.json", ".avro")


@dataclass
class SourceFile:
    path: str  # relative to the dataset root
    size: int
    mtime: str | None  # ISO time, UTC


@dataclass
class PartitionPlan:
    partition: str  # directory relative to the root; "" for files at the root
    files: list[SourceFile]

    @property
    def bytes(self) -> int:
        return sum(item.size for item in self.files)


@dataclass
class CompactionPlan:
    run_id: str
    uri: str
    partitions: list[PartitionPlan] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # {"partition", "reason"}
    files_listed: int = 0

    def to_json(self) -> dict:
        """The plan as stored; read back (untrusted) by `validated`."""
        return asdict(self)


PLAN_HINT = ("the plan file was edited or damaged; nothing was changed. Move it away and start a new DAG "
             "run: its plan task writes a fresh plan")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}$")


def _refuse(where: str, key: str, problem: str) -> MetadataError:
    return MetadataError(f"plan {where}: {key} {problem}; refused", hint=PLAN_HINT)


def _confined(value: Any, root: Location, where: str, key: str) -> str:
    try:
        return storage.confine(value, what=f"plan {where} {key}", root=root)
    except IntegrityError as exc:
        raise MetadataError(exc.message, hint=PLAN_HINT) from None


def _count(value: Any, where: str, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _refuse(where, key, f"must be a whole number >= 0, got {value!r:.80}")
    return value


def validated(data: Any, root: Location, where: str) -> CompactionPlan:
    """A plan read from storage (untrusted), checked key by key; MetadataError (not retried: the
    same plan fails the same way) naming `where` (the plan file) and the key otherwise.

    Guarantees: the plan is for `root` (its `uri`), its run id is a plain id, and every file it
    names is a visible Parquet file of its partition, below `root`, reached without passing
    through a symlink (local disk), and named once: compacting it can neither leave the lake nor
    read a file twice.
    """
    if not isinstance(data, dict):
        raise _refuse(where, "the file", "must hold an object")
    run_id = data.get("run_id")
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id) or ".." in run_id:
        raise _refuse(where, "run_id", f"{run_id!r:.80} is not a run id (letters, digits, . _ = -)")
    uri = data.get("uri")
    if not isinstance(uri, str) or normal_uri(uri) != root.uri.rstrip("/"):
        raise _refuse(where, "uri", f"{uri!r:.200} is not the dataset the plan is stored in ({root.uri})")
    partitions_data = data.get("partitions")
    if not isinstance(partitions_data, list):
        raise _refuse(where, "partitions", "must be a list")
    partitions, seen = [], set()
    for number, item in enumerate(partitions_data):
        key = f"partitions[{number}]"
        if not isinstance(item, dict) or not isinstance(item.get("files"), list):
            raise _refuse(where, key, "must be an object with a `files` list")
        partition = item.get("partition")
        if partition != "":
            partition = _confined(partition, root, where, f"{key}.partition")
            if storage.is_hidden(partition):
                raise _refuse(where, f"{key}.partition", f"{partition!r} is hidden (`_`/`.` prefix), not data")
        files = []
        for index, source in enumerate(item["files"]):
            file_key = f"{key}.files[{index}]"
            if not isinstance(source, dict) or set(source) - {"path", "size", "mtime"}:
                raise _refuse(where, file_key, "must be an object with `path`, `size`, `mtime`")
            path = _confined(source.get("path"), root, where, f"{file_key}.path")
            if posixpath.dirname(path) != partition:
                raise _refuse(where, f"{file_key}.path", f"{path!r} is not a file of partition {partition!r}")
            if storage.is_hidden(path) or not _is_parquet(path):
                raise _refuse(where, f"{file_key}.path", f"{path!r} is not a visible Parquet file")
            if path in seen:
                raise _refuse(where, f"{file_key}.path", f"{path!r} is named twice (its rows would be doubled)")
            seen.add(path)
            mtime = source.get("mtime")
            if mtime is not None and not isinstance(mtime, str):
                raise _refuse(where, f"{file_key}.mtime", "must be an ISO time or null")
            files.append(SourceFile(path, _count(source.get("size"), where, f"{file_key}.size"), mtime))
        if not files:
            raise _refuse(where, f"{key}.files", "is empty")
        partitions.append(PartitionPlan(partition, files))
    skipped = data.get("skipped", [])
    if not isinstance(skipped, list) or not all(
            isinstance(entry, dict) and all(isinstance(value, str) for value in entry.values()) for entry in skipped):
        raise _refuse(where, "skipped", "must be a list of {partition, reason} objects")
    return CompactionPlan(run_id, root.uri, partitions, skipped,
                          _count(data.get("files_listed", 0), where, "files_listed"))


def normal_uri(uri: str) -> str:
    """`uri` as `Location.uri` prints it (one spelling per place: `lake`, `lake/` and `file:///abs/lake`
    are one), without creating a filesystem (no S3 client); a URI Seedance does not read, as it is."""
    if uri.startswith("s3://"):
        return "s3://" + uri[len("s3://"):].strip("/")
    try:
        return storage.resolve(uri).uri.rstrip("/")
    except SeedanceError:  # not a URI Seedance reads: not this dataset's either
        return uri


def detect_table_format(root: Location, listing) -> None:
    """Raise RefusedError if a table format (Delta, Iceberg, Hudi) governs the dataset.

    Rewriting such a table's files behind its back would corrupt it: its own log names the files.
    """
    for info in listing:
        parts = root.relative(info.path).split("/")
        for index, part in enumerate(parts[:-1]):
            if part in ("_delta_log", ".hoodie") or (
                part == "metadata" and parts[-1].endswith(_ICEBERG_METADATA) and index == len(parts) - 2
            ):
                raise _table_format(root, part, posixpath.join(*parts[: index + 1]) + "/")


def _table_format(root: Location, marker: str, found: str) -> RefusedError:
    name, advice = TABLE_FORMATS[marker]
    return RefusedError(f"{root.uri} is {name} table or part of one ({found} found); "
                        "Seedance does not rewrite files that a table format tracks", hint=advice)


def refuse_enclosing_table(root: Location) -> None:
    """RefusedError if `root` is a table-format table (`_delta_log/`, `.hoodie/`, Iceberg
    `metadata/` beside it) or lies inside one (a partition of a Delta table: its log names the
    files). A few cheap probes of `root` and each folder above it, no listing of the data, so
    that a refused dataset is refused before anything (a lease) is written into it."""
    path = root.path.rstrip("/") or "/"
    while True:
        folder = Location(root.fs, path, root.scheme) if path != root.path else root
        try:
            found = folder.fs.get_file_info([folder.join(marker) for marker in TABLE_FORMATS])
        except OSError:  # a folder above the root we may not look into: not one we write to either
            found = []
        for marker, info in zip(TABLE_FORMATS, found, strict=False):  # [] when the folder is unreadable
            if info.type != pafs.FileType.Directory:
                continue
            if marker == "metadata" and not _holds_iceberg_metadata(folder.child(marker)):
                continue
            raise _table_format(root, marker, (marker if folder is root else root.uri_of(folder.join(marker))) + "/")
        parent = posixpath.dirname(path)
        if not parent or parent == path or (root.is_s3 and "/" not in path):
            return
        path = parent


def _holds_iceberg_metadata(folder: Location) -> bool:
    try:
        entries = folder.fs.get_file_info(pafs.FileSelector(folder.path, recursive=False, allow_not_found=True))
    except OSError:
        return False
    return any(info.type == pafs.FileType.File and info.path.endswith(_ICEBERG_METADATA) for info in entries)


def _is_parquet(relative: str) -> bool:
    return relative.lower().endswith(PARQUET_SUFFIXES)


def plan_compaction(
    root: Location, run_id: str, *, small_file_size: int, min_age_s: float, now: datetime | None = None,
    target_file_size: int | None = None,
) -> CompactionPlan:
    """The partitions of `root` worth compacting, from one recursive listing.

    Raises RefusedError for a table-format dataset. Partitions left alone are reported in
    `skipped` with the reason, except those with nothing small in them. Symlinks (to files or
    directories) are never followed, and each is reported once in `skipped`. With
    `target_file_size`, a partition whose small files would not become fewer files (two files
    of 70% of the target stay two) is skipped, so runs converge instead of rewriting it nightly.
    """
    now = now or datetime.now(UTC)
    tree = storage.list_tree(root, include_hidden=True)
    listing = tree.files
    detect_table_format(root, listing)
    by_partition: dict[str, list[SourceFile]] = {}
    too_young: dict[str, int] = {}
    data_files = 0
    for info in listing:
        relative = root.relative(info.path)
        if storage.is_hidden(relative) or not _is_parquet(relative):
            continue
        data_files += 1
        if (info.size or 0) >= small_file_size:
            continue
        partition = posixpath.dirname(relative)
        mtime = info.mtime.astimezone(UTC) if info.mtime else None
        if mtime is not None and (now - mtime).total_seconds() < min_age_s:
            too_young[partition] = too_young.get(partition, 0) + 1
            continue
        by_partition.setdefault(partition, []).append(SourceFile(relative, info.size or 0, mtime and mtime.isoformat()))

    plan = CompactionPlan(run_id, root.uri, files_listed=data_files)
    for link in tree.symlinks:  # never followed: it may lead out of the lake, or to a partition twice
        if not storage.is_hidden(link):
            plan.skipped.append({"partition": link, "reason": SYMLINK_REASON})
    for name in tree.undecodable:  # pyarrow cannot open a path that is not text
        if not storage.is_hidden(name):
            plan.skipped.append({"partition": name, "reason": UNDECODABLE_REASON})
    for partition in sorted(set(by_partition) | set(too_young)):
        files = by_partition.get(partition, [])
        if len(files) >= 2 and target_file_size and -(-sum(f.size for f in files) // target_file_size) >= len(files):
            plan.skipped.append({"partition": partition or ".",
                                 "reason": f"{len(files)} small files would stay {len(files)} files at the target size"})
        elif len(files) >= 2:
            plan.partitions.append(PartitionPlan(partition, files))
        elif too_young.get(partition):
            plan.skipped.append(
                {
                    "partition": partition or ".",
                    "reason": f"{too_young[partition]} small file(s) younger than the minimum age; "
                    f"{len(files)} old enough (2 needed)",
                }
            )
    return plan
