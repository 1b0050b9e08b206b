"""Rewrite one partition's small files into files of about the target size, crash-safely.

Row groups stream from the sources (reader threads fetch whole row groups ahead) into a rolling
Parquet writer that cuts a new file when the next row group would pass the target size. Memory
is bounded by the row-group size, not by the input or the target file size. New files are
written under hidden names, verified (row count, schema), published, and only then are the
sources retired to the trash, all through a journal (`seedance_tasks.journal`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seedance_tasks import storage
from seedance_tasks.compaction.plan import PartitionPlan, SourceFile
from seedance_tasks.compaction.schema import SchemaConflict, conform, unify
from seedance_tasks.compaction.settings import CompactionSettings
from seedance_tasks.errors import IntegrityError
from seedance_tasks.journal import Journal
from seedance_tasks.parallel import ordered_map
from seedance_tasks.storage import Location

JOURNAL_KIND = "compaction"
_READ_THREADS = 2
_READ_AHEAD = 4
_CARDINALITY_SAMPLE_ROWS = 8_192
_READ_ERRORS = (pa.ArrowInvalid, pa.ArrowIOError, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError, ValueError)


class BadSourceFile(Exception):
    """A source file could not be read; it is quarantined and its partition retried without it."""

    def __init__(self, source: SourceFile, reason: str):
        super().__init__(f"{source.path}: {reason}")
        self.source = source
        self.reason = reason


@dataclass
class PartitionResult:
    partition: str
    status: str  # "compacted" or "skipped"
    reason: str = ""
    files_before: int = 0
    bytes_before: int = 0
    files_after: int = 0
    bytes_after: int = 0
    rows: int = 0
    outputs: list[str] = field(default_factory=list)
    quarantined: list[dict] = field(default_factory=list)


def _open(root: Location, source: SourceFile) -> pq.ParquetFile:
    try:
        handle = root.fs.open_input_file(root.join(source.path))
        return pq.ParquetFile(handle, pre_buffer=True, page_checksum_verification=True)
    except _READ_ERRORS as exc:
        raise BadSourceFile(source, f"not a readable Parquet file ({exc})") from None


@dataclass(frozen=True)
class _ReadUnit:
    source: SourceFile
    row_groups: tuple[int, ...]


def _read_units(sources: list[tuple[SourceFile, pq.ParquetFile]], read_bytes: int) -> Iterator[_ReadUnit]:
    """Each source's row groups in order, cut into reads of about `read_bytes` (uncompressed)."""
    for source, parquet in sources:
        metadata = parquet.metadata
        batch: list[int] = []
        batch_bytes = 0
        for index in range(metadata.num_row_groups):
            batch.append(index)
            batch_bytes += metadata.row_group(index).total_byte_size
            if batch_bytes >= read_bytes or index == metadata.num_row_groups - 1:
                yield _ReadUnit(source, tuple(batch))
                batch, batch_bytes = [], 0


def _read(root: Location, unit: _ReadUnit, schema: pa.Schema) -> pa.Table:
    """One read unit as a table of `schema`; its own file handle, so reads can run in parallel."""
    parquet = _open(root, unit.source)
    try:
        table = parquet.read_row_groups(list(unit.row_groups))
    except _READ_ERRORS as exc:
        raise BadSourceFile(
            unit.source, f"row groups {unit.row_groups[0]}-{unit.row_groups[-1]} unreadable ({exc})"
        ) from None
    finally:
        parquet.close()
    return conform(table, schema)


def _dictionary_columns(table: pa.Table, max_cardinality: float) -> list[str]:
    """Columns worth dictionary encoding: strings, binaries and integers with few distinct values."""
    chosen = []
    table = table.slice(0, _CARDINALITY_SAMPLE_ROWS)
    rows = max(table.num_rows, 1)
    for field_ in table.schema:
        kind = field_.type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
                or pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind)
                or pa.types.is_integer(kind) or pa.types.is_dictionary(kind)):
            continue
        column = table.column(field_.name)
        if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):  # no count_distinct kernel
            column = column.cast(pa.large_string() if pa.types.is_string_view(kind) else pa.large_binary())
        distinct = pc.count_distinct(column).as_py()
        if distinct / rows <= max_cardinality:
            chosen.append(field_.name)
    return chosen


