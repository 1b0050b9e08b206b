"""A checkpoint's tree (nested dicts, lists, tuples, scalars, tensors) as JSON plus a tensor list.

`flatten(state)` gives a JSON-able skeleton in which every tensor is replaced by its index, and
the tensors with unique, readable names (`model/fc.weight`, `optimizer/state/0/exp_avg`);
`unflatten(skeleton, tensors)` rebuilds the same tree, as `torch.load(weights_only=True)` would
give it back after `torch.save`. Scalars keep their exact type and value (int, float incl. inf and
every NaN bit for bit, bool, None, str, torch.dtype); dict keys may be str, int, float, bool or None.

What the skeleton records besides values (JSON, never pickle):
- `{"dict": [[key, value], ...]}`, plus `"class": "OrderedDict"` for an OrderedDict and
  `"metadata": <tree>` for its `_metadata` attribute (the module versions of a `state_dict()`,
  which `load_state_dict` hands to each module's migration code). A skeleton without them (an
  older manifest) restores plain dicts, as before.
- `{"quantized": {...}}`: a quantized tensor as its integer values (`int_repr()`, a tensor of
  the tree), its dtype and qscheme, and its scale/zero point (per tensor: exact JSON numbers;
  per channel: two more tensors, and the axis). It restores bit-exact, quantizer included.
- `{"tensor": i}` leaves may share one tensor `i` (tied weights): the same tensor object at two
  keys, or two tensor objects over the same data (same storage, offset, shape, strides, dtype),
  is stored once. Leaves of one object restore as one object; `"view": n` (n >= 1) marks the
  n-th other object over that data, restored as a tensor object of its own sharing the data, as
  `torch.load` gives them. Views of one storage that differ in offset, shape or strides (`w[1:]`,
  `w.t()`) are stored as separate tensors and come back unshared.
- `"parameter": true` on a leaf: an `nn.Parameter` (restored as one); `"requires_grad": true`:
  the tensor required grad (restored so; `torch.load` keeps it too).
- `{"tuple": [...], "class": "Size"}`: a `torch.Size` (its items ints), restored as one.

No other class is recorded: a namedtuple, a defaultdict or any other subclass of dict, list or
tuple of the caller's code is stored as the plain container and restores as one (restoring the
class would mean importing the caller's code by a name a stored file gives); `flatten` says so
in a `warning:` log line naming the first path that holds one.

A skeleton without the optional fields (an older manifest: no classes, no shared leaves) restores
as it did when it was written; a reader from before them ignores them (plain tuples, tensors).
"""

from __future__ import annotations

import logging
import math
import re
import struct
from collections import OrderedDict
from typing import Any

from seedance_tasks.errors import IntegrityError, UsageError

log = logging.getLogger(__name__)

ORDERED = "OrderedDict"
SIZE = "Size"  # the class of a tuple node holding a torch.Size
LEAF_FLAGS = ("parameter", "requires_grad")  # leaf attributes, recorded only when true
QUANTIZED_DTYPES = ("quint8", "qint8", "qint32")
UNREADABLE_DTYPES = ("q", "bits")  # dtype name prefixes a manifest never holds: quantized (stored as
# their int_repr and quantizer) and the untyped bits* dtypes
PER_TENSOR = ("per_tensor_affine",)
PER_CHANNEL = ("per_channel_affine", "per_channel_affine_float_qparams")
EXACT_SUFFIXES = ("step", ":q_scales", ":q_zero_points")


def keep_exact(name: str) -> bool:
    """True for a tensor a lossy save must keep exact: step counters and quantization parameters."""
    return re.sub(r"#\d+$", "", name).endswith(EXACT_SUFFIXES)


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and type(value).__name__ in {"Tensor", "Parameter"}


def _scalar(value: Any, where: str) -> dict:
    if value is None:
        return {"none": True}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": int.__repr__(value)}  # text: JSON readers elsewhere may not keep big ints exact
    if isinstance(value, float):
        return {"float": _float_text(value) if not math.isfinite(value) else value}
    if isinstance(value, str):
        return {"str": value}
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":  # e.g. in quantized modules
        return {"torch_dtype": str(value).removeprefix("torch.")}
    if type(value).__name__ not in ("Tensor", "Parameter") and any(
        cls.__name__ == "Tensor" and cls.__module__.startswith("torch") for cls in type(value).__mro__
    ):
        raise UsageError(
            f"cannot store the {type(value).__name__} (a tensor subclass) at {where or '/'} in a checkpoint",
            hint="store plain tensors with data: convert it to a dense CPU torch.Tensor first",
        )
    raise UsageError(
        f"cannot store {type(value).__name__} at {where or '/'} in a checkpoint",
        hint="a checkpoint holds dicts, lists, tuples, tensors, ints, floats, bools, None, strings and dtypes",
    )


