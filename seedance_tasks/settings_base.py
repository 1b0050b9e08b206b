"""The base of every settings model. Its own module so `*/settings.py` never import `config`
(which assembles them): no import circle, and each section's model imports on its own."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

BOOLEAN_FOR_NUMBER = ("must be a number, not a boolean (YAML reads unquoted yes/no, true/false, on/off as "
                      "booleans)")


class StrictModel(BaseModel):
    """Base of every settings model: unknown keys are refused, values validated on assignment, and
    a boolean is refused where a number (int, float, size, duration) is expected, at any depth of
    lists and mappings: pydantic would read `workers: yes` as 1."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _boolean_for_number(field.annotation, value):
            raise ValueError(BOOLEAN_FOR_NUMBER)
        return value


def _members(annotation: Any) -> list[Any]:
    """The types a value of `annotation` may have: unions flattened, `Annotated` unwrapped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [member for arg in get_args(annotation) for member in _members(arg)]
    return [annotation]


def _takes_boolean(member: Any) -> bool:
    if get_origin(member) is Literal:
        return any(isinstance(arg, bool) for arg in get_args(member))
    return member is bool or member is Any or member is object


def _is_number(member: Any) -> bool:
    return isinstance(member, type) and issubclass(member, int | float) and not issubclass(member, bool)


def _boolean_for_number(annotation: Any, value: Any) -> bool:
    """Whether `value` is, or holds in a list/tuple/set/mapping, a boolean where `annotation`
    expects a number and no boolean."""
    return _boolean_for_any(_members(annotation), value)


def _boolean_for_any(members: list[Any], value: Any) -> bool:
    if isinstance(value, bool):
        return any(map(_is_number, members)) and not any(map(_takes_boolean, members))
    if isinstance(value, list | tuple | set | frozenset):
        held = [item for member in members if get_origin(member) in (list, tuple, set, frozenset)
                for arg in get_args(member) if arg is not Ellipsis for item in _members(arg)]
        return bool(held) and any(_boolean_for_any(held, item) for item in value)
    if isinstance(value, Mapping):
        held = [item for member in members if get_origin(member) in (dict, Mapping) and len(get_args(member)) == 2
                for item in _members(get_args(member)[1])]
        return bool(held) and any(_boolean_for_any(held, item) for item in value.values())
    return False
