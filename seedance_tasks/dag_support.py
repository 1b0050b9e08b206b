"""What every Seedance DAG file shares. Cheap to import: DAG files are parsed all the time."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_ARGS = {
    "owner": "seedance",
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
    "retry_exponential_backoff": True,
}


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
    retry. The traceback stays in the task log (logged here, and chained to the failure).
    Use as `@fail_fast` or `@fail_fast(retry_on=(RuntimeError,))`.
    """
    if func is None:
        return functools.partial(fail_fast, retry_on=retry_on)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            from seedance_tasks.boundary import classify

            error = classify(exc)
            if error.retryable or isinstance(exc, retry_on):
                raise
            import logging

            from airflow.sdk.exceptions import AirflowFailException

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