def _key(key: Any, where: str) -> dict:
    """The node of dict key `key` (a scalar); UsageError naming the key and its dict otherwise."""
    try:
        return _scalar(key, where)
    except UsageError:
        raise UsageError(f"cannot store the dict key {str(key)[:80]!r} (a {type(key).__name__}) of "
                         f"{where or '/'} in a checkpoint",
                         hint="a checkpoint's dict keys are strings, ints, floats, bools, None or dtypes: "
                         "use str(key) instead") from None


def _float_text(value: float) -> str:
    """A non-finite float as text: "inf", "-inf", "nan" (the canonical NaN), or "nan:<its 8 bytes,
    big-endian hex>" for any other NaN (negative, with a payload, signalling), which reads back
    bit for bit as `torch.load` gives it."""
    if value == value:
        return float.__repr__(value)  # "inf" for a float subclass too (numpy.float64's repr is "np.float64(inf)")
    bits = struct.pack(">d", value)
    return "nan" if bits == _CANONICAL_NAN else f"{NAN_BITS}{bits.hex()}"


def _scalar_value(node: dict) -> Any:
    if "none" in node:
        return None
    if "bool" in node:
        return bool(node["bool"])
    if "int" in node:
        return int(node["int"])
    if "float" in node:
        text = node["float"]
        if isinstance(text, str) and text.startswith(NAN_BITS):
            return struct.unpack(">d", bytes.fromhex(text.removeprefix(NAN_BITS)))[0]
        return float(text)
    if "str" in node:
        return str(node["str"])
    if "torch_dtype" in node:
        import torch

        dtype = getattr(torch, str(node["torch_dtype"]), None)
        if isinstance(dtype, torch.dtype):
            return dtype
    raise _unknown(node)


MAX_DEPTH = 100  # containers inside containers: far past any model's state, well inside Python's recursion limit
MAX_INT_DIGITS = 4000
"""The most digits (sign aside) of a Python int in a checkpoint's tree, for the writer and the
reader alike: `save` refuses a longer one up front (UsageError naming its key path,
`manifest.oversized_int`), `parse` refuses a manifest holding one (`tree_problem`). Below Python's
own int/str conversion limit (4300 digits by default), so any interpreter reads it back."""
_INT_TEXT = re.compile(rf"^-?[0-9]{{1,{MAX_INT_DIGITS}}}$")
_FLOAT_TEXT = ("nan", "inf", "-inf")
NAN_BITS = "nan:"  # a NaN other than the canonical one, by its bits (`_float_text`)
_NAN_TEXT = re.compile(r"nan:[0-9a-f]{16}")
_CANONICAL_NAN = struct.pack(">d", math.nan)


def tree_problem(skeleton: Any, tensor_count: int) -> tuple[str, str] | None:
    """(path, problem) of the first node that keeps `skeleton` from being a tree `unflatten` can
    rebuild over `tensor_count` tensors (known nodes only, tensor indices in range, scalars of
    their kind, at most MAX_DEPTH containers deep), or None. Iterative: a hostile tree cannot
    exhaust the stack."""
    pending = [(skeleton, 0, "tree")]
    while pending:
        node, depth, path = pending.pop()
        if depth > MAX_DEPTH:
            return "tree", f"nested more than {MAX_DEPTH} containers deep"
        problem = _node_problem(node, tensor_count)
        if problem:
            return path, problem
        pending.extend((child, depth + 1, f"{path}.{label}") for label, child in _children(node))
    return None


