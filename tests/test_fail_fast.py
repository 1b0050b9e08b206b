"""Every DAG task goes through `dag_support.fail_fast`, and its classification: fail at once on what a
retry cannot fix, let Airflow retry the transient rest, with the same one-line message as the CLI."""

from __future__ import annotations

import ast
import errno
import importlib
import inspect
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk.exceptions import AirflowFailException

from seedance_tasks import boundary, errors
from seedance_tasks.dag_support import fail_fast
from tests.conftest import REPO

# Task adapter modules: `<pipeline>/airflow_tasks.py`, and `<pipeline>/<part>_airflow.py` for a pipeline
# with a second DAG (cost's actions workflow).
TASK_MODULES = sorted(
    f"seedance_tasks.{path.parent.name}.{path.stem}" for pattern in ("*/airflow_tasks.py", "*/*_airflow.py")
    for path in (REPO / "seedance_tasks").glob(pattern)
)


def _is_adapter(name: str) -> bool:
    return name == "airflow_tasks" or name.endswith("_airflow")


def test_there_are_task_modules_for_every_dag():
    assert len(TASK_MODULES) >= 6  # compaction, preprocess, training, checkpoint, lifecycle, cost


@pytest.mark.parametrize("module_name", TASK_MODULES)
def test_every_task_adapter_is_wrapped_in_fail_fast(module_name):
    module = importlib.import_module(module_name)
    tasks = [name for name, value in vars(module).items()
             if inspect.isfunction(value) and name.endswith("_task") and value.__module__ == module_name]
    assert tasks, f"{module_name} has no *_task adapters"
    unwrapped = [name for name in tasks if not getattr(getattr(module, name), "__seedance_fail_fast__", False)]
    assert unwrapped == [], f"{module_name}: not wrapped in @fail_fast: {unwrapped}"


def _task_functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if isinstance(target, ast.Name) and target.id == "task":
                    yield node


@pytest.mark.parametrize("dag_file", sorted((REPO / "dags").glob("seedance_*.py")), ids=lambda p: p.stem)
def test_dag_tasks_reach_the_library_only_through_fail_fast_adapters(dag_file):
    """A task body may import adapter modules (`airflow_tasks`, `*_airflow`: wrapped adapters) and cheap `storage` helpers, nothing
    else of seedance_tasks: that would bypass the boundary (the cost DAG used to call its stages raw)."""
    bypass = []
    for func in _task_functions(ast.parse(dag_file.read_text())):
        for node in ast.walk(func):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("seedance_tasks"):
                names = {alias.name for alias in node.names}
                if node.module != "seedance_tasks.dag_support" and not all(
                        _is_adapter(name) or name == "storage" for name in names):
                    bypass.append(f"{func.name}: from {node.module} import {', '.join(sorted(names))}")
    assert bypass == []


# ------------------------------------------------------------------------- classification


def _run(exc: BaseException, **kwargs):
    @fail_fast(**kwargs)
    def body():
        raise exc

    return body


def test_a_non_retryable_seedance_error_fails_at_once_with_its_hint():
    with pytest.raises(AirflowFailException) as info:
        _run(errors.InputError("row 7 of bill.csv: bad cost 'x'", hint="fix the row"))()
    assert str(info.value) == "error: row 7 of bill.csv: bad cost 'x'\n  hint: fix the row"
    assert isinstance(info.value.__cause__, errors.InputError)  # the traceback stays in the task log


def test_a_retryable_seedance_error_is_left_to_airflow():
    with pytest.raises(errors.IntegrityError):
        _run(errors.IntegrityError("half-written manifest"))()


def test_an_unreachable_endpoint_is_retried():
    with pytest.raises(ConnectionRefusedError) as refused:  # nothing listens on a port just freed
        socket.create_connection(("127.0.0.1", _closed_port()), timeout=2)
    assert boundary.classify(refused.value).retryable
    with pytest.raises(ConnectionRefusedError):
        _run(refused.value)()


def test_a_bug_fails_at_once_with_the_cli_message():
    with pytest.raises(AirflowFailException) as info:
        _run(ZeroDivisionError("division by zero"))()
    assert str(info.value).startswith("error: unexpected ZeroDivisionError: division by zero")
    assert boundary.BUG_HINT in str(info.value)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_retry_on_keeps_a_type_retryable():
    with pytest.raises(RuntimeError):
        _run(RuntimeError("training job failed"), retry_on=(RuntimeError,))()


def test_bad_data_from_arrow_is_not_retried(tmp_path):
    path = tmp_path / "part-0.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(pa.ArrowInvalid) as raised:
        pq.read_table(path)
    error = boundary.classify(raised.value)
    assert isinstance(error, errors.InputError) and not error.retryable
    assert "ArrowInvalid" in error.message and error.hint


