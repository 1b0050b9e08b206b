"""Raw checkpoint files in and out: `.pt`/`.pth`/`.ckpt` (torch, weights only; `.ckpt` is what
PyTorch Lightning writes with torch.save) and `.safetensors`.

Reading never unpickles arbitrary objects: `.pt` goes through `torch.load(weights_only=True)`,
whose restricted unpickler refuses any global it does not know (e.g. `os.system`) before calling
it; such a file is refused with RefusedError, as is a zip archive with compressed members
(torch.save writes none; torch.load would inflate them whole into memory). A file holding
something a checkpoint cannot store (a meta tensor, which has no data; a sparse tensor...) is
refused when read, naming the file and the key. Writing goes to a hidden temporary name first and is renamed into place only when
complete, so a failed restore leaves no output file.
"""

from __future__ import annotations

import json
import os
import pickle
import secrets
import stat
from pathlib import Path
from typing import Any

from seedance_tasks.errors import InputError, IntegrityError, RefusedError, UsageError

PT_SUFFIXES = (".pt", ".pth", ".ckpt")
SAFETENSORS_SUFFIX = ".safetensors"
TREE_KEY = "seedance.tree"
MAX_EXPANDED_BYTES = 1 << 30  # the most bytes a broadcast tensor (`x.expand(...)`) is written out to in a .safetensors


def file_format(path: str | os.PathLike) -> str:
    """'pt' or 'safetensors' from the file name; UsageError otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix in PT_SUFFIXES:
        return "pt"
    if suffix == SAFETENSORS_SUFFIX:
        return "safetensors"
    raise UsageError(f"{path}: unknown checkpoint format {suffix!r}", hint="use a .pt, .pth, .ckpt or .safetensors file")


def read_checkpoint(path: str | os.PathLike) -> Any:
    """The state tree in a raw checkpoint file, read without running any code from it.

    Guarantees a tree `tree.flatten` takes: anything else (a meta tensor, a sparse tensor, a
    value of another type) is refused with UsageError naming the file and the key path.
    """
    path = Path(path)
    kind = file_format(path)
    if not path.is_file():
        raise InputError(f"checkpoint file {path} does not exist")
    state = _read_safetensors(path) if kind == "safetensors" else _read_pt(path)
    from seedance_tasks.checkpoint.tree import flatten

    try:
        flatten(state)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc.message}", hint=exc.hint) from None
    return state


def _read_pt(path: Path) -> Any:
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if not (magic.startswith(b"PK\x03\x04") or magic[:1] == b"\x80"):  # torch.save: a zip archive, or a legacy pickle
        raise InputError(f"{path} is not a torch checkpoint (neither a zip archive nor a pickle: starts with {magic!r})",
                         hint="pass a file written by torch.save, or a .safetensors file")
    if magic.startswith(b"PK"):
        _refuse_packed_members(path)
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()
        reason = next((line for line in first if "Unsupported" in line or "global" in line.lower()), first[0] if first else "")
        raise RefusedError(
            f"{path} needs arbitrary unpickling to load, refused ({reason.strip()})",
            hint="save checkpoints as plain state_dicts (tensors, dicts, lists, numbers) or as .safetensors",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise InputError(f"{path} is not a readable torch checkpoint: {exc}",
                         hint="it is damaged or truncated: write it again with torch.save") from None


def _refuse_packed_members(path: Path) -> None:
    """RefusedError if a member of the zip archive `path` is compressed. torch.save stores every
    member as is, so a compressed one was repacked or crafted, and torch.load inflates it whole
    into memory: a file of a few MB can expand past the machine's memory (a zip bomb)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # not a readable archive: torch.load says what is wrong with it
    packed = [info for info in members if info.compress_type != zipfile.ZIP_STORED]
    if packed:
        expands = sum(info.file_size for info in packed)
        raise RefusedError(
            f"{path} has {len(packed)} compressed member(s) (e.g. {packed[0].filename}), {expands:,} bytes once "
            f"inflated from a {path.stat().st_size:,}-byte file: torch.save compresses none, refused (torch.load "
            "would inflate them into memory, past what the machine has for a crafted file)",
            hint="write it again with torch.save (members stored as is), or as .safetensors; to keep files small, "
            "let the checkpoint store compress them")


