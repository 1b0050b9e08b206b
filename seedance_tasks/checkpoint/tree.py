"""A checkpoint's tree (nested dicts, lists, tuples, scalars, tensors) as JSON plus a tensor list.

`flatten(state)` gives a JSON-able skeleton in which every tensor is replaced by its index, and
the tensors with unique, readable names (`model/fc.weight`, `optimizer/state/0/exp_avg`);
`unflatten(skeleton, tensors)` rebuilds the same tree. Scalars keep their exact type (int, float
incl. nan/inf, bool, None, str); dict keys may be str, int, float, bool or None.
"""

from __future__ import annotations

import math
from typing import Any

from seedance_tasks.errors import UsageError


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and type(value).__name__ in {"Tensor", "Parameter"}


def _scalar(value: Any, where: str) -> dict:
    if value is None:
        return {"none": True}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": str(value)}  # str: JSON readers elsewhere may not keep big ints exact
    if isinstance(value, float):
        return {"float": repr(value) if not math.isfinite(value) else value}
    if isinstance(value, str):
        return {"str": value}
    raise UsageError(
        f"cannot store {type(value).__name__} at {where or '/'} in a checkpoint",
        hint="a checkpoint holds dicts, lists, tuples, tensors, ints, floats, bools, None and strings",
    )


def _scalar_value(node: dict) -> Any:
    if "none" in node:
        return None
    if "bool" in node:
        return bool(node["bool"])
    if "int" in node:
        return int(node["int"])
    if "float" in node:
        return float(node["float"])
    if "str" in node:
        return str(node["str"])
    raise ValueError(f"unknown tree node {node!r}")


def flatten(state: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """(skeleton, [(name, tensor), ...]) of `state`; raises UsageError on a value it cannot store."""
    tensors: list[tuple[str, Any]] = []
    seen: set[str] = set()

    def name_for(path: str) -> str:
        name, extra = path or "tensor", 1
        while name in seen:
            name, extra = f"{path}#{extra}", extra + 1
        seen.add(name)
        return name

    def walk(value: Any, path: str) -> Any:
        if _is_tensor(value):
            tensors.append((name_for(path), value))
            return {"tensor": len(tensors) - 1}
        if isinstance(value, dict):
            items = []
            for key, item in value.items():
                items.append([_scalar(key, path), walk(item, f"{path}/{key}" if path else str(key))])
            return {"dict": items}
        if isinstance(value, list | tuple):
            kind = "tuple" if isinstance(value, tuple) else "list"
            return {kind: [walk(item, f"{path}/{i}" if path else str(i)) for i, item in enumerate(value)]}
        return _scalar(value, path)

    return walk(state, ""), tensors


def unflatten(skeleton: Any, tensors: list[Any]) -> Any:
    """The tree `flatten` took apart, with `tensors[i]` in place of tensor i."""
    if "tensor" in skeleton:
        return tensors[skeleton["tensor"]]
    if "dict" in skeleton:
        return {_scalar_value(key): unflatten(item, tensors) for key, item in skeleton["dict"]}
    if "list" in skeleton:
        return [unflatten(item, tensors) for item in skeleton["list"]]
    if "tuple" in skeleton:
        return tuple(unflatten(item, tensors) for item in skeleton["tuple"])
    return _scalar_value(skeleton)