@pytest.mark.parametrize(("exc", "kind", "words", "retryable"), [
    (OSError(errno.ENOSPC, "No space left on device", "/lake/_x.parquet"), errors.ResourceError,
     "no space left on the device: /lake/_x.parquet", False),
    (OSError(errno.ENAMETOOLONG, "File name too long", "/lake/" + "a" * 300), errors.ResourceError,
     "file name too long", False),
    (PermissionError(errno.EACCES, "Permission denied", "/lake/p"), errors.ResourceError,
     "permission denied: /lake/p", False),
    (KeyError("Tags"), errors.InputError, "missing key or column 'Tags'", False),
    (MemoryError(), errors.ResourceError, "out of memory", False),
    (TimeoutError("timed out"), errors.UnavailableError, "timed out", True),
    (OSError("When getting information for key 'x' in bucket 'b': AWS Error NETWORK_CONNECTION during HeadObject "
             "operation: curlCode: 7, Could not connect to server"), errors.UnavailableError,
     "Could not connect to server (curl code 7)", True),
    (OSError("AWS Error ACCESS_DENIED during HeadObject operation: No response body."), errors.ResourceError,
     "access denied by S3", False),
    (ValueError("bad"), errors.InternalError, "unexpected ValueError: bad", False),
])
def test_classification(exc, kind, words, retryable):
    error = boundary.classify(exc)
    assert type(error) is kind
    assert words in error.message
    assert error.retryable is retryable and error.hint
    assert "\n" not in error.message


def test_exit_codes_are_distinct_and_meaningful():
    codes = {cls.exit_code for cls in (errors.ResourceError, errors.UnavailableError, errors.InternalError)}
    assert codes == {6, 7, 70}
    assert errors.InternalError("x").exit_code == 70


def test_a_real_disk_full_is_classified(tmp_path):
    try:
        with open("/dev/full", "wb") as sink:
            sink.write(b"x" * 65536)
            sink.flush()
    except FileNotFoundError:
        pytest.skip("no /dev/full here")
    except OSError as real:
        assert real.errno == errno.ENOSPC
        assert isinstance(boundary.classify(real), errors.ResourceError)
        with pytest.raises(AirflowFailException, match="no space left"):
            _run(real)()
    else:
        pytest.fail("writing to /dev/full succeeded")


def test_botocore_endpoint_errors_name_the_endpoint(monkeypatch):
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    for exc in (EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b"),
                ConnectTimeoutError(endpoint_url="http://127.0.0.1:9/b")):
        error = boundary.classify(exc)
        assert isinstance(error, errors.UnavailableError) and error.retryable
        assert "http://127.0.0.1:9" in error.message and "check that" in error.hint


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_run_type_of_reads_the_enum_a_task_sees():
    from airflow.sdk.api.datamodels._generated import DagRunType  # what a running task's dag_run carries

    from seedance_tasks.dag_support import run_type_of

    class Run:
        def __init__(self, run_type):
            self.run_type = run_type

    assert str(DagRunType.BACKFILL) != "backfill"  # what a plain str() gave the cost DAG
    assert run_type_of(Run(DagRunType.BACKFILL)) == "backfill"
    assert run_type_of(Run(DagRunType.ASSET_TRIGGERED)) == "asset_triggered"
    assert run_type_of(Run("scheduled")) == "scheduled"
    assert run_type_of(None) == ""


def test_a_lease_held_in_an_airflow_task_says_what_airflow_does_not_a_cli_flag(tmp_path):
    """The CLI's hint offers `--wait`; a task has no such flag: its hint says Airflow retries it."""
    from seedance_tasks import lease, storage

    root = storage.resolve(tmp_path / "lake")
    held = lease.acquire(root, "dataset", holder="airflow:other:run", purpose="compaction", ttl_s=60)
    try:
        with pytest.raises(lease.LeaseHeldError) as cli:
            lease.acquire(root, "dataset", holder="cli-run", purpose="compaction")
        assert "--wait" in cli.value.hint
        with pytest.raises(lease.LeaseHeldError) as task:  # retryable: left to Airflow
            fail_fast(lambda: lease.acquire(root, "dataset", holder="airflow:mine:run", purpose="compaction"))()
        assert "--wait" not in str(task.value) and "Airflow retries this task" in task.value.hint
        assert "60 s after its last heartbeat" in task.value.hint and "airflow:other:run" in task.value.message
    finally:
        held.release()


def test_a_relative_path_in_an_airflow_task_is_refused_naming_the_working_folder(tmp_path, monkeypatch):
    """A form's `lake` would resolve against whichever worker runs the task; outside a task the
    CLI still takes relative paths from the user's own working folder."""
    from seedance_tasks import storage
    from seedance_tasks.dag_support import fail_fast

    monkeypatch.chdir(tmp_path)

    @fail_fast
    def task(uri):
        return storage.resolve(uri).path

    with pytest.raises(AirflowFailException, match="'lake' is a relative path") as info:
        task("lake")
    assert str(tmp_path) in str(info.value) and "absolute path" in str(info.value)
    assert task(str(tmp_path / "lake")) == str(tmp_path / "lake")
    assert task("s3://bucket/lake") == "bucket/lake"
    assert storage.resolve("lake").path == str(tmp_path / "lake")  # the CLI, outside any task


def test_an_asset_event_whose_extra_is_not_an_object_is_left_out_not_a_crash():
    from dataclasses import dataclass
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from seedance_tasks.dag_support import triggering_extras

    @dataclass(frozen=True)
    class Asset:
        name: str

    asset = Asset("seedance_signal_fix")
    events = {asset: [SimpleNamespace(timestamp=datetime(2026, 1, 2, tzinfo=UTC), extra=["not", "an", "object"]),
                      SimpleNamespace(timestamp=datetime(2026, 1, 1, tzinfo=UTC), extra={"lake": "/x"}),
                      SimpleNamespace(timestamp=datetime(2026, 1, 3, tzinfo=UTC), extra=None)]}
    assert triggering_extras(events, ["seedance_signal_fix"]) == [{"lake": "/x"}, {}]
