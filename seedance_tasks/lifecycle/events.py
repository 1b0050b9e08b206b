"""What the asset events that trigger a lifecycle run ask for, read as untrusted input.

An event's extra comes from another DAG, or from anyone who may post an asset event through
Airflow's REST API: every field is checked. A store must be a string naming an absolute path,
`file:///...` or `s3://...` (a relative path would resolve against the worker's working folder);
a run must be one plain path component; `runs` is a list of them (a single string is one run, not
its letters). A fix applies only if its `apply` is the JSON `true`: anything else (`"false"`,
`"no"`, `1`) is a dry run. A malformed event, target or run is left out and reported (`ignored`),
with the key that is wrong; the well-formed ones still run.
"""

from __future__ import annotations

import logging
from typing import Any

from seedance_tasks.checkpoint.catalog import check_run_name, check_store_uri
from seedance_tasks.dag_support import triggering_extras
from seedance_tasks.errors import SeedanceError

log = logging.getLogger(__name__)

STORE_ASSETS = ("seedance_checkpoint_store",)
BLOAT_ASSETS = ("seedance_signal_checkpoint_bloat",)
LIFECYCLE_DAG = "seedance_checkpoint_lifecycle"


class _Ignored(Exception):
    """One part of an event that is left out, and why."""


def _store(value: Any, key: str) -> str:
    try:
        return check_store_uri(value, key)
    except SeedanceError as exc:
        raise _Ignored(exc.message) from None


def _run(value: Any, key: str) -> str | None:
    if value is None or value == "":
        return None
    try:
        return check_run_name(value)
    except SeedanceError:
        raise _Ignored(f"{key} {value!r} is not a run name (one path component, not starting with . or _)") from None


def _runs(extra: dict) -> list[str | None]:
    runs = extra.get("runs")
    if runs in (None, "", []):
        return [_run(extra.get("run"), "run")]
    if isinstance(runs, str):  # one run, not its letters
        return [_run(runs, "runs")]
    if not isinstance(runs, list):
        raise _Ignored(f"runs is a {type(runs).__name__}, not a list of run names")
    named = []
    for index, run in enumerate(runs):
        if not isinstance(run, str) or not run:
            raise _Ignored(f"runs[{index}] {run!r} is not a run name")
        named.append(_run(run, f"runs[{index}]"))
    return named


def _mapping(value: Any, key: str) -> dict:
    if not isinstance(value, dict):
        raise _Ignored(f"{key} is a {type(value).__name__}, not an object")
    return value


def event_targets(events, apply: bool) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The (store, run, apply) items named by the events that triggered a run, in order, and the
    parts of events left out or not obeyed (`{"asset", "event", "reason"}`, each also logged as a
    warning).

    A stored checkpoint (`seedance_checkpoint_store`: the checkpoint and training DAGs) names its
    store and runs, applied as `apply` says; a `checkpoint-bloat` signal names a store, a run and
    whether to apply (only a JSON `true` applies)."""
    items: dict[tuple[str, str | None], bool] = {}
    ignored: list[dict[str, str]] = []

    def leave_out(asset: str, index: int, reason: str) -> None:
        log.warning("warning: %s event %d: %s", asset, index, reason)
        ignored.append({"asset": asset, "event": str(index), "reason": reason})

    for index, extra in enumerate(triggering_extras(events, STORE_ASSETS)):
        try:
            if extra.get("store") in (None, "") and extra.get("checkpoint_store") in (None, ""):
                continue  # an event without a store (a store the run cannot name): config's store
            store = _store(extra.get("store") or extra.get("checkpoint_store"), "store")
            runs = _runs(extra)
        except _Ignored as exc:
            leave_out(STORE_ASSETS[0], index, f"left out: {exc}")
            continue
        for run in runs:
            items[(store, run or None)] = apply
    for index, extra in enumerate(triggering_extras(events, BLOAT_ASSETS)):
        targets = extra.get("targets") or []
        if not isinstance(targets, list):
            leave_out(BLOAT_ASSETS[0], index, f"left out: targets is a {type(targets).__name__}, not a list")
            continue
        for position, target in enumerate(targets):
            try:
                target = _mapping(target, f"targets[{position}]")
                if target.get("dag_id", LIFECYCLE_DAG) != LIFECYCLE_DAG:
                    continue  # a fix for another DAG
                conf = _mapping(target.get("conf") or {}, f"targets[{position}].conf")
                if conf.get("store") in (None, ""):
                    continue
                store = _store(conf["store"], f"targets[{position}].conf.store")
                run = _run(conf.get("run"), f"targets[{position}].conf.run")
            except _Ignored as exc:
                leave_out(BLOAT_ASSETS[0], index, f"left out: {exc}")
                continue
            wanted = conf.get("apply", extra.get("apply", False))
            if not isinstance(wanted, bool):
                leave_out(BLOAT_ASSETS[0], index, f"targets[{position}] apply {wanted!r} is not true or false: "
                          "a dry run of that target")
            items[(store, run)] = wanted is True
    return [{"store": store, "run": run, "apply": value} for (store, run), value in items.items()], ignored
