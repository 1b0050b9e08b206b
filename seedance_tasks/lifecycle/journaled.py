"""What GC and tiering share: journal kinds and ids, the trusted roots, the run's lease, symlink checks.

Both record their intent in a `seedance_tasks.journal.Journal` before touching anything: the
in-store files to retire in `retires` (manifests first) and the files under tier locations in
`external`, which the journal retires only under the roots passed as `external_roots` -- the
store's configured tier locations (`roots`), never a root a journal or manifest names by itself.
Each attempt names its journal `<kind>-<run key>-<token>`; the next attempt of the same run
recovers exactly those (`prefix`), under the run's lease `run-<run>`.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from seedance_tasks import journal as journals
from seedance_tasks import lease, storage
from seedance_tasks.checkpoint import catalog
from seedance_tasks.checkpoint.manifest import trusted_roots
from seedance_tasks.errors import IntegrityError, UsageError
from seedance_tasks.lifecycle.settings import TIERS, LifecycleSettings
from seedance_tasks.storage import Location

GC_KIND = "ckpt-gc"
TIER_KIND = "ckpt-tier"
_PREFIX = {GC_KIND: "gc", TIER_KIND: "tier"}


def roots(store: Location, settings: LifecycleSettings) -> list[str]:
    """The trusted roots of `store`'s data files: the store, the configured archive locations and
    the tier locations of `settings` (the first is the store)."""
    return trusted_roots(store.uri, [settings.tiers.spec(tier).uri for tier in TIERS])


def run_names(store: Location, runs: list[str] | None) -> list[str]:
    """The runs a pass works on: `runs` checked, each once, in the order given; default every run.

    UsageError naming a run the store does not hold (a misspelt --run would do nothing, silently).
    """
    known = catalog.runs(store)
    if not runs:
        return known
    names = list(dict.fromkeys(catalog.check_run_name(run) for run in runs))
    missing = [name for name in names if name not in known]
    if missing:
        listed = ", ".join(known[:20]) + (f" (and {len(known) - 20} more)" if len(known) > 20 else "")
        raise UsageError(f"no run {missing[0]!r} in checkpoint store {store.uri}",
                         hint=f"runs there: {listed or '(none)'}; `seedance ckpt ls --store {store.uri}` lists them")
    return names


def prefix(kind: str, run: str) -> str:
    """The journal id prefix of every attempt of `kind` on `run`."""
    return f"{_PREFIX[kind]}-{hashlib.sha256(run.encode()).hexdigest()[:16]}-"


def new_id(kind: str, run: str) -> str:
    """A journal id of a new attempt (never reused)."""
    return f"{prefix(kind, run)}{storage.new_run_id()}-{secrets.token_hex(4)}"


def finished_earlier(store: Location, kind: str, run: str, holder: str, outcomes: list[dict]) -> list[journals.Journal]:
    """The finished (`done`) journals of `kind` on `run` whose work the calling attempt reports as
    its own, each once: those its recovery just finished (`outcomes` of `recover`: rolled forward
    or closed) and those of earlier attempts of the same `holder` (Airflow's retry of a task that
    did its work and failed before it could return its summary). Unreadable ones are skipped."""
    wanted = {item["run_id"] for item in outcomes
              if item.get("kind") == kind and item.get("action") in ("rolled forward", "closed")}
    found = {}
    start = prefix(kind, run)
    for info in storage.list_files(store.child(journals.DONE_DIR), include_hidden=True):
        name = info.path.rsplit("/", 1)[-1]
        if not (name.startswith(start) and name.endswith(".json")):
            continue
        try:
            entry = journals.load(store, info.path)
        except IntegrityError:
            continue
        if entry.state == journals.DONE and entry.kind == kind and \
                (entry.run_id in wanted or entry.meta.get("holder") == holder):
            found[entry.run_id] = entry
    return [found[key] for key in sorted(found)]


def pending(store: Location, kind: str) -> list[journals.Journal]:
    """Valid journals of `kind` under the store that did not finish."""
    return journals.pending(store, kind)


@contextmanager
def run_lease(store: Location, run: str, holder: str, purpose: str) -> Iterator[lease.Lease]:
    """Hold the lease `run-<run>` of the store (LeaseHeldError naming the holder if another has it)."""
    with lease.holding(store, f"run-{run}", holder=holder, purpose=purpose) as held:
        yield held


