"""Unify the schemas of a partition's files, allowing only promotions that lose nothing.

Added columns become nullable; integers widen (int32 -> int64, uint8 -> int16 ...), floats widen,
small integers become float64, string/binary become their large variants (and a column that is
string in one file, string_view or dictionary-encoded in another becomes large_string), timestamps
and times become finer. Anything else (int64 -> float64, string vs int ...) is a conflict with a
reason naming the file and the column.

File-level metadata (GeoParquet's `geo`, ...) is kept where every file has the same value; a key
the files disagree on, or that only some have, is a conflict: dropping it could turn a GeoParquet
lake into plain Parquet. Keys that describe one writer's columns (pandas', Spark's, Avro's) are dropped
when the files' columns differ, as they would no longer be true. Field-level metadata (a
column's own key/value pairs, e.g. `PARQUET:field_id`, nested fields' too) follows the same rule:
kept where every file that has the column agrees, else a conflict naming the files and the column.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pat


class SchemaConflict(Exception):
    """The schemas of a partition's files cannot be unified without losing data."""


_INT_BITS = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64,
             pa.uint8(): 8, pa.uint16(): 16, pa.uint32(): 32, pa.uint64(): 64}
_FLOAT_BITS = {pa.float16(): 16, pa.float32(): 32, pa.float64(): 64}
_TIME_RANK = {"s": 0, "ms": 1, "us": 2, "ns": 3}
# describe the writer's columns (pandas, Spark, parquet-mr's Avro/Protobuf/Thrift models): stale after a change
_COLUMN_METADATA = (b"pandas", b"org.apache.spark.", b"parquet.avro.", b"avro.", b"parquet.proto.", b"parquet.thrift.")


def _text_kind(kind: pa.DataType) -> str | None:
    """'string' or 'binary' for every physical form of text or bytes (plain, large, view,
    dictionary-encoded), else None."""
    if pat.is_dictionary(kind):
        kind = kind.value_type
    if pat.is_string(kind) or pat.is_large_string(kind) or pat.is_string_view(kind):
        return "string"
    if pat.is_binary(kind) or pat.is_large_binary(kind) or pat.is_binary_view(kind):
        return "binary"
    return None


def _safe_widening(source: pa.DataType, target: pa.DataType) -> bool:
    if source == target or pat.is_null(source):
        return True
    if source in _INT_BITS and target in _INT_BITS:
        signed_source, signed_target = pat.is_signed_integer(source), pat.is_signed_integer(target)
        if signed_source == signed_target:
            return _INT_BITS[target] >= _INT_BITS[source]
        return not signed_source and signed_target and _INT_BITS[target] > _INT_BITS[source]
    if source in _FLOAT_BITS and target in _FLOAT_BITS:
        return _FLOAT_BITS[target] >= _FLOAT_BITS[source]
    if source in _INT_BITS and target in _FLOAT_BITS:  # exact while the integer fits the mantissa
        mantissa = {16: 11, 32: 24, 64: 53}[_FLOAT_BITS[target]]
        return _INT_BITS[source] < mantissa
    if pat.is_dictionary(source) and pat.is_dictionary(target):
        return _safe_widening(source.index_type, target.index_type) and _safe_widening(
            source.value_type, target.value_type)
    if _text_kind(source) is not None and _text_kind(source) == _text_kind(target):
        return pat.is_large_string(target) or pat.is_large_binary(target)
    if pat.is_time(source) and pat.is_time(target):
        return _TIME_RANK[target.unit] >= _TIME_RANK[source.unit]
    if pat.is_timestamp(source) and pat.is_timestamp(target):
        return source.tz == target.tz and _TIME_RANK[target.unit] >= _TIME_RANK[source.unit]
    if pat.is_decimal(source) and pat.is_decimal(target):
        return target.scale >= source.scale and (target.precision - target.scale) >= (source.precision - source.scale)
    if (pat.is_list(source) or pat.is_large_list(source)) and (pat.is_list(target) or pat.is_large_list(target)):
        return (pat.is_large_list(target) or not pat.is_large_list(source)) and _safe_widening(
            source.value_type, target.value_type
        )
    if pat.is_fixed_size_list(source) and pat.is_fixed_size_list(target):
        return source.list_size == target.list_size and _safe_widening(source.value_type, target.value_type)
    if pat.is_struct(source) and pat.is_struct(target):
        names = {target.field(i).name: target.field(i).type for i in range(target.num_fields)}
        return all(
            source.field(i).name in names and _safe_widening(source.field(i).type, names[source.field(i).name])
            for i in range(source.num_fields)
        )
    return False