def _read_safetensors(path: Path) -> Any:
    from safetensors import SafetensorError, safe_open

    from seedance_tasks.checkpoint.tree import tree_problem, unflatten

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            flat = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError(f"{path} is not a readable safetensors file: {exc}",
                         hint="it is damaged, truncated or not safetensors: write it again with "
                         "safetensors.torch.save_file") from None
    if TREE_KEY not in metadata:
        return flat
    try:
        tree = json.loads(metadata[TREE_KEY])
        tensors = [flat[name] for name in tree["names"]]
        problem = tree_problem(tree["skeleton"], len(tensors))
        if problem:
            raise ValueError(f"at {problem[0]}: {problem[1]}")
        return unflatten(tree["skeleton"], tensors)
    except (KeyError, ValueError, TypeError, RecursionError) as exc:
        raise InputError(f"{path}: its {TREE_KEY} metadata is malformed ({exc})",
                         hint="write the file again (seedance ckpt get --out FILE.safetensors), or drop that "
                         "metadata key to read its tensors as a flat dict") from None
    except IntegrityError as exc:  # a node unflatten cannot rebuild
        raise InputError(f"{path}: its {TREE_KEY} metadata is malformed ({exc.message})", hint=exc.hint) from None


def write_checkpoint(state: Any, path: str | os.PathLike, fmt: str | None = None, *, replace: bool = True) -> int:
    """Write `state` to `path` (.pt via torch.save, or .safetensors with the tree in its metadata).

    Writes a hidden temporary file next to `path` and renames it; nothing is left on failure.
    With `replace=False` the name is taken only if free (a hard link: a file that appeared
    meanwhile, another writer's, is kept and RefusedError raised). Returns the bytes written.
    """
    path = Path(path)
    fmt = fmt or file_format(path)
    if fmt not in ("pt", "safetensors"):
        raise UsageError(f"unknown output format {fmt!r}", hint="use pt or safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
    handle = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    mode = os.fstat(handle).st_mode  # 0o666 less the umask: what torch.save gives a new file
    os.close(handle)
    try:
        if fmt == "pt":
            import torch

            torch.save(state, temp)
        else:
            _write_safetensors(state, temp)
        os.chmod(temp, stat.S_IMODE(mode))  # safetensors writes a file of its own, owner-only
        if replace:
            os.replace(temp, path)
        else:
            try:
                os.link(temp, path)
            except FileExistsError:
                raise RefusedError(f"{path} exists; not replaced",
                                   hint="pass --force to replace it, or choose another --out") from None
            finally:
                Path(temp).unlink(missing_ok=True)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def _write_safetensors(state: Any, temp: str) -> None:
    from safetensors.torch import save_file

    from seedance_tasks.checkpoint.tree import flatten, unbroadcast

    skeleton, named = flatten(state)  # tied tensors are one entry already, their leaves share it
    flat, storages = {}, set()
    for name, tensor in named:
        dense_bytes = tensor.numel() * tensor.element_size()
        if dense_bytes > MAX_EXPANDED_BYTES and unbroadcast(tensor) is not tensor:
            raise UsageError(f"tensor {name} is broadcast (stride 0) to {dense_bytes:,} bytes, which safetensors "
                             "(no strides) would write out in full", hint="write a .pt file instead (--out FILE.pt): "
                             "it keeps the tensor broadcast, as the checkpoint stores it")
        dense = tensor.detach().contiguous()
        storage = dense.untyped_storage()
        if storage.nbytes() and storage.data_ptr() in storages:  # views into one storage (w, w[1:]): safetensors
            dense = dense.clone()  # refuses shared memory, so each is written (and read back) on its own
        storages.add(storage.data_ptr())
        flat[name] = dense
    metadata = {TREE_KEY: json.dumps({"skeleton": skeleton, "names": [name for name, _ in named]})}
    try:
        save_file(flat, temp, metadata=metadata)
    except KeyError as exc:  # a dtype safetensors has no name for (complex...)
        name = next((name for name, tensor in flat.items() if tensor.dtype == exc.args[0]), "?")
        raise UsageError(f"safetensors cannot hold {str(exc.args[0]).removeprefix('torch.')} (tensor {name})",
                         hint="write a .pt file instead (--out FILE.pt)") from None