def _node_problem(node: Any, tensor_count: int) -> str | None:
    if not isinstance(node, dict) or not node:
        return f"{str(node)[:60]!r} is not a tree node"
    if "tensor" in node:
        index = node["tensor"]
        valid = isinstance(index, int) and not isinstance(index, bool) and 0 <= index < tensor_count
        if not valid:
            return f"tensor index {str(index)[:40]!r} is not one of its {tensor_count} tensors"
        view = node.get("view", 0)
        if not isinstance(view, int) or isinstance(view, bool) or view < 0:
            return f"a tensor's view {str(view)[:40]!r} is not a count"
        return next((f"a tensor's {flag} holds {str(node[flag])[:40]!r}, not true"
                     for flag in LEAF_FLAGS if flag in node and node[flag] is not True), None)
    if "dict" in node:
        pairs = node["dict"]
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            return "a dict node holds [key, value] pairs"
        return next((problem for key, _ in pairs if (problem := _scalar_problem(key))), None)
    if "list" in node or "tuple" in node:
        items = node.get("list", node.get("tuple"))
        if not isinstance(items, list):
            return "a list node holds a list"
        if "tuple" in node and "class" in node:
            if node["class"] != SIZE:
                return f"unknown tuple class {str(node['class'])[:40]!r}"
            if not all(isinstance(item, dict) and list(item) == ["int"] for item in items):
                return "a Size node holds ints"
        return None
    if "quantized" in node:
        return None if isinstance(node["quantized"], dict) else "a quantized node holds an object"
    return _scalar_problem(node)


_SCALAR_CHECKS = {  # what each scalar node kind may hold (as `_scalar` writes it)
    "none": lambda v: v is True,
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, str) and bool(_INT_TEXT.match(v)),
    "float": lambda v: ((isinstance(v, int | float) and not isinstance(v, bool)) or v in _FLOAT_TEXT
                        or (isinstance(v, str) and bool(_NAN_TEXT.fullmatch(v)))),
    "str": lambda v: isinstance(v, str),
    "torch_dtype": lambda v: isinstance(v, str),
}


def _scalar_problem(node: Any) -> str | None:
    if not isinstance(node, dict) or len(node) != 1:
        return f"{str(node)[:60]!r} is not a tree node"
    (kind, value), = node.items()
    valid = _SCALAR_CHECKS.get(kind)
    if valid is None:
        return f"unknown node kind {kind[:40]!r}"
    return None if valid(value) else f"{kind} node holds {str(value)[:40]!r}"


def _children(node: dict) -> list[tuple[str, Any]]:
    if "dict" in node:
        return [(f"dict[{index}]", value) for index, (_key, value) in enumerate(node["dict"])] + (
            [("metadata", node["metadata"])] if "metadata" in node else [])
    for kind in ("list", "tuple"):
        if kind in node:
            return [(f"{kind}[{index}]", item) for index, item in enumerate(node[kind])]
    if "quantized" in node:
        quantized = node["quantized"]
        return [(f"quantized.{key}", quantized[key]) for key in ("values", "scale", "zero_point", "scales", "zero_points")
                if key in quantized]
    return []


def _unknown(node: Any) -> IntegrityError:
    return IntegrityError(
        f"unknown node {str(node)[:120]!r} in a checkpoint's tree",
        hint="the checkpoint was written by a newer Seedance, or its manifest is damaged",
    )


def _qname(tensor) -> tuple[str, str]:
    return str(tensor.dtype).removeprefix("torch."), str(tensor.qscheme()).removeprefix("torch.")