class _RollingWriter:
    """Writes row groups of about `row_group_size` bytes into files of about `target_file_size`."""

    def __init__(self, root: Location, journal: Journal, partition: str, run_id: str, schema: pa.Schema,
                 settings: CompactionSettings):
        self.root, self.journal, self.partition, self.run_id = root, journal, partition, run_id
        self.schema, self.settings = schema, settings
        self.pending: list[pa.Table] = []
        self.pending_bytes = 0
        self.writer: pq.ParquetWriter | None = None
        self.sink = None
        self.dictionary: list[str] | None = None
        self.ratio = 1.0  # compressed / uncompressed, learnt from the row groups written so far
        self.outputs: list[dict] = []  # {"staged", "final"} relative paths

    def write(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.pending_bytes += table.nbytes
        if self.pending_bytes >= self._flush_threshold():
            self._flush()

    def _flush_threshold(self) -> float:
        """Uncompressed bytes for the next row group: the configured size, or less to fill the file."""
        target = self.settings.target_file_size
        room = target - (self.sink.tell() if self.sink is not None else 0)
        floor = min(self.settings.row_group_size, target) / 16
        return min(self.settings.row_group_size, max(room / self.ratio, floor))

    def _open_next(self, sample: pa.Table) -> None:
        index = len(self.outputs)
        final = posixpath.join(self.partition, f"part-{self.run_id}-{index:05d}.parquet")
        staged = posixpath.join(self.partition, f".seedance-staging-{self.run_id}-{index:05d}.parquet")
        self.journal.add_publish(staged, final)
        self.outputs.append({"staged": staged, "final": final})
        if self.dictionary is None:
            self.dictionary = _dictionary_columns(sample, self.settings.dictionary_max_cardinality)
        compression = None if self.settings.compression == "none" else self.settings.compression
        self.sink = self.root.fs.open_output_stream(self.root.join(staged))
        self.writer = pq.ParquetWriter(
            self.sink,
            self.schema,
            compression=compression,
            compression_level=self.settings.compression_level,
            use_dictionary=self.dictionary,
            write_statistics=True,
        )

    def _flush(self) -> None:
        if not self.pending:
            return
        table = pa.concat_tables(self.pending)
        uncompressed = self.pending_bytes
        self.pending, self.pending_bytes = [], 0
        target = self.settings.target_file_size
        if self.writer is not None and self.sink.tell() + uncompressed * self.ratio > target * 1.02:
            self._close_current()  # this row group would overfill the file: it starts the next one
        if self.writer is None:
            self._open_next(table)
        before = self.sink.tell()
        self.writer.write_table(table, row_group_size=table.num_rows)
        written = self.sink.tell() - before
        if uncompressed:
            self.ratio = max(written / uncompressed, 1e-3)
        if self.sink.tell() >= target * 0.97:
            self._close_current()

    def _close_current(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.sink.close()
            self.writer = self.sink = None

    def close(self) -> list[dict]:
        self._flush()
        self._close_current()
        return self.outputs

    def abort(self) -> None:
        try:
            self._close_current()
        except _READ_ERRORS:
            self.writer = self.sink = None


def _verify(root: Location, outputs: list[dict], rows: int, schema: pa.Schema) -> tuple[int, int]:
    """Check the staged files hold exactly `rows` rows with `schema`; returns (rows, bytes)."""
    seen_rows, seen_bytes = 0, 0
    for output in outputs:
        path = root.join(output["staged"])
        with root.fs.open_input_file(path) as handle:
            metadata = pq.read_metadata(handle)
            size = handle.size()
        written_schema = metadata.schema.to_arrow_schema().remove_metadata()
        if not written_schema.equals(schema, check_metadata=False):
            raise IntegrityError(f"{root.uri_of(path)} was written with schema {written_schema}, expected {schema}")
        seen_rows += metadata.num_rows
        seen_bytes += size
    if seen_rows != rows:
        raise IntegrityError(f"compacted files hold {seen_rows} rows, their sources {rows}; nothing was published")
    return seen_rows, seen_bytes


def compact_partition(root: Location, plan: PartitionPlan, run_id: str, index: int,
                      settings: CompactionSettings) -> PartitionResult:
    """Compact one partition: write hidden, verify, publish, retire the sources to the trash.

    Unreadable sources are quarantined and the partition retried without them; a schema conflict
    skips the partition with the reason. Returns what was done.
    """
    sources = list(plan.files)
    quarantined: list[dict] = []
    for attempt in range(len(sources) + 1):
        opened: list[tuple[SourceFile, pq.ParquetFile]] = []
        journal_id = f"{run_id}-p{index:05d}" + (f"-r{attempt}" if attempt else "")
        try:
            result = _attempt(root, plan, run_id, journal_id, settings, sources, opened, quarantined)
        except BadSourceFile as bad:
            quarantined.append(_quarantine(root, bad, run_id))
            sources = [source for source in sources if source.path != bad.source.path]
            continue
        finally:
            for _, parquet in opened:
                parquet.close()
        return result
    raise AssertionError("unreachable: every retry removes one source")


def _attempt(root: Location, plan: PartitionPlan, run_id: str, journal_id: str, settings: CompactionSettings,
             sources: list[SourceFile], opened: list, quarantined: list[dict]) -> PartitionResult:
    """One try at a partition; raises BadSourceFile (after rolling back) if a source breaks mid-read."""
    partition_label = plan.partition or "."
    for source in list(sources):
        try:
            opened.append((source, _open(root, source)))
        except BadSourceFile as bad:
            quarantined.append(_quarantine(root, bad, run_id))
            sources.remove(source)
    if len(opened) < 2:
        return PartitionResult(partition_label, "skipped", "fewer than 2 readable small files",
                               quarantined=quarantined)
    try:
        schema = unify([(source.path, parquet.schema_arrow) for source, parquet in opened])
    except SchemaConflict as conflict:
        return PartitionResult(partition_label, "skipped", str(conflict), quarantined=quarantined)
    rows = sum(parquet.metadata.num_rows for _, parquet in opened)
    journal = Journal.begin(root, journal_id, JOURNAL_KIND, [], [source.path for source in sources],
                            meta={"partition": plan.partition}, trash_id=run_id)
    writer = _RollingWriter(root, journal, plan.partition, run_id, schema, settings)
    try:
        units = _read_units(opened, settings.row_group_size // 4)
        # small files are read in parallel (pyarrow decodes without the GIL) while this thread encodes
        for table in ordered_map(lambda unit: _read(root, unit, schema), units, threads=_READ_THREADS,
                                 ahead=_READ_AHEAD, name="compaction-read"):
            writer.write(table)
        outputs = writer.close()
        written_rows, written_bytes = _verify(root, outputs, rows, schema)
    except BaseException:
        writer.abort()
        journal.rollback()
        raise
    journal.commit()
    return PartitionResult(
        partition_label, "compacted",
        files_before=len(sources), bytes_before=sum(source.size for source in sources),
        files_after=len(outputs), bytes_after=written_bytes, rows=written_rows,
        outputs=[output["final"] for output in outputs], quarantined=quarantined,
    )


def _quarantine(root: Location, bad: BadSourceFile, run_id: str) -> dict:
    target = storage.quarantine(root, bad.source.path, run_id, bad.reason)
    return {"file": bad.source.path, "reason": bad.reason, "moved_to": root.uri_of(target)}
