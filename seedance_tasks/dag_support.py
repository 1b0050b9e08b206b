"""What every Seedance DAG file shares. Cheap to import: DAG files are parsed all the time."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

from seedance_tasks.units import _DURATION_UNITS, _SIZE_UNITS

F = TypeVar("F", bound=Callable[..., Any])

class FailureCallback:
    """The `on_failure_callback` of every Seedance task: when a task fails for good (after its
    retries), it alerts `notifications.on_failure` (e-mail through the smtp provider's
    SmtpNotifier, a Slack-compatible webhook) with the DAG, run, task, try number, the error's
    first line and the log URL. Config is read only then: parsing costs nothing, and with
    nothing configured a failure sends nothing. Never raises (a failed alert is logged)."""

    def __call__(self, context) -> None:
        from seedance_tasks.airflow_notifiers import FailureNotifier

        FailureNotifier().notify(context)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FailureCallback)

    def __hash__(self) -> int:
        return hash(FailureCallback)

    def __repr__(self) -> str:
        return "seedance_tasks.dag_support.FailureCallback()"


def run_type_of(dag_run) -> str:
    """A DAG run's type as Airflow's lower-case value: `manual`, `scheduled`, `backfill`,
    `asset_triggered` (tasks see an enum whose str() is `DagRunType.BACKFILL`); "" without a run."""
    value = getattr(dag_run, "run_type", None) if dag_run is not None else None
    value = getattr(value, "value", value)
    return str(value or "").split(".")[-1].lower()


def failure_notifiers() -> list[Callable[[Any], None]]:
    """The shared `on_failure_callback` list of Seedance DAGs (in `DEFAULT_ARGS`, so on every task):
    cheap to build, no config read and no provider imported until a task fails."""
    return [FailureCallback()]


DEFAULT_ARGS = {
    "owner": "seedance",
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
    "retry_exponential_backoff": True,
    "on_failure_callback": failure_notifiers(),
}


log = logging.getLogger("seedance_tasks.dag")


def _grammar(units: Iterable[str]) -> str:
    """A JSON-schema pattern of `units.py`'s grammar: a number, a unit from `units` (any case),
    blanks around; or the empty string (an emptied form field: "from config")."""
    def any_case(unit: str) -> str:
        return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in unit)

    alternatives = "|".join(any_case(u) for u in sorted((u for u in units if u), key=lambda u: (-len(u), u)))
    # the empty alternative is a lookahead for the true end: Python's `$` also matches before a final "\n"
    return rf"^(?:\s*\d+(?:\.\d+)?\s*(?:{alternatives})?\s*|(?![\s\S]))$"


SIZE_PATTERN = _grammar(_SIZE_UNITS)
"""Accepts exactly what `units.parse_size` accepts (`512M`, `512mib`, `1.5 GiB`, `1048576`), and ""."""
DURATION_PATTERN = _grammar(_DURATION_UNITS)
"""Accepts exactly what `units.parse_duration` accepts (`0`, `90s`, `30m`, `1h`, `7d`), and ""."""


def from_config(key: str) -> str:
    """The help text's "what empty means" for a setting: `key` from config/seedance.yaml."""
    return f"`{key}` from config/seedance.yaml"


def optional_param(title: str, help_md: str, *, empty: str, section: str | None = None,
                   type: str = "string", **schema: Any):
    """A form field that may stay empty: a nullable Param (`type: ["null", TYPE]`, default None),
    whose help ends with what empty means (`empty`, e.g. `from_config("compaction.min_age")`).

    The UI form refuses a typed field whose value does not validate (`""` for `type: string`
    blocks the Trigger button); None validates here and means "decided by config/the run".
    """
    from airflow.sdk import Param

    if "enum" in schema and None not in schema["enum"]:
        schema["enum"] = [*schema["enum"], None]
    return Param(None, type=["null", type], title=title, description_md=f"{help_md} Empty: {empty}.",
                 **({"section": section} if section else {}), **schema)


def size_param(title: str, help_md: str, *, empty: str, section: str | None = None):
    """An optional size field (`512MiB`, `512M`, `64mb`...), validated in the form with the grammar
    of `units.parse_size`."""
    return optional_param(title, f"{help_md} A size: 512MiB, 512M, 64MB, 1.5GiB.", empty=empty, section=section,
                          pattern=SIZE_PATTERN)