def flatten(state: Any, *, share: bool = True) -> tuple[Any, list[tuple[str, Any]]]:
    """(skeleton, [(name, tensor), ...]) of `state`; raises UsageError on a value it cannot store.

    `share=False` gives the form of versions before tied weights were stored once: every leaf a
    tensor of its own, named by its path (to compare a state with what such a version stored)."""
    tensors: list[tuple[str, Any]] = []
    seen: set[str] = set()

    def name_for(path: str) -> str:
        name, extra = path or "tensor", 1
        while name in seen:
            name, extra = f"{path}#{extra}", extra + 1
        seen.add(name)
        return name

    def add(tensor: Any, path: str) -> dict:
        tensors.append((name_for(path), tensor))
        return {"tensor": len(tensors) - 1}

    by_data: dict[tuple, int] = {}  # what a tensor's data is (_data_key) -> its index
    by_object: dict[int, tuple[int, int]] = {}  # id() of a tensor object of `state` -> (index, view)
    views: dict[int, int] = {}  # index -> tensor objects over its data so far
    quantized_nodes: dict[int, dict] = {}  # id() of a quantized tensor of `state` -> its node

    def leaf(tensor: Any, path: str) -> dict:
        known = by_object.get(id(tensor)) if share else (add(tensor, path)["tensor"], 0)
        if known is None:
            key = _data_key(tensor)
            index = by_data.get(key) if key is not None else None
            if index is None:
                index = add(tensor, path)["tensor"]
                if key is not None:
                    by_data[key] = index
            known = by_object[id(tensor)] = (index, views.get(index, 0))
            views[index] = known[1] + 1
        node: dict[str, Any] = {"tensor": known[0]}
        if known[1]:
            node["view"] = known[1]
        if type(tensor).__name__ == "Parameter":
            node["parameter"] = True
        if tensor.requires_grad:
            node["requires_grad"] = True
        return node

    def quantized(value: Any, path: str) -> dict:
        dtype, scheme = _qname(value)
        if dtype not in QUANTIZED_DTYPES or scheme not in PER_TENSOR + PER_CHANNEL:
            raise UsageError(
                f"cannot store the quantized tensor at {path or '/'} ({dtype}, {scheme}) in a checkpoint",
                hint=f"quantized tensors of {', '.join(QUANTIZED_DTYPES)} per tensor or per channel are "
                "stored; dequantize() this one or save its int_repr() and parameters yourself",
            )
        node: dict[str, Any] = {"dtype": dtype, "qscheme": scheme, "values": add(value.int_repr(), path)}
        if scheme in PER_TENSOR:
            node["scale"] = _scalar(float(value.q_scale()), path)
            node["zero_point"] = _scalar(int(value.q_zero_point()), path)
        else:
            node["scales"] = add(value.q_per_channel_scales(), f"{path}:q_scales")
            node["zero_points"] = add(value.q_per_channel_zero_points(), f"{path}:q_zero_points")
            node["axis"] = int(value.q_per_channel_axis())
        return {"quantized": node}

    def walk(value: Any, path: str, depth: int = 0) -> Any:
        if _is_tensor(value):
            _check_dense(value, path)
            if not value.is_quantized:
                return leaf(value, path)
            if id(value) not in quantized_nodes or not share:
                quantized_nodes[id(value)] = quantized(value, path)
            return quantized_nodes[id(value)]
        if depth > MAX_DEPTH:
            raise UsageError(f"cannot store {path}: nested more than {MAX_DEPTH} containers deep",
                             hint="a checkpoint's dicts and lists nest at most that deep; flatten that part of the state")
        if type(value) not in _PLAIN_CONTAINERS and isinstance(value, dict | list | tuple) and \
                not (type(value).__name__ == SIZE and type(value).__module__ == "torch"):
            plain.setdefault(type(value), path)
        if isinstance(value, dict):
            items = []
            for key, item in value.items():
                items.append([_key(key, path), walk(item, f"{path}/{key}" if path else str(key), depth + 1)])
            node: dict[str, Any] = {"dict": items}
            if isinstance(value, OrderedDict):
                node["class"] = ORDERED
                metadata = getattr(value, "_metadata", None)
                if metadata is not None:
                    node["metadata"] = walk(metadata, f"{path}/_metadata" if path else "_metadata", depth + 1)
            return node
        if isinstance(value, list | tuple):
            kind = "tuple" if isinstance(value, tuple) else "list"
            node = {kind: [walk(item, f"{path}/{i}" if path else str(i), depth + 1) for i, item in enumerate(value)]}
            if type(value).__name__ == SIZE and type(value).__module__ == "torch":
                node["class"] = SIZE
            return node
        return _scalar(value, path)

    plain: dict[type, str] = {}  # a container class of the caller's code -> the first path holding one
    skeleton = walk(state, "")
    for cls, path in plain.items():
        if cls not in _NOTED:  # once a process: a training loop saves the same state every N steps
            _NOTED.add(cls)
            log.warning("warning: %s", plain_container_note(cls, path))
    return skeleton, tensors


_PLAIN_CONTAINERS = (dict, OrderedDict, list, tuple)
_NOTED: set[type] = set()  # container classes already said to restore as plain ones


def plain_container_note(cls: type, path: str) -> str:
    """What a save says of a container of class `cls` (a namedtuple, a defaultdict, any other
    subclass of dict/list/tuple) at `path`: it is stored, and restores, as the plain container.
    A checkpoint never records a class of the caller's code: restoring one would mean importing
    that code, and restores never run code named by a stored file."""
    base = next(kind for kind in (OrderedDict, dict, tuple, list) if issubclass(cls, kind))
    fields = getattr(cls, "_fields", None)
    what = f"namedtuple {cls.__qualname__}({', '.join(map(str, fields))})" if issubclass(cls, tuple) and \
        isinstance(fields, tuple) else f"{cls.__module__}.{cls.__qualname__}"
    again = f" ({cls.__qualname__}(*value))" if isinstance(fields, tuple) else ""
    return (f"{path or '/'} (and any other {cls.__qualname__} in the checkpoint) is a {what}: stored as a plain "
            f"{base.__name__}, it restores as one (a checkpoint records no classes of your code); "
            f"hint: rebuild it after loading{again}, or save it as a plain {base.__name__}")


