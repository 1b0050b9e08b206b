"""Plan a compaction: list the dataset once, group files by partition, choose what to rewrite.

A partition (the directory holding the files, e.g. `date=2026-11-01/`) is compacted when it
has at least two small Parquet files old enough to be finished and rewriting them would leave
fewer files; everything else stays put, so a compacted lake is left alone by the next run.
Hidden files (`_`/`.` prefix) are not data.
"""

from __future__ import annotations

import posixpath
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from seedance_tasks import storage
from seedance_tasks.errors import RefusedError
from seedance_tasks.storage import Location

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
SYMLINK_REASON = "symlink: not followed"

TABLE_FORMATS = {
    "_delta_log": ("Delta Lake", "run Delta's own OPTIMIZE (and VACUUM) on this table"),
    ".hoodie": ("Apache Hudi", "use Hudi's clustering / compaction service on this table"),
    "metadata": ("Apache Iceberg", "run Iceberg's rewrite_data_files procedure on this table"),
}


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
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> CompactionPlan:
        partitions = [
            PartitionPlan(item["partition"], [SourceFile(**source) for source in item["files"]])
            for item in data["partitions"]
        ]
        return cls(data["run_id"], data["uri"], partitions, data["skipped"], data["files_listed"])


def detect_table_format(root: Location, listing) -> None:
    """Raise RefusedError if a table format (Delta, Iceberg, Hudi) governs the dataset.

    Rewriting such a table's files behind its back would corrupt it: its own log names the files.
    """
    for info in listing:
        parts = root.relative(info.path).split("/")
        for index, part in enumerate(parts[:-1]):
            if part in ("_delta_log", ".hoodie") or (
                part == "metadata" and parts[-1].endswith((".metadata.json", ".avro")) and index == len(parts) - 2
            ):
                name, advice = TABLE_FORMATS[part]
                raise RefusedError(
                    f"{root.uri} is a {name} table ({posixpath.join(*parts[: index + 1])}/ found); "
                    "Seedance does not rewrite files that a table format tracks",
                    hint=advice,
                )


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
