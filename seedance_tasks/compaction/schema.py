"""Unify the schemas of a partition's files, allowing only promotions that lose nothing.

Added columns become nullable; integers widen (int32 -> int64, uint8 -> int16 ...), floats widen,
small integers become float64, string/binary become their large variants, timestamps become finer.
Anything else (int64 -> float64, string vs int ...) is a conflict with a reason.
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
    if (pat.is_string(source) and pat.is_large_string(target)) or (
        pat.is_binary(source) and pat.is_large_binary(target)
    ):
        return True
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


def unify(schemas: list[tuple[str, pa.Schema]]) -> pa.Schema:
    """One schema every input casts to without loss; raises SchemaConflict naming file and column.

    Column order is first-seen order; columns missing from some files become nullable. Schema
    metadata (e.g. pandas') is dropped, since it describes one file's columns.
    """
    plain = [(name, schema.remove_metadata()) for name, schema in schemas]
    try:
        unified = pa.unify_schemas([schema for _, schema in plain], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise SchemaConflict(f"schemas cannot be unified: {exc}") from None
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
    return pa.schema(fields)


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