def _data_key(tensor: Any) -> tuple | None:
    """What makes two tensor objects the same data: one storage, offset, shape, strides, dtype,
    device and conj/neg bits; None for a tensor with no storage bytes (never shared by data)."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # no storage to compare: never shared by data
        return None
    if storage.nbytes() == 0:
        return None
    return (storage.data_ptr(), str(tensor.device), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype, tensor.is_conj(), tensor.is_neg())


def unbroadcast(tensor: Any) -> Any:
    """`tensor` with each broadcast dimension (stride 0, size > 1: `x.expand(...)`) narrowed to
    size 1, a view holding each of its distinct elements once (`.expand(tensor.shape)` gives it
    back); `tensor` itself when it has none or no elements."""
    compact = tensor
    if tensor.numel():
        for dim, (size, step) in enumerate(zip(tensor.shape, tensor.stride(), strict=True)):
            if step == 0 and size > 1:
                compact = compact.narrow(dim, 0, 1)
    return compact


def _check_dense(tensor: Any, path: str) -> None:
    import torch

    if tensor.is_nested or tensor.layout != torch.strided:
        layout = "nested" if tensor.is_nested else str(tensor.layout).removeprefix("torch.")
        raise UsageError(f"cannot store the {layout} tensor at {path or '/'} in a checkpoint",
                         hint="store dense tensors: save tensor.to_dense() (or its indices and values) instead")
    dtype = str(tensor.dtype).removeprefix("torch.")
    if not tensor.is_quantized and dtype.startswith(UNREADABLE_DTYPES):
        raise UsageError(f"cannot store the {dtype} tensor at {path or '/'} in a checkpoint",
                         hint="view its bytes as an integer dtype of the same size (e.g. tensor.view(torch.uint8)) "
                         "and save that")
    is_functional = getattr(torch, "_is_functional_tensor", None)
    if tensor.is_meta or (is_functional is not None and is_functional(tensor)):
        kind = "meta" if tensor.is_meta else "functional"
        raise UsageError(f"cannot store the {kind} tensor at {path or '/'} in a checkpoint: it holds no data",
                         hint="materialise it first (e.g. load the real weights, or tensor.to_empty(device='cpu') "
                         "and initialise it), then save")


def _dequantized_node(node: dict, tensors: list[Any]) -> Any:
    """The quantized tensor a `quantized` node describes (its quantizer rebuilt exactly)."""
    import torch

    values = tensors[node["values"]["tensor"]]
    if node["qscheme"] in PER_TENSOR:
        rebuilt = torch._make_per_tensor_quantized_tensor(
            values, _scalar_value(node["scale"]), _scalar_value(node["zero_point"])
        )
    elif node["qscheme"] in PER_CHANNEL:
        rebuilt = torch._make_per_channel_quantized_tensor(
            values, tensors[node["scales"]["tensor"]], tensors[node["zero_points"]["tensor"]], int(node["axis"])
        )
    else:
        raise _unknown(node)
    if _qname(rebuilt) != (node["dtype"], node["qscheme"]):
        raise IntegrityError(
            f"a quantized tensor of the checkpoint comes back as {_qname(rebuilt)}, "
            f"not the stored {node['dtype']}, {node['qscheme']}",
            hint="restore with the PyTorch version that saved it",
        )
    return rebuilt


def unflatten(skeleton: Any, tensors: list[Any]) -> Any:
    """The tree `flatten` took apart, with `tensors[i]` in place of tensor i.

    Leaves that were one tensor object come back as one object, other objects over the same data
    (`view`) as objects of their own sharing it; `parameter`/`requires_grad` leaves as
    `nn.Parameter`/tensors requiring grad (new objects over `tensors[i]`, which stays as given).
    """
    return _rebuild(skeleton, tensors, {})


def _rebuild(skeleton: Any, tensors: list[Any], leaves: dict) -> Any:
    if "tensor" in skeleton:
        return _leaf(skeleton, tensors, leaves)
    if "quantized" in skeleton:
        return _dequantized_node(skeleton["quantized"], tensors)
    if "dict" in skeleton:
        kind = skeleton.get("class")
        if kind not in (None, ORDERED):
            raise _unknown({"class": kind})
        items = ((_scalar_value(key), _rebuild(item, tensors, leaves)) for key, item in skeleton["dict"])
        if kind is None:
            return dict(items)
        rebuilt = OrderedDict(items)
        if "metadata" in skeleton:
            rebuilt._metadata = _rebuild(skeleton["metadata"], tensors, leaves)  # type: ignore[attr-defined]
        return rebuilt
    if "list" in skeleton:
        return [_rebuild(item, tensors, leaves) for item in skeleton["list"]]
    if "tuple" in skeleton:
        items = tuple(_rebuild(item, tensors, leaves) for item in skeleton["tuple"])
        kind = skeleton.get("class")
        if kind is None:
            return items
        if kind != SIZE:
            raise _unknown({"class": kind})
        import torch

        try:
            return torch.Size(items)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise IntegrityError(f"a torch.Size of the checkpoint's tree holds {str(items)[:80]}, not sizes",
                                 hint="its manifest (or file metadata) is damaged") from None
    return _scalar_value(skeleton)


def _leaf(node: dict, tensors: list[Any], leaves: dict) -> Any:
    """The tensor object of one leaf: one object per (tensor, view, flags), as flatten saw them."""
    view = node.get("view", 0)
    parameter, grad = node.get("parameter") is True, node.get("requires_grad") is True
    key = (node["tensor"], view, parameter, grad)
    if key in leaves:
        return leaves[key]
    tensor = tensors[node["tensor"]]
    if view or parameter or grad:
        import torch

        tensor = tensor.detach()  # an object of its own over the same data
        try:
            tensor = torch.nn.Parameter(tensor, requires_grad=grad) if parameter else tensor.requires_grad_(grad)
        except RuntimeError as exc:  # e.g. an integer tensor marked as requiring grad
            raise IntegrityError(f"tensor {node['tensor']} of the checkpoint's tree cannot be restored as "
                                 f"recorded ({str(exc).splitlines()[0]})",
                                 hint="its manifest (or file metadata) is damaged") from None
    leaves[key] = tensor
    return tensor


def aliases(skeleton: Any, names: list[str]) -> dict[str, str]:
    """{the name a leaf that shares another leaf's tensor (tied weights) would have had on its own:
    the name of the tensor it shares}, for lookups by name (`load_tensor("model/lm_head.weight")`).
    `names` are the tensors' names in order; a name that is a tensor's own is never an alias."""
    own = set(names)
    found: dict[str, str] = {}

    def walk(node: Any, path: str) -> None:
        if "tensor" in node:
            name = path or "tensor"
            if name not in own and name not in found and names[node["tensor"]] != name:
                found[name] = names[node["tensor"]]
        elif "dict" in node:
            for key, item in node["dict"]:
                label = _scalar_value(key)
                walk(item, f"{path}/{label}" if path else str(label))
            if "metadata" in node:
                walk(node["metadata"], f"{path}/_metadata" if path else "_metadata")
        else:
            for kind in ("list", "tuple"):
                for index, item in enumerate(node.get(kind, ())):
                    walk(item, f"{path}/{index}" if path else str(index))

    walk(skeleton, "")
    return found


def _plain(skeleton: Any, classes: bool = True) -> Any:
    """`skeleton` without what older manifests did not record: leaf flags and torch.Size (before
    them), and with `classes` also dict classes and metadata (before those)."""
    if isinstance(skeleton, dict):
        size = "tuple" in skeleton
        return {key: _plain(value, classes) for key, value in skeleton.items()
                if key not in LEAF_FLAGS and not (key == "class" and (classes or size))
                and not (classes and key == "metadata")}
    if isinstance(skeleton, list):
        return [_plain(item, classes) for item in skeleton]
    return skeleton


def same_tree(skeleton: Any, stored: Any) -> bool:
    """True if `skeleton` (from flatten) matches a stored one; a stored tree from before leaf flags
    and torch.Size (or before container classes) were recorded matches on everything else."""
    if skeleton == stored:
        return True
    return any(_plain(stored, classes) == stored and _plain(skeleton, classes) == stored for classes in (False, True))
