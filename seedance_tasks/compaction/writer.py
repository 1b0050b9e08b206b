"""Rewrite one partition's small files into files of about the target size, crash-safely.

Row groups stream from the sources (reader threads fetch whole row groups ahead) into a rolling
Parquet writer that cuts a new file when the next row group would pass the target size. Memory
is bounded by the row-group size, not by the input or the target file size. New files are
written under hidden names, verified (row count, schema), published, and only then are the
sources retired to the trash, all through a journal (`seedance_tasks.journal`).
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from seedance_tasks import journal as journals
from seedance_tasks import lease, storage
from seedance_tasks.compaction.plan import PartitionPlan, SourceFile
from seedance_tasks.compaction.schema import SchemaConflict, conform, unify
from seedance_tasks.compaction.settings import CompactionSettings
from seedance_tasks.errors import IntegrityError, ResourceError
from seedance_tasks.journal import Journal
from seedance_tasks.parallel import ordered_map
from seedance_tasks.storage import Location

JOURNAL_KIND = "compaction"
_READ_THREADS = 2
_READ_AHEAD = 4
_STREAM_ROWS = 1 << 19  # a row group of more rows is read in batches: its decoded size may be many times its bytes
_STREAM_BATCH_ROWS = 1 << 16
_CARDINALITY_SAMPLE_ROWS = 8_192
_CARDINALITY_RECHECK_ROWS = 65_536  # enough rows for a column of dates or prices to show its few values
_CARDINALITY_MOSTLY_DISTINCT = 0.5  # past this in the first sample a column is not rechecked
_READ_ERRORS = (pa.ArrowInvalid, pa.ArrowIOError, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError, ValueError)
_DATA_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)  # not OSError: storage faults
_S3_KEY_MAX = 1024  # bytes


class BadSourceFile(Exception):
    """A source file could not be read; its partition is retried without it. A damaged file is
    quarantined; one that is sound but uses what this build cannot read (`unsupported`: an
    encrypted file, a codec not built in) is left where it is, for the readers that can."""

    def __init__(self, source: SourceFile, reason: str, error: BaseException | None = None):
        super().__init__(f"{source.path}: {reason}")
        self.source = source
        self.reason = reason
        self.unsupported = _unsupported(error) if error is not None else None


def _unsupported(error: BaseException) -> str | None:
    """Why a file that failed to read is not damaged but beyond this build (the reason it is left
    in place), or None: Parquet modular encryption without a key here, or a compression codec
    pyarrow was built without (LZO...). Anything else is taken for damage."""
    text = str(error)
    if re.search(r"encrypt|decrypt", text, re.IGNORECASE):
        return f"encrypted Parquet, and this host has no key for it ({_first_line(error)}); left as it is"
    if re.search(r"codec", text, re.IGNORECASE) and re.search(r"not (implemented|built|supported)|Support for codec",
                                                              text, re.IGNORECASE):
        return f"compressed with a codec this build cannot read ({_first_line(error)}); left as it is"
    return None


class _SourceGone(Exception):
    """A source file left its place while the partition was compacted (another attempt of the
    run retired it, or a writer moved it): not bad data, and the partition is no longer as planned."""

    def __init__(self, source: SourceFile):
        super().__init__(source.path)
        self.source = source


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
    left: list[dict] = field(default_factory=list)  # sound files this build cannot read: {"file", "reason"}


def _open(root: Location, source: SourceFile, int96_unit: str | None = None) -> pq.ParquetFile:
    """`source` opened for reading; INT96 timestamps (if any) decode to `int96_unit` (pyarrow's
    default, ns, when None: see `_int96_unit` for why compaction chooses it per file)."""
    try:
        handle = root.fs.open_input_file(root.join(source.path))
        return pq.ParquetFile(handle, pre_buffer=True, page_checksum_verification=True,
                              coerce_int96_timestamp_unit=int96_unit)
    except _READ_ERRORS as exc:
        raise BadSourceFile(source, f"not a readable Parquet file ({exc})", exc) from None


def _int96_columns(parquet: pq.ParquetFile) -> list[str]:
    """The top-level columns of `parquet` holding INT96 (Spark/Hive/Impala legacy) timestamps."""
    schema = parquet.metadata.schema
    paths = [schema.column(i).path for i in range(len(schema)) if schema.column(i).physical_type == "INT96"]
    return [name for name in parquet.schema_arrow.names
            if any(path == name or path.startswith(name + ".") for path in paths)]


def _timestamp_leaves(array: pa.Array) -> list[pa.Array]:
    """Every timestamp array inside `array` (through structs, lists and maps), in a fixed order."""
    kind = array.type
    if pa.types.is_timestamp(kind):
        return [array]
    if pa.types.is_struct(kind):
        return [leaf for i in range(kind.num_fields) for leaf in _timestamp_leaves(array.field(i))]
    if pa.types.is_map(kind):
        return _timestamp_leaves(array.keys) + _timestamp_leaves(array.items)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _timestamp_leaves(array.values)
    return []


def _int96_unit(root: Location, source: SourceFile, parquet: pq.ParquetFile) -> str | None:
    """The unit that holds every INT96 timestamp of `source` exactly: "us" unless a value has
    sub-microsecond digits, then "ns"; None if the file has no INT96 column.

    pyarrow decodes INT96 to nanoseconds by default, and silently wraps values outside
    1677-09-21..2262-04-11 (Spark's 0001-01-01 and 9999-12-31 sentinels become 1754 and 1816).
    So each INT96 column is decoded twice: in seconds (which cannot overflow: INT96 holds a
    32-bit day) and in nanoseconds; comparing them (remainders in wrapping 64-bit arithmetic,
    ranges in checked arithmetic) tells exactly which unit holds every value.
    One unit serves the whole file (pyarrow's option is per file): a file with sub-microsecond
    digits in one value and a value beyond the nanosecond range in another (or a value beyond
    the microsecond range) raises SchemaConflict: the partition is skipped, the file is fine.
    """
    columns = _int96_columns(parquet)
    if not columns:
        return None
    reads = {"s": _open(root, source, "s"), "ns": parquet}
    finer: str | None = None  # the first column with sub-microsecond digits
    wider: str | None = None  # the first column with a value beyond the nanosecond range
    try:
        for group in range(parquet.metadata.num_row_groups):
            try:
                tables = {unit: read.read_row_group(group, columns=columns) for unit, read in reads.items()}
            except _READ_ERRORS as exc:
                raise BadSourceFile(source, f"row group {group} unreadable ({_first_line(exc)})", exc) from None
            for name in columns:
                chunks = zip(tables["s"].column(name).chunks, tables["ns"].column(name).chunks, strict=True)
                for s_chunk, ns_chunk in chunks:
                    leaves = zip(_timestamp_leaves(s_chunk), _timestamp_leaves(ns_chunk), strict=True)
                    for by_s, by_ns in leaves:
                        if (by_s.type.unit, by_ns.type.unit) != ("s", "ns"):
                            continue  # an INT64 timestamp beside the INT96 one: read the same in any case
                        needs_ns, fits_ns = _check_int96(source, name, by_s, by_ns)
                        finer = finer or (name if needs_ns else None)
                        wider = wider or (name if not fits_ns else None)
    finally:
        reads["s"].close()
    if finer and wider:
        raise SchemaConflict(
            f"{source.path}: INT96 timestamps of column {finer!r} have sub-microsecond digits and those of "
            f"column {wider!r} lie beyond the nanosecond range (1677-2262): pyarrow reads a file's INT96 "
            "columns in one unit, and none holds both exactly")
    return "ns" if finer else "us"


def _check_int96(source: SourceFile, column: str, by_s: pa.Array, by_ns: pa.Array) -> tuple[bool, bool]:
    """(needs nanoseconds, fits nanoseconds) for these INT96 values, decoded in s and ns.

    SchemaConflict if they are beyond even the microsecond range, or need nanoseconds and do
    not fit them."""
    seconds, nanos = (leaf.cast(pa.int64()) for leaf in (by_s, by_ns))
    # floor(T / 1 ns) - floor(T / 1 s) * 10**9 (in [0, 10**9)), exact even where the nanosecond decode wrapped
    sub_second = pc.subtract(nanos, pc.multiply(seconds, 1_000_000_000))
    sub_second_us = pc.divide(sub_second, 1_000)  # integer division of values >= 0: floor
    sub_micro = pc.subtract(sub_second, pc.multiply(sub_second_us, 1_000))  # the digits a microsecond read drops
    try:
        micros = pc.add_checked(pc.multiply_checked(seconds, 1_000_000), sub_second_us)  # floor(T / 1 us)
    except pa.ArrowInvalid:
        raise SchemaConflict(f"{source.path}: column {column!r} holds INT96 timestamps beyond the microsecond "
                             "range (about 290,000 years from 1970); they cannot be rewritten exactly") from None
    needs_ns = bool(pc.any(pc.not_equal(sub_micro, 0)).as_py())
    try:
        pc.add_checked(pc.multiply_checked(micros, 1_000), sub_micro)
        fits_ns = True
    except pa.ArrowInvalid:
        fits_ns = False
    if needs_ns and not fits_ns:
        raise SchemaConflict(f"{source.path}: column {column!r} holds INT96 timestamps with sub-microsecond "
                             "digits and others beyond the nanosecond range (1677-2262): no timestamp unit "
                             "holds both exactly")
    return needs_ns, fits_ns


@dataclass(frozen=True)
class _ReadUnit:
    source: SourceFile
    row_groups: tuple[int, ...]
    int96_unit: str | None = None
    stream: bool = False  # one row group too big to decode whole: read in batches (`_stream`)


def _read_units(sources: list[tuple[SourceFile, pq.ParquetFile]], read_bytes: int,
                int96_units: dict[str, str] | None = None) -> Iterator[_ReadUnit]:
    """Each source's row groups in order, cut into reads of about `read_bytes` (uncompressed); a
    row group of more than _STREAM_ROWS rows is a read of its own, streamed in batches."""
    for source, parquet in sources:
        metadata = parquet.metadata
        int96_unit = (int96_units or {}).get(source.path)
        batch: list[int] = []
        batch_bytes = 0
        for index in range(metadata.num_row_groups):
            group = metadata.row_group(index)
            if group.num_rows > _STREAM_ROWS:
                if batch:
                    yield _ReadUnit(source, tuple(batch), int96_unit)
                    batch, batch_bytes = [], 0
                yield _ReadUnit(source, (index,), int96_unit, stream=True)
                continue
            batch.append(index)
            batch_bytes += group.total_byte_size
            if batch_bytes >= read_bytes:
                yield _ReadUnit(source, tuple(batch), int96_unit)
                batch, batch_bytes = [], 0
        if batch:
            yield _ReadUnit(source, tuple(batch), int96_unit)


def _read(root: Location, unit: _ReadUnit, schema: pa.Schema) -> pa.Table | Iterator[pa.Table]:
    """One read unit as a table of `schema` (a streamed unit: an iterator of tables, `_stream`);
    its own file handle, so reads can run in parallel.

    A value the unified schema cannot hold (e.g. a millisecond timestamp beyond the nanosecond
    range) raises SchemaConflict naming the file: the partition is skipped, the file is fine.
    """
    if unit.stream:
        return _stream(root, unit, schema)
    parquet = _open(root, unit.source, unit.int96_unit)
    try:
        table = parquet.read_row_groups(list(unit.row_groups))
    except _READ_ERRORS as exc:
        raise BadSourceFile(unit.source, _unreadable_row_groups(parquet, unit.row_groups, exc), exc) from None
    finally:
        parquet.close()
    return _conformed(unit, table, schema)


def _stream(root: Location, unit: _ReadUnit, schema: pa.Schema) -> Iterator[pa.Table]:
    """A big row group as tables of _STREAM_BATCH_ROWS rows, decoded as they are taken: a small
    file of a few MB can hold one row group of millions of rows that decodes to gigabytes
    (dictionary-encoded strings), which a whole read would hold at once (times the read-ahead)."""
    parquet = _open(root, unit.source, unit.int96_unit)
    try:
        batches = parquet.iter_batches(batch_size=_STREAM_BATCH_ROWS, row_groups=list(unit.row_groups))
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except _READ_ERRORS as exc:
                raise BadSourceFile(unit.source, _unreadable_row_groups(parquet, unit.row_groups, exc),
                                    exc) from None
            yield _conformed(unit, pa.Table.from_batches([batch]), schema)
    finally:
        parquet.close()


def _conformed(unit: _ReadUnit, table: pa.Table, schema: pa.Schema) -> pa.Table:
    try:
        return conform(table, schema)
    except _DATA_ERRORS as exc:
        raise SchemaConflict(f"{unit.source.path}: its values do not fit the partition's unified schema "
                             f"({_first_line(exc)})") from None


def _unreadable_row_groups(parquet: pq.ParquetFile, row_groups: tuple[int, ...], error: BaseException) -> str:
    """Which of `row_groups` fail to read (each read alone), with the first one's error: the reason
    a file is quarantined names the damage, not the whole read unit it was found in."""
    bad: list[int] = []
    first = error
    for index in row_groups if len(row_groups) > 1 else ():
        try:
            parquet.read_row_group(index)
        except _READ_ERRORS as exc:
            first = exc if not bad else first
            bad.append(index)
    bad = bad or list(row_groups)
    label = f"row group {bad[0]}" if len(bad) == 1 else f"row groups {', '.join(map(str, bad))}"
    return f"{label} of {parquet.metadata.num_row_groups} unreadable ({first})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _dictionary_columns(table: pa.Table, max_cardinality: float) -> list[str]:
    """Columns worth dictionary encoding: flat columns with few distinct values in a sample.

    Strings, binaries and every fixed-width scalar (integers, floats, decimals, dates, times,
    timestamps, durations) are candidates; a dictionary of few values makes their pages smaller and
    cheaper to compress than plain ones. Columns that are dictionary-typed already (categoricals)
    keep their dictionary; booleans and nested columns never take one.
    """
    chosen = []
    for field_ in table.schema:
        kind = field_.type
        if pa.types.is_dictionary(kind):
            chosen.append(field_.name)
            continue
        if not _dictionary_candidate(kind):
            continue
        column = table.column(field_.name)
        ratio = _distinct_ratio(column, _CARDINALITY_SAMPLE_ROWS)
        if max_cardinality < ratio <= _CARDINALITY_MOSTLY_DISTINCT and table.num_rows > _CARDINALITY_SAMPLE_ROWS:
            ratio = _distinct_ratio(column, _CARDINALITY_RECHECK_ROWS)  # a few values that a small sample overstates
        if ratio <= max_cardinality:
            chosen.append(field_.name)
    return chosen


def _distinct_ratio(column: pa.ChunkedArray, rows: int) -> float:
    """Distinct values per row in the first `rows` of `column`; 1.0 for a type without the kernel."""
    sample = column.slice(0, rows)
    kind = column.type
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):  # no count_distinct kernel
        sample = sample.cast(pa.large_string() if pa.types.is_string_view(kind) else pa.large_binary())
    try:
        return pc.count_distinct(sample).as_py() / max(len(sample), 1)
    except _DATA_ERRORS:  # plain encoding is always correct
        return 1.0


def _dictionary_candidate(kind: pa.DataType) -> bool:
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind)
            or pa.types.is_fixed_size_binary(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind)
            or pa.types.is_decimal(kind) or pa.types.is_temporal(kind))


def output_names(partition: str, run_id: str, token: str, number: int) -> dict:
    """The staged (hidden, short) and final names of one output file of one attempt.

    Both carry the attempt's token, so a retried attempt never writes over an earlier one's
    files; the staged name stays short so that it fits wherever the final name fits.
    """
    return {
        "staged": posixpath.join(partition, f".seedance-{token}-{number:05d}.parquet"),
        "final": posixpath.join(partition, f"part-{run_id}-{token}-{number:05d}.parquet"),
    }


class _RollingWriter:
    """Writes row groups of about `row_group_size` bytes into files of about `target_file_size`."""

    def __init__(self, root: Location, journal: Journal, partition: str, run_id: str, token: str,
                 schema: pa.Schema, settings: CompactionSettings):
        self.root, self.journal, self.partition, self.run_id, self.token = root, journal, partition, run_id, token
        self.schema, self.settings = schema, settings
        self.pending: list[pa.Table] = []
        self.pending_bytes = 0
        self.writer: pq.ParquetWriter | None = None
        self.sink = None
        self.write_back = storage.WriteBack(root.fs, None)
        self.dictionary: list[str] | None = None
        self.ratio = 1.0  # compressed / uncompressed, learnt from the row groups written so far
        self.outputs: list[dict] = []  # {"staged", "final"} relative paths

    def write(self, table: pa.Table) -> None:
        """Buffer `table`, cutting it into row groups that fill the current file up to the target."""
        while table.num_rows:
            room = self._flush_threshold() - self.pending_bytes
            row_bytes = table.nbytes / table.num_rows
            rows = table.num_rows if table.nbytes <= room else max(1, int(room // row_bytes))
            piece, table = table.slice(0, rows), table.slice(rows)
            self.pending.append(piece)
            self.pending_bytes += rows * row_bytes
            if self.pending_bytes >= self._flush_threshold():
                self._flush()

    def _flush_threshold(self) -> float:
        """Uncompressed bytes for the next row group: the configured size, or less to fill the file."""
        target = self.settings.target_file_size
        room = target - (self.sink.tell() if self.sink is not None else 0)
        floor = min(self.settings.row_group_size, target) / 16
        return min(self.settings.row_group_size, max(room / self.ratio, floor))

    def _open_next(self, sample: pa.Table) -> None:
        names = output_names(self.partition, self.run_id, self.token, len(self.outputs))
        self.journal.add_publish(names["staged"], names["final"])
        self.outputs.append(names)
        if self.dictionary is None:
            self.dictionary = _dictionary_columns(sample, self.settings.dictionary_max_cardinality)
        compression = None if self.settings.compression == "none" else self.settings.compression
        self.sink = self.root.fs.open_output_stream(self.root.join(names["staged"]))
        self.write_back = storage.WriteBack(self.root.fs, self.root.join(names["staged"]))
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
        self.write_back.written(self.sink.tell())
        if uncompressed:
            self.ratio = max(written / uncompressed, 1e-3)
        if self.sink.tell() >= target * 0.97:
            self._close_current()

    def _close_current(self) -> None:
        self.write_back.close()
        if self.writer is not None:
            self.writer.close()
            self.sink.close()
            self.writer = self.sink = None

    def close(self) -> list[dict]:
        """Write what is pending and close; a partition without rows still gets one (empty) file."""
        self._flush()
        if not self.outputs:  # only zero-row sources: one file keeps the schema visible
            self._open_next(self.schema.empty_table())
        self._close_current()
        return self.outputs

    def abort(self) -> None:
        """Close and remove this attempt's staged files: hidden, never published, only ours.

        Removing them (rather than moving them to the trash) frees the space at once, which
        matters when the write failed because the disk is full.
        """
        try:
            self._close_current()
        except _READ_ERRORS:
            self.writer = self.sink = None
        for output in self.outputs:
            path = self.root.join(output["staged"])
            try:
                if storage.is_file(self.root.fs, path):
                    self.root.fs.delete_file(path)
            except OSError:  # the journal's rollback moves what is left to the trash
                pass


class _Unverified(Exception):
    """The staged files do not hold what the sources hold; nothing was published."""


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
            raise _Unverified(f"the rewritten file reads back with schema {written_schema}, expected {schema}")
        seen_rows += metadata.num_rows
        seen_bytes += size
    if seen_rows != rows:
        raise _Unverified(f"the compacted files hold {seen_rows} rows, their sources {rows}")
    return seen_rows, seen_bytes


def _path_limits(root: Location) -> tuple[int, int | None]:
    """(longest path, longest name) in bytes that `root`'s filesystem accepts."""
    if root.is_s3:
        return _S3_KEY_MAX, None
    try:
        return os.pathconf(root.path, "PC_PATH_MAX") - 1, os.pathconf(root.path, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 4095, 255


def _too_long(root: Location, plan: PartitionPlan, run_id: str, sources: list[SourceFile]) -> str | None:
    """Why the paths this partition's compaction must create would not fit the filesystem, or None.

    Checked before anything is written: the staged and final outputs, and the trash and
    quarantine places of every source (a retire that cannot be done would jam the journal).
    """
    path_max, name_max = _path_limits(root)
    names = output_names(plan.partition, run_id, "f" * 8, 99_999)
    wanted = [names["staged"], names["final"]]
    for source in sources:
        wanted.append(posixpath.join(storage.TRASH_DIR, run_id, source.path))
        wanted.append(posixpath.join(storage.QUARANTINE_DIR, run_id, source.path) + ".reason.json")
    for relative in wanted:
        full = root.join(relative)
        length = len((full.partition("/")[2] if root.is_s3 else full).encode())
        if length > path_max:
            return (f"path too long: compacting needs {root.uri_of(full)} ({length} bytes), over this "
                    f"filesystem's limit of {path_max}; use shorter partition or file names")
        longest = max(relative.split("/"), key=lambda part: len(part.encode()))
        if name_max and len(longest.encode()) > name_max:
            return f"name too long: {longest[:40]}... is over {name_max} bytes"
    return None


def compact_partition(root: Location, plan: PartitionPlan, run_id: str, index: int,
                      settings: CompactionSettings, *, held=None, resume: bool = False) -> PartitionResult:
    """Compact one partition: write hidden, verify, publish, retire the sources to the trash.

    Unreadable sources are quarantined (damaged) or left in place (sound but beyond this build:
    encrypted, an unbuilt codec; listed in `left`) and the partition retried without them; a
    source that disappears meanwhile, a schema conflict, a value or type that cannot be
    rewritten exactly, a path too long for the filesystem, or a fresh lease of another run on an
    overlapping lake (`lease.overlapping`) skips the partition with the reason. Each try has its own journal and file names (an attempt
    token), so an attempt never overwrites another's. With `resume` (a retried task), a partition
    an earlier attempt already compacted is reported from its done journal, not compacted again,
    and only the sources still in place are compacted. `held` (the dataset's lease) is checked
    right before the point of no return. Returns what was done.
    """
    sources = list(plan.files)
    quarantined: list[dict] = []
    if resume:
        earlier, sources, quarantined = _resume(root, plan, run_id, index)
        if earlier is not None:
            return earlier
    too_long = _too_long(root, plan, run_id, sources)
    if too_long:
        return PartitionResult(plan.partition or ".", "skipped", too_long)
    left: list[dict] = []
    for _ in range(len(sources) + 1):
        opened: list[tuple[SourceFile, pq.ParquetFile]] = []
        token = secrets.token_hex(4)
        try:
            result = _attempt(root, plan, run_id, index, token, settings, sources, opened, quarantined, left, held)
        except BadSourceFile as bad:
            try:
                _set_aside(root, bad, run_id, quarantined, left)
            except _SourceGone as gone:
                result = _source_gone(root, plan, run_id, index, gone.source, quarantined)
                break
            sources = [source for source in sources if source.path != bad.source.path]
            continue
        except _SourceGone as gone:
            result = _source_gone(root, plan, run_id, index, gone.source, quarantined)
        finally:
            for _, parquet in opened:
                parquet.close()
        break
    else:
        raise AssertionError("unreachable: every retry removes one source")
    result.left = left
    return result


def _source_gone(root: Location, plan: PartitionPlan, run_id: str, index: int, source: SourceFile,
                 quarantined: list[dict]) -> PartitionResult:
    """The result of a partition whose `source` disappeared mid-compaction: the result of the
    attempt of this run that compacted it (a retry that ran while this one was presumed dead),
    else skipped with the reason. Never a quarantine: the file was not bad, only gone."""
    earlier = _done_result(root, plan, run_id, index)
    if earlier is not None:
        return earlier
    return PartitionResult(
        plan.partition or ".", "skipped",
        f"{source.path} disappeared while the partition was compacted (another attempt or writer moved it); "
        "nothing was published, the next run plans this partition again", quarantined=quarantined)


def journal_prefix(run_id: str, index: int) -> str:
    """The journal id prefix of every attempt at partition `index` of run `run_id`."""
    return f"{run_id}-p{index:05d}-"


def _resume(root: Location, plan: PartitionPlan, run_id: str, index: int
            ) -> tuple[PartitionResult | None, list[SourceFile], list[dict]]:
    """What earlier attempts at this partition left: (their result if one finished, sources
    still in place, sources they quarantined)."""
    infos = root.fs.get_file_info([root.join(source.path) for source in plan.files]) if plan.files else []
    in_place = [source for source, info in zip(plan.files, infos, strict=True) if info.type == pafs.FileType.File]
    if len(in_place) == len(plan.files):
        return None, in_place, []  # a finished attempt retires every source: none finished
    earlier = _done_result(root, plan, run_id, index)
    if earlier is not None:
        return earlier, in_place, earlier.quarantined
    quarantined = []
    still_there = {source.path for source in in_place}
    for source in plan.files:
        if source.path in still_there:
            continue
        reason_path = root.join(storage.QUARANTINE_DIR, run_id, source.path) + ".reason.json"
        if storage.is_file(root.fs, reason_path):
            try:
                reason = str(storage.read_json(root.fs, reason_path).get("reason", ""))
            except (ValueError, AttributeError):
                reason = "quarantined by an earlier attempt"
            quarantined.append({"file": source.path, "reason": reason,
                                "moved_to": root.uri_of(root.join(storage.QUARANTINE_DIR, run_id, source.path))})
    return None, in_place, quarantined


def _done_result(root: Location, plan: PartitionPlan, run_id: str, index: int) -> PartitionResult | None:
    """The result of an earlier attempt that compacted this partition, rebuilt from its done journal."""
    prefix = journal_prefix(run_id, index)
    selector = pafs.FileSelector(root.join(journals.DONE_DIR), recursive=False, allow_not_found=True)
    for info in sorted(root.fs.get_file_info(selector), key=lambda item: item.path):
        name = posixpath.basename(info.path)
        if not name.startswith(prefix) or not name.endswith(".json"):
            continue
        try:
            done = journals.find(root, name.removesuffix(".json"))
        except IntegrityError:  # a done journal that no longer validates proves nothing: compact again
            continue
        if done is None or done.state != journals.DONE or done.kind != JOURNAL_KIND:
            continue
        recorded = done.meta.get("result") if isinstance(done.meta.get("result"), dict) else {}
        quarantined = recorded.get("quarantined")
        return PartitionResult(
            plan.partition or ".", "compacted",
            files_before=len(done.retires), bytes_before=_count(recorded, "bytes_before"),
            files_after=len(done.publishes), bytes_after=_count(recorded, "bytes_after"),
            rows=_count(recorded, "rows"),
            outputs=[item["final"] for item in done.publishes],
            quarantined=quarantined if isinstance(quarantined, list) else [],
        )
    return None


def _count(recorded: dict, key: str) -> int:
    """A count from a journal's recorded result (untrusted: 0 if it is not a number)."""
    try:
        return max(int(recorded.get(key, 0)), 0)
    except (TypeError, ValueError):
        return 0


def _attempt(root: Location, plan: PartitionPlan, run_id: str, index: int, token: str,
             settings: CompactionSettings, sources: list[SourceFile], opened: list, quarantined: list[dict],
             left: list[dict], held) -> PartitionResult:
    """One try at a partition; raises BadSourceFile (after rolling back) if a source breaks mid-read."""
    partition_label = plan.partition or "."
    int96_units: dict[str, str] = {}
    for source in list(sources):
        try:
            parquet = _open(root, source)
            try:
                int96_unit = _int96_unit(root, source, parquet)
            except BaseException:
                parquet.close()
                raise
            if int96_unit is not None:
                int96_units[source.path] = int96_unit
            if int96_unit not in (None, "ns"):  # reopened so that its schema and reads use that unit (default: ns)
                parquet.close()
                parquet = _open(root, source, int96_unit)
            opened.append((source, parquet))
        except BadSourceFile as bad:
            _set_aside(root, bad, run_id, quarantined, left)
            sources.remove(source)
        except SchemaConflict as conflict:
            return PartitionResult(partition_label, "skipped", str(conflict), quarantined=quarantined)
    if len(opened) < 2:
        return PartitionResult(partition_label, "skipped", "fewer than 2 readable small files",
                               quarantined=quarantined)
    try:
        schema = unify([(source.path, parquet.schema_arrow) for source, parquet in opened])
    except SchemaConflict as conflict:
        return PartitionResult(partition_label, "skipped", str(conflict), quarantined=quarantined)
    rows = sum(parquet.metadata.num_rows for _, parquet in opened)
    journal = Journal.begin(root, f"{journal_prefix(run_id, index)}a{token}", JOURNAL_KIND, [],
                            [source.path for source in sources], meta={"partition": plan.partition},
                            trash_id=run_id)
    writer = _RollingWriter(root, journal, plan.partition, run_id, token, schema, settings)
    skip_reason = None
    try:
        units = _read_units(opened, settings.row_group_size // 4, int96_units)
        # small files are read in parallel (pyarrow decodes without the GIL) while this thread encodes
        for read in ordered_map(lambda unit: _read(root, unit, schema), units, threads=_READ_THREADS,
                                ahead=_READ_AHEAD, name="compaction-read"):
            for table in [read] if isinstance(read, pa.Table) else read:  # a streamed unit: batch by batch
                writer.write(table)
        outputs = writer.close()
        written_rows, written_bytes = _verify(root, outputs, rows, schema)
    except SchemaConflict as conflict:
        skip_reason = str(conflict)
    except _Unverified as failed:
        skip_reason = f"verification failed, nothing published: {failed}"
    except _DATA_ERRORS as exc:
        skip_reason = f"cannot be rewritten exactly ({type(exc).__name__}: {_first_line(exc)}); left as it is"
    except OSError as exc:
        writer.abort()
        journal.rollback()
        if exc.errno == errno.ENAMETOOLONG:
            return PartitionResult(partition_label, "skipped", f"name too long for the filesystem: {exc}",
                                   quarantined=quarantined)
        if exc.errno == errno.ENOSPC or "errno 28]" in str(exc):
            raise ResourceError(
                f"no space left on the device while compacting {root.uri_of(root.join(plan.partition))}: "
                "the partial staged file was removed and nothing was changed",
                hint="free space on that disk and rerun; the next run compacts this partition again",
            ) from exc
        raise
    except BaseException:
        writer.abort()
        journal.rollback()
        raise
    if skip_reason is not None:
        writer.abort()
        journal.rollback()
        return PartitionResult(partition_label, "skipped", skip_reason, quarantined=quarantined)
    result = PartitionResult(
        partition_label, "compacted",
        files_before=len(sources), bytes_before=sum(source.size for source in sources),
        files_after=len(outputs), bytes_after=written_bytes, rows=written_rows,
        outputs=[output["final"] for output in outputs], quarantined=quarantined,
    )
    journal.meta["result"] = asdict(result)  # saved with the commit: a retry reports it from here
    if held is not None:
        held.check()  # LeaseLostError: the new holder rolls this writing journal back
        other = lease.overlapping(root, plan.partition, holder=held.record.holder, name=held.record.name)
        if other is not None:  # a run on a lake holding this one, or inside it: it may rewrite these files too
            journal.rollback()
            return PartitionResult(
                partition_label, "skipped",
                f"the lake {other[0]} overlaps this partition and is being compacted by {other[1].describe()}; "
                "nothing was published, the next run compacts it", quarantined=quarantined)
    journal.commit()
    return result


def _set_aside(root: Location, bad: BadSourceFile, run_id: str, quarantined: list[dict], left: list[dict]) -> None:
    """Take an unreadable source out of the partition's compaction: quarantined if damaged, left
    in place (listed in `left`) if sound but beyond this build; _SourceGone if it is gone."""
    if bad.unsupported is None:
        quarantined.append(_quarantine(root, bad, run_id))
    elif storage.is_file(root.fs, root.join(bad.source.path)):
        left.append({"file": bad.source.path, "reason": bad.unsupported})
    else:
        raise _SourceGone(bad.source)


def _quarantine(root: Location, bad: BadSourceFile, run_id: str) -> dict:
    """Quarantine an unreadable source; _SourceGone if it is neither in place nor quarantined
    already (its read failed because it was gone: nothing to quarantine, nothing to report)."""
    here = root.join(bad.source.path)
    quarantined = root.join(storage.QUARANTINE_DIR, run_id, bad.source.path)
    if not any(info.type == pafs.FileType.File for info in root.fs.get_file_info([here, quarantined])):
        raise _SourceGone(bad.source)
    target = storage.quarantine(root, bad.source.path, run_id, bad.reason)
    return {"file": bad.source.path, "reason": bad.reason, "moved_to": root.uri_of(target)}