def duration_param(title: str, help_md: str, *, empty: str, section: str | None = None):
    """An optional duration field (`0`, `90s`, `30m`, `1h`, `7d`), validated in the form with the
    grammar of `units.parse_duration`."""
    return optional_param(title, f"{help_md} A duration: 0, 90s, 30m, 1h, 7d.", empty=empty, section=section,
                          pattern=DURATION_PATTERN)


def run_settings(section: str, params: Mapping[str, Any] | None, fields: Mapping[str, str]):
    """The composition step of a DAG run: config section `section` (config file, then the
    SEEDANCE__* environment), then the run's non-empty Params, `fields` mapping param -> key.

    A bad param value fails with ConfigError naming the param (`fail_fast`: not retried).
    """
    from seedance_tasks.config import load_section, section_with

    params = params or {}
    overrides = {key: params.get(name) for name, key in fields.items()}
    return section_with(load_section(section), overrides, "the run's parameters",
                        names={key: f"param {name}" for name, key in fields.items()})


def skip(reason: str, **summary: Any) -> NoReturn:
    """Skip the running task (AirflowSkipException): nothing configured to do is not a failure.

    The reason goes to the task log and to the task's summary (its XCom: `{"skipped": reason, ...}`).
    """
    from airflow.sdk import get_current_context
    from airflow.sdk.exceptions import AirflowSkipException

    log.warning("skipped: %s", reason)
    try:
        get_current_context()["ti"].xcom_push(key="return_value", value={"skipped": reason, **summary})
    except RuntimeError:  # not inside a task (a direct call from a test or the CLI): nothing to push
        pass
    raise AirflowSkipException(reason)


def announce(asset, extra: dict[str, Any], *, reports: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """Attach `extra` (URIs, month, totals, bytes: small and JSON-able) to the event the running
    task emits on `asset`, and log each report it wrote (`report <name>: <uri>`), so the task log
    links to it. (A task cannot set its DAG run's note in Airflow 3.3: the execution API has no
    such call; the log and the event are where the links go.) Returns `extra`."""
    from airflow.sdk import get_current_context

    log_reports(reports or {})
    get_current_context()["outlet_events"][asset].extra = extra
    return extra


def log_reports(reports: Mapping[str, str | None]) -> None:
    """Log each report a task wrote as `report <name>: <uri>` (the task log links to its outputs)."""
    for name, uri in reports.items():
        if uri:
            log.info("report %s: %s", name, uri)


def triggering_extras(events: Mapping | None, names: Iterable[str]) -> list[dict[str, Any]]:
    """The extras of the asset events (of the assets named `names`) that triggered this run,
    oldest first; [] for a scheduled or manual run. `events` is the task context's
    `triggering_asset_events`. An event whose extra is not a JSON object (a hand-made event)
    is logged and left out, never obeyed."""
    wanted = set(names)
    found = []
    for asset in events or {}:
        if getattr(asset, "name", None) in wanted:
            for event in events[asset]:
                if not isinstance(event.extra or {}, Mapping):
                    log.warning("asset event on %s left out: its extra is not a JSON object", asset.name)
                    continue
                found.append((event.timestamp, dict(event.extra or {})))
    return [extra for _, extra in sorted(found, key=lambda item: item[0])]


def tags(*area: str) -> list[str]:
    """The tags of a Seedance DAG: `seedance` plus its area(s)."""
    return ["seedance", *area]


def fail_fast(func: F | None = None, *, retry_on: tuple[type[BaseException], ...] = ()) -> Any:
    """Wrap a task body in the error boundary shared with the CLI (`boundary.classify`).

    A non-retryable error fails the task at once (`AirflowFailException`, no retries): bad input,
    a refused dataset, a wrong setting, disk full, and any unexpected exception (a bug, or bad
    data a retry cannot fix), with the same one-line `message` + `hint` the CLI prints. Retryable
    ones (a SeedanceError with `retryable`, transient storage/network errors: OSError, S3
    endpoint down or frozen, timeouts; and the `retry_on` types) are re-raised for Airflow to
    retry. Inside it a relative local path is refused (`storage.absolute_paths_only`: the
    worker's working folder is nobody's choice). An error with an `airflow_hint` (its hint names a CLI flag) shows that one instead.
    The traceback stays in the task log (logged here, and chained to the failure).
    Use as `@fail_fast` or `@fail_fast(retry_on=(RuntimeError,))`.
    """
    if func is None:
        return functools.partial(fail_fast, retry_on=retry_on)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from seedance_tasks.storage import absolute_paths_only

        try:
            with absolute_paths_only("an Airflow task"):
                return func(*args, **kwargs)
        except Exception as exc:
            from airflow.sdk.exceptions import (
                AirflowFailException,
                AirflowRescheduleException,
                AirflowSkipException,
                DagRunTriggerException,
                DownstreamTasksSkipped,
            )

            if isinstance(exc, (AirflowSkipException, AirflowFailException, AirflowRescheduleException,
                                DagRunTriggerException, DownstreamTasksSkipped)):
                raise  # Airflow's own control flow (skip, fail now, reschedule...), not an error
            from seedance_tasks.boundary import classify

            error = classify(exc)
            if error.airflow_hint:  # the hint that fits a task log (no CLI flag such as --wait there)
                error.hint = error.airflow_hint
            if error.retryable or isinstance(exc, retry_on):
                raise
            logging.getLogger("seedance_tasks.dag").error("task failed (not retried)", exc_info=exc)
            raise AirflowFailException(f"error: {error}") from exc

    wrapper.__seedance_fail_fast__ = True  # type: ignore[attr-defined]
    return wrapper


def mapped_results(results) -> list:
    """The values of a mapped task's results, in map order, as a plain list.

    Indexing Airflow's lazy sequence by position avoids the "XCom not found" error that plain
    iteration logs when it probes one past the end.
    """
    return [results[index] for index in range(len(results))]


def read_xcom(dag_run, task_id: str, key: str = "return_value", map_index: int = -1):
    """The XCom value `task_id` pushed in `dag_run` (read from the metadata DB), or None.

    For code outside tasks (the demo, tests); tasks receive XComs as arguments instead.
    """
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id, task_id=task_id, key=key, map_index=map_index)
            .one_or_none()
        )
        return None if row is None else XComModel.deserialize_value(row)