def _common_text_types(schemas: list[pa.Schema]) -> dict[str, pa.DataType]:
    """For each column that is text (or bytes) in different physical forms across the files, the
    large form every file casts to; pyarrow's own unification refuses these mixes."""
    forms: dict[str, set[pa.DataType]] = {}
    for schema in schemas:
        for field in schema:
            if _text_kind(field.type) is not None:
                forms.setdefault(field.name, set()).add(field.type)
    common = {}
    for name, kinds in forms.items():
        text = {_text_kind(kind) for kind in kinds}
        if len(kinds) > 1 and len(text) == 1 and not all(pat.is_dictionary(kind) for kind in kinds):
            common[name] = pa.large_string() if text == {"string"} else pa.large_binary()
    return common


def _with_types(schema: pa.Schema, types: dict[str, pa.DataType]) -> pa.Schema:
    for name, kind in types.items():
        index = schema.get_field_index(name)
        if index >= 0:
            schema = schema.set(index, schema.field(index).with_type(kind))
    return schema


def _first_conflict(schemas: list[tuple[str, pa.Schema]], error: Exception) -> SchemaConflict:
    """The first file and column that cannot join the files before it, as a conflict naming both."""
    merged, first = schemas[0][1], schemas[0][0]
    for name, schema in schemas[1:]:
        try:
            merged = pa.unify_schemas([merged, schema], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            for field in schema:
                index = merged.get_field_index(field.name)
                if index >= 0 and merged.field(index).type != field.type:
                    try:
                        pa.unify_schemas([pa.schema([merged.field(index)]), pa.schema([field])],
                                         promote_options="permissive")
                    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                        return SchemaConflict(f"column {field.name!r} is {field.type} in {name} but "
                                              f"{merged.field(index).type} in {first} (or a file before it); "
                                              "no type holds both without loss")
            return SchemaConflict(f"{name}: its schema cannot be unified with {first}'s: {error}")
    return SchemaConflict(f"schemas cannot be unified: {error}")


def _file_metadata(schemas: list[tuple[str, pa.Schema]], same_columns: bool) -> dict[bytes, bytes]:
    """The file-level metadata every file agrees on; raises SchemaConflict for a key they do not."""
    keys = sorted({key for _, schema in schemas for key in (schema.metadata or {})})
    kept = {}
    for key in keys:
        values = [(name, (schema.metadata or {}).get(key)) for name, schema in schemas]
        first_name, first_value = values[0]
        differing = next(((name, value) for name, value in values if value != first_value), None)
        if differing is None:
            if same_columns or not key.startswith(_COLUMN_METADATA):
                kept[key] = first_value
        elif not key.startswith(_COLUMN_METADATA):
            other, value = differing
            missing = f" ({other} has none)" if value is None else f" ({first_name} has none)" if first_value is None else ""
            raise SchemaConflict(
                f"file metadata {key.decode(errors='replace')!r} differs between {first_name} and {other}{missing}: "
                "one compacted file cannot keep both"
            )
    return kept


def _field_paths(field: pa.Field, prefix: str = "") -> list[tuple[str, pa.Field]]:
    """`field` and every field nested in it (struct children, list elements, map keys and
    values), each with its dotted path."""
    path = f"{prefix}{field.name}"
    found = [(path, field)]
    kind = field.type
    if pat.is_struct(kind):
        children = [kind.field(i) for i in range(kind.num_fields)]
    elif pat.is_map(kind):
        children = [kind.key_field, kind.item_field]
    elif pat.is_list(kind) or pat.is_large_list(kind) or pat.is_fixed_size_list(kind):
        children = [kind.value_field]
    else:
        children = []
    for child in children:
        found += _field_paths(child, path + ".")
    return found


def _check_field_metadata(schemas: list[tuple[str, pa.Schema]]) -> None:
    """SchemaConflict if two files give a column (or a field nested in one) different field-level
    metadata (a key with other values, or that only some have), as `_file_metadata` does for
    file-level keys: the compacted file keeps one field, so it could keep only one file's."""
    seen: dict[str, list[tuple[str, dict[bytes, bytes]]]] = {}
    for name, schema in schemas:
        for field in schema:
            for path, nested in _field_paths(field):
                seen.setdefault(path, []).append((name, dict(nested.metadata or {})))
    for path, found in seen.items():
        first_name, first = found[0]
        for other_name, other in found[1:]:
            if other == first:
                continue
            key = min(key for key in set(first) | set(other) if first.get(key) != other.get(key))
            missing = (f" ({other_name} has none)" if key not in other
                       else f" ({first_name} has none)" if key not in first else "")
            raise SchemaConflict(
                f"column {path!r}: field metadata {key.decode(errors='replace')!r} differs between {first_name} "
                f"and {other_name}{missing}: one compacted file cannot keep both"
            )


def _check_case_clashes(schemas: list[tuple[str, pa.Schema]], unified: pa.Schema) -> None:
    """SchemaConflict if the unified schema would hold two columns (or nested fields) whose names
    differ only in case (`userId` in one file, `userid` in another) that no single file holds
    together: case-insensitive readers (Spark, Hive, Athena, Trino) refuse such a file as having
    a duplicate column, so compacting would make readable files unreadable to them. Names a file
    already holds together are kept as they are."""
    by_fold: dict[str, set[str]] = {}
    for field in unified:
        for path, _ in _field_paths(field):
            by_fold.setdefault(path.casefold(), set()).add(path)
    clashes = [sorted(paths) for paths in by_fold.values() if len(paths) > 1]
    if not clashes:
        return
    held = [(name, {path for field in schema for path, _ in _field_paths(field)}) for name, schema in schemas]
    for paths in clashes:
        if any(set(paths) <= mine for _, mine in held):
            continue
        owners = [next(name for name, mine in held if path in mine) for path in paths[:2]]
        raise SchemaConflict(
            f"column {paths[0]!r} in {owners[0]} and column {paths[1]!r} in {owners[1]} differ only in case: "
            "one compacted file would hold both, which case-insensitive readers (Spark, Hive, Athena) "
            "refuse as a duplicate column; rename one of them")


def unify(schemas: list[tuple[str, pa.Schema]]) -> pa.Schema:
    """One schema every input casts to without loss; raises SchemaConflict naming file and column.

    Column order is first-seen order; columns missing from some files become nullable. File-level
    metadata is kept where the files agree (see the module's docstring).
    """
    plain = [(name, schema.remove_metadata()) for name, schema in schemas]
    common = _common_text_types([schema for _, schema in plain])
    widened = [(name, _with_types(schema, common)) for name, schema in plain]
    try:
        unified = pa.unify_schemas([schema for _, schema in widened], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _first_conflict(widened, exc) from None
    for name, schema in plain:
        for field in schema:
            target = unified.field(field.name).type
            if not _safe_widening(field.type, target):
                raise SchemaConflict(
                    f"column {field.name!r} is {field.type} in {name} but {target} elsewhere; "
                    "casting would lose data"
                )
    present_everywhere = set.intersection(*(set(schema.names) for _, schema in plain))
    fields = [
        field if field.name in present_everywhere else field.with_nullable(True)
        for field in unified
    ]
    _check_field_metadata(plain)
    _check_case_clashes(plain, pa.schema(fields))
    same_columns = all(schema.equals(plain[0][1]) for _, schema in plain)
    return pa.schema(fields, metadata=_file_metadata(schemas, same_columns) or None)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with `schema`'s columns in order: missing ones null-filled, others cast losslessly."""
    columns = []
    for field in schema:
        index = table.schema.get_field_index(field.name)
        if index < 0:
            columns.append(pa.nulls(table.num_rows, type=field.type))
        else:
            column = table.column(index)
            columns.append(column if column.type == field.type else column.cast(field.type, safe=True))
    return pa.Table.from_arrays(columns, schema=schema)
