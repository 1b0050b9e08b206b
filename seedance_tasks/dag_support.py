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


def fail_fast(func: F) -> F:
    """Wrap a task body: a non-retryable SeedanceError fails the task at once, without retries.

    Retrying bad input, a refused dataset or a wrong setting only delays the same error; the
    message (with its hint) is what the user sees in the task log.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from seedance_tasks.errors import SeedanceError

        try:
            return func(*args, **kwargs)
        except SeedanceError as exc:
            if exc.retryable:
                raise
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


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
