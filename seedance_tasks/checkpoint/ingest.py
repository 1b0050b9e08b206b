"""The inbox: raw checkpoints trainers drop as `INBOX/<run>/step-<N>.pt|.pth|.ckpt|.safetensors`.

`scan` lists what is ready (not hidden, older than `inbox_min_age`, the step named in the file
name by an explicit step marker, see `parse_name`; `step-000120.pt` -> 120). A file whose name
has no step marker, or two that disagree, is skipped with a warning naming it and a hint (never
stored under a guessed step); so is a shard (`model-00001-of-00002`) and every file of a step
that several files name (the ranks of a model-parallel save): one of them is part of a checkpoint. `ingest_one` compresses one
file into the store, verifies the stored checkpoint by decoding it (the digest of every chunk), and
only then moves the raw file to `INBOX/_seedance/trash/<run-id>/` (purged later by age).

Attempt-safe: each attempt works under the run's lease (`run-<run>` in the store) and records
its intent in a journal of its own in the inbox (`ingest-<file key>-a<token>`, the raw file as
its retire, the save's attempt token in its meta). A new attempt for the same file first
recovers the journals of the earlier ones (that prefix only): data files of a save that never
committed are removed, a retire past its point of no return is finished. Then the step is
stored (or found stored with the same content), verified, and the raw file retired. A file that
cannot be read safely (a pickle that needs code, a corrupt file) is quarantined under
`INBOX/_seedance/quarantine/`, and the other files go on.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import tempfile
from datetime import UTC, datetime
from typing import Any

from seedance_tasks import journal, lease, storage
from seedance_tasks.checkpoint.files import PT_SUFFIXES, SAFETENSORS_SUFFIX
from seedance_tasks.errors import InputError, RefusedError, UsageError

KIND = "ckpt-ingest"
log = logging.getLogger(__name__)

SUFFIXES = (*PT_SUFFIXES, SAFETENSORS_SUFFIX)
MAX_STEP_DIGITS = 18  # a step of up to 18 digits fits an int64 everywhere it goes
# A step marker: a whole token (not inside a word) `step` / `global_step` (DeepSpeed's
# `global_step1000`) followed by `-`, `_`, `=` (Lightning's `epoch=3-step=1000`), a space or
# nothing, or `checkpoint-`/`checkpoint_` (HF Trainer's `checkpoint-1000`), then the digits up to
# the end of the token (not a decimal: `step-1.5` has no step). Any other number in the name (an
# epoch, a loss, a date, `bf16`) is not a step.
_STEP_MARKER = re.compile(
    r"(?<![a-z0-9])(?:(?:global[_-]?)?step[-_= ]?|checkpoint[-_])([0-9]+)(?![a-z0-9]|\.[0-9])", re.IGNORECASE
)
STEP_FORMS = "step-N, step_N, stepN, step=N, global_stepN, checkpoint-N"
# A shard marker (Hugging Face's `model-00001-of-00002`): the file holds part of a checkpoint.
_SHARD_MARKER = re.compile(r"(?<![a-z0-9])([0-9]+)-of-([0-9]+)(?![a-z0-9])", re.IGNORECASE)
_SHARD_HINT = "merge the shards into one file (load each, e.g. with safetensors.torch.load_file, and save their " \
    "union) as INBOX/<run>/step-<N>.safetensors, or save the checkpoint unsharded"
_SAME_STEP_HINT = "leave one file per step in the run's folder: merge shards (or ranks) into one file, or move " \
    "duplicates out of the inbox"
_HINT = "rename it to INBOX/<run>/step-<N>.pt (N: the training step it was saved at)"
_LAYOUT_HINT = "move it to INBOX/<run>/step-<N>.pt, or out of the inbox (one file per checkpoint: a folder such " \
    "as HF's checkpoint-<N>/ is not taken; export it with torch.save or safetensors)"
_SUFFIX_HINT = "checkpoints are .pt/.pth/.ckpt (torch.save) or .safetensors files: rename it to INBOX/<run>/step-<N>.pt " \
    "if it is one, or move it out of the inbox"


def parse_name(relative: str) -> tuple[str, int] | None:
    """(run, step) of an inbox file `run/<name>.pt|.pth|.ckpt|.safetensors` whose name carries exactly one
    step (one or more step markers, all the same number: see `_STEP_MARKER`); None otherwise
    (`name_problem` says why). Never guesses a step from other numbers in the name."""
    return _parse(relative)[0]


def name_problem(relative: str) -> str | None:
    """Why the inbox file `relative` is not taken (its layout or name), or None if it is."""
    return _parse(relative)[1]


def _parse(relative: str) -> tuple[tuple[str, int] | None, str | None, str | None]:
    """((run, step), None, None), or (None, why the file is not taken, what to do about it)."""
    parts = relative.split("/")
    if len(parts) != 2:
        return None, "not a file in a run's folder (INBOX/<run>/step-<N>.pt)", _LAYOUT_HINT
    name = parts[1]
    suffix = next((suffix for suffix in SUFFIXES if name.lower().endswith(suffix)), None)
    if suffix is None:
        return None, "not a .pt, .pth, .ckpt or .safetensors file", _SUFFIX_HINT
    shard = next((m for m in _SHARD_MARKER.finditer(name[: -len(suffix)]) if int(m.group(2)) > 1), None)
    if shard:
        return None, f"one shard ({shard.group(0)}) of a sharded checkpoint: the inbox takes a whole checkpoint in " \
            "one file", _SHARD_HINT
    steps = [match.group(1) for match in _STEP_MARKER.finditer(name[: -len(suffix)])]
    if not steps:
        return None, f"no step marker in the name ({STEP_FORMS}); other numbers in it are not taken as the step", _HINT
    numbers = sorted({int(step) for step in steps})
    if len(numbers) > 1:
        return None, f"the name names {len(numbers)} different steps ({', '.join(map(str, numbers))})", _HINT
    if max(len(step.lstrip("0")) for step in steps) > MAX_STEP_DIGITS:
        return None, f"its step has more than {MAX_STEP_DIGITS} digits", _HINT
    return (parts[0], numbers[0]), None, None


def scan(inbox_uri: str, min_age_s: float, now: datetime | None = None, run: str | None = None, *,
         warn: bool = True) -> dict:
    """What is ready in the inbox: {"ready": [{path, run, step, size}], "skipped": [{path, reason}]}.

    Sorted by (run, step) so that each checkpoint can delta against the one before it. With
    `run`, only that run's folder is listed. A file whose layout or name does not say its run and
    step (`name_problem`) is skipped with the reason and a hint (`{path, reason, hint}`) and a
    `warning:` line in the log naming it (`warn=False`: no log line, for a rescan); a file
    younger than `min_age_s` is skipped silently. Files that name the same step of a run (the
    shards or ranks of one checkpoint, or a duplicate) are all skipped with a warning: storing
    one of them as the step would store part of it.
    """
    inbox = storage.resolve(inbox_uri)
    now = now or datetime.now(UTC)
    ready, skipped, by_step = [], [], {}

    def skip(relative: str, problem: str, hint: str) -> None:
        skipped.append({"path": relative, "reason": problem, "hint": hint})
        if warn:
            log.warning("warning: inbox file %s skipped: %s; hint: %s", inbox.uri_of(inbox.join(relative)),
                        problem, hint)

    for info in storage.list_files(inbox.child(run) if run else inbox):
        relative = inbox.relative(info.path)
        parsed, problem, hint = _parse(relative)
        if parsed is None:
            skip(relative, problem, hint)
            continue
        by_step.setdefault(parsed, []).append(relative)
        age = (now - info.mtime.astimezone(UTC)).total_seconds() if info.mtime else min_age_s
        if age < min_age_s:
            skipped.append({"path": relative, "reason": f"younger than {min_age_s:g} s (may still be written)"})
            continue
        ready.append({"path": relative, "run": parsed[0], "step": parsed[1], "size": info.size})
    shared = {key: paths for key, paths in by_step.items() if len(paths) > 1}
    for item in [item for item in ready if (item["run"], item["step"]) in shared]:
        ready.remove(item)
        names = ", ".join(path.rsplit("/", 1)[-1] for path in shared[item["run"], item["step"]])
        skip(item["path"], f"{len(shared[item['run'], item['step']])} files name step {item['step']} of run "
             f"{item['run']} ({names}): parts of one checkpoint, or duplicates; none is taken", _SAME_STEP_HINT)
    ready.sort(key=lambda item: (item["run"], item["step"]))
    return {"inbox": inbox.uri, "ready": ready, "skipped": skipped}


def _local_copy(inbox, relative: str) -> tuple[str, bool]:
    """A local path of the inbox file (downloaded to a temp file from S3); (path, is_temporary)."""
    if not inbox.is_s3:
        return inbox.join(relative), False
    suffix = "." + relative.rsplit(".", 1)[-1]
    handle, temp = tempfile.mkstemp(prefix=".seedance-inbox-", suffix=suffix)
    with os.fdopen(handle, "wb") as out:
        out.write(storage.read_bytes(inbox.fs, inbox.join(relative)))
    return temp, True


def journal_prefix(relative: str) -> str:
    """The id prefix of the ingest journals of one inbox file (every attempt at it shares it)."""
    return f"ingest-{hashlib.sha256(relative.encode()).hexdigest()[:16]}-"


def _recover(inbox, store, prefix: str) -> list[dict]:
    """Finish or undo the earlier attempts at one file: their uncommitted data files go first."""
    from seedance_tasks.checkpoint.store import check_run_name, discard_attempt

    for entry in journal.pending(inbox, KIND, prefix):
        meta = entry.meta
        if entry.state == journal.WRITING and isinstance(meta.get("attempt"), str) and isinstance(meta.get("step"), int):
            discard_attempt(store, check_run_name(str(meta.get("run"))), meta["step"], meta["attempt"])
    return journal.recover(inbox, KIND, prefix)


def ingest_one(item: dict, inbox_uri: str, store_uri: str, settings=None, *, run_id: str | None = None,
               holder: str | None = None, codec: str | None = None, keyframe_every: int | None = None,
               lossy: str | None = None) -> dict:
    """Compress one inbox file into the store, verify it, then retire the raw file; a small summary.

    Ready files of the same run with lower steps are stored first (whichever mapped task runs
    first), so that deltas always go forward in step order; each task verifies and retires only
    its own file. Status: `stored` (stored from this file, by this task, a sibling or an earlier
    attempt), `already stored` (the same content was stored before from elsewhere),
    `quarantined` (unreadable or unsafe file; reason given), `conflict` (the step is stored with
    other content; the raw file is left in place for a person to look at). Holds the lease
    `run-<run>` of the store as `holder` (default: the run id); run again with the same item
    after a crash, it finishes what the crashed attempt left.
    """
    from seedance_tasks.checkpoint.store import StepCommittedError, check_run_name, manifest_path

    if settings is None:
        from seedance_tasks.checkpoint import _settings

        settings = _settings()
    inbox = storage.resolve(inbox_uri)
    store = storage.resolve(store_uri)
    run_id = run_id or storage.new_run_id()
    relative = storage.confine(item["path"], what="ingest item path")
    run, step = check_run_name(str(item["run"])), int(item["step"])
    options = {"settings": settings, "codec": codec, "keyframe_every": keyframe_every, "lossy": lossy}
    prefix = journal_prefix(relative)
    with lease.holding(store, f"run-{run}", holder=holder or run_id, purpose=f"checkpoint ingest of {relative}"):
        recovered = _recover(inbox, store, prefix)
        for earlier in scan(inbox_uri, settings.inbox_min_age, run=run, warn=False)["ready"]:
            if earlier["step"] < step and not storage.is_file(store.fs, manifest_path(store, run, earlier["step"])):
                try:
                    _store(inbox, store_uri, earlier, options)
                except (RefusedError, InputError):
                    pass  # that file's own task quarantines it (or a sibling stored it meanwhile)
        result: dict[str, Any] = {"path": relative, "run": run, "step": step, "recovered": recovered}
        if not storage.is_file(inbox.fs, inbox.join(relative)):
            return _retired_before(inbox, store_uri, result, settings)
        attempt = secrets.token_hex(6)
        entry = journal.Journal.begin(inbox, f"{prefix}a{attempt}", KIND, [], [relative],
                                      meta={"store": store.uri, "run": run, "step": step, "attempt": attempt},
                                      trash_id=run_id)
        try:
            stored = _stored_or_store(inbox, store, store_uri, item, options, attempt, result)
        except (RefusedError, InputError) as exc:
            if isinstance(exc, StepCommittedError):
                raise
            entry.rollback()
            target = storage.quarantine(inbox, relative, run_id, exc.message)
            return {**result, "status": "quarantined", "reason": exc.message, "quarantined_to": inbox.uri_of(target)}
        if stored is None:
            entry.rollback()
            return {**result, "status": "conflict",
                    "reason": f"step {step} of run {run} is already stored with different content"}
        result.update({key: stored[key] for key in ("kind", "base", "raw_bytes", "stored_bytes", "ratio", "lossy")})
        result["verified"] = _verify(store_uri, run, step, settings)
        entry.commit()
    result["retired_to"] = inbox.uri_of(inbox.join(storage.TRASH_DIR, run_id, relative))
    return result


def _verify(store_uri: str, run: str, step: int, settings) -> bool:
    from seedance_tasks.checkpoint.store import verify

    return verify(store_uri, run, step, workers=settings.workers)["ok"]


def _stored_or_store(inbox, store, store_uri, item, options, attempt, result) -> dict | None:
    """Store the item (or find it stored, also by a concurrent save): its summary, None on a conflict."""
    from seedance_tasks.checkpoint.store import (
        StepCommittedError,
        manifest_path,
        read_manifest,
        same_content,
        summary,
    )

    run, step = result["run"], result["step"]
    if not storage.is_file(store.fs, manifest_path(store, run, step)):
        try:
            stored = _store(inbox, store_uri, item, options, attempt)
            result["status"] = "stored"
            return stored
        except StepCommittedError:
            pass  # a concurrent save committed it first: compare with what it stored
    manifest = read_manifest(store, run, step)
    if not same_content(_read(inbox, result["path"]), manifest):
        return None
    source = inbox.uri_of(inbox.join(result["path"]))
    result["status"] = "stored" if manifest.get("source", {}).get("file") == source else "already stored"
    return summary(manifest, store.uri)


def _retired_before(inbox, store_uri: str, result: dict, settings) -> dict:
    """The raw file is gone: an earlier attempt stored, verified and retired it (else an error)."""
    from seedance_tasks.checkpoint.store import committed_steps, read_manifest, summary

    store = storage.resolve(store_uri)
    source = inbox.uri_of(inbox.join(result["path"]))
    if result["step"] in committed_steps(store, result["run"]):
        manifest = read_manifest(store, result["run"], result["step"])
        if manifest.get("source", {}).get("file") == source:
            stored = summary(manifest, store.uri)
            result.update({key: stored[key] for key in ("kind", "base", "raw_bytes", "stored_bytes", "ratio", "lossy")})
            return {**result, "status": "stored", "verified": _verify(store_uri, result["run"], result["step"], settings),
                    "retired_to": None}
    raise InputError(f"inbox file {source} is gone and its step is not stored from it",
                     hint="it was moved away since the scan; scan the inbox again")


def _read(inbox, relative: str):
    """The state of an inbox file; InputError (it is quarantined) for one that cannot be stored."""
    from seedance_tasks.checkpoint.files import read_checkpoint

    local, temporary = _local_copy(inbox, relative)
    try:
        return read_checkpoint(local)
    except UsageError as exc:  # a value no checkpoint holds (a meta or sparse tensor...): the file's fault
        raise InputError(exc.message.replace(local, inbox.uri_of(inbox.join(relative))), hint=exc.hint) from None
    finally:
        if temporary:
            os.unlink(local)


def _store(inbox, store_uri: str, item: dict, options: dict, attempt: str | None = None) -> dict:
    """Read one inbox file safely and save it as its run/step; the save summary."""
    from seedance_tasks.checkpoint.store import save_state

    state = _read(inbox, item["path"])
    source = {"file": inbox.uri_of(inbox.join(item["path"])), "size": item.get("size")}
    return save_state(state, store_uri, item["run"], int(item["step"]), source=source, attempt=attempt, **options)


def report(results: list[dict]) -> dict:
    """One summary over the ingested files: counts by status, bytes in and stored, overall ratio."""
    stored = [r for r in results if r.get("status") == "stored"]
    raw = sum(r.get("raw_bytes", 0) for r in stored)
    kept = sum(r.get("stored_bytes", 0) for r in stored)
    by_status: dict[str, int] = {}
    for item in results:
        by_status[item.get("status", "?")] = by_status.get(item.get("status", "?"), 0) + 1
    return {
        "files": len(results),
        "by_status": by_status,
        "raw_bytes": raw,
        "stored_bytes": kept,
        "ratio": round(raw / kept, 4) if kept else None,
        "runs": sorted({r["run"] for r in results}),
        "problems": [
            {"path": r["path"], "status": r["status"], "reason": r.get("reason")}
            for r in results if r.get("status") in ("quarantined", "conflict")
        ],
    }