def airflow_lease_holder() -> str:
    """The lease holder of the running task's DAG run: `airflow:<dag_id>:<run_id>`.

    Every task, map index and retry of one DAG run share it, so a retried task takes back the
    lease its first attempt held, while another DAG run (or the CLI) is refused.
    """
    from airflow.sdk import get_current_context

    context = get_current_context()
    return f"airflow:{context['dag'].dag_id}:{context['run_id']}"


def release_run_lease(uri: str, name: str) -> bool:
    """Release the lease `name` of `uri` if the running task's DAG run still holds it; True if it did.

    For a DAG's teardown task, which runs however the run ended: a run that failed (or whose
    last task never ran) must not keep other runs and the CLI out until its TTL. Another holder's
    lease, a missing one and an unresolvable URI are left alone (False)."""
    from seedance_tasks import lease, storage
    from seedance_tasks.errors import InputError, UsageError

    holder = airflow_lease_holder()
    try:
        root = storage.resolve(uri)
    except (UsageError, InputError):  # the run failed on this URI before it could take a lease
        return False
    record = lease.current(root, name)
    if record is None or record.holder != holder:
        return False
    try:  # taken back (re-entrant for our holder), then released
        lease.acquire(root, name, holder=holder, purpose="release at the end of the DAG run").release()
    except lease.LeaseHeldError:  # taken over by another writer since it went stale: not ours any more
        return False
    log.info("released the lease %s of %s", name, root.uri)
    return True


FINISHED_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


def _run_task_states() -> tuple[str, dict[str, Any]]:
    """(this task instance's key, {key: state} of every task instance of its DAG run), keys as
    Airflow's execution API writes them (`task_id`, or `task_id_<map index>` for a mapped one)."""
    from airflow.sdk import get_current_context

    ti = get_current_context()["ti"]
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id) or {}
    return (ti.task_id if ti.map_index is None or ti.map_index < 0 else f"{ti.task_id}_{ti.map_index}"), states


def last_of_its_run() -> bool:
    """True when every other task instance of the running task's DAG run has finished: this task
    was cleared and rerun on its own (Airflow's "clear" without downstream), so no later task of
    the run (no teardown) will release what it holds. False outside a task."""
    try:
        me, states = _run_task_states()
    except RuntimeError:  # not inside a task (a direct call from a test or the CLI)
        return False
    return all(state in FINISHED_STATES for key, state in states.items() if key != me)


def release_if_last(uri: str, name: str) -> bool:
    """Release the DAG run's lease `name` of `uri` (`release_run_lease`) when the running task is
    the last of its run (`last_of_its_run`); else keep it for the run's next tasks. True if released.

    For a task that keeps its run's lease for the next task (`holding(release=False)`): cleared
    alone, it would otherwise leave the lake locked until the lease's TTL."""
    return last_of_its_run() and release_run_lease(uri, name)
