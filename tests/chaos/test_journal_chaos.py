"""Kill -9 (or a transient storage error) at every fault point of a journaled task, then retry.

Local disk and S3 (moto_server) go through the same code. After the killed attempt and one
retry with the same inputs, the data is exactly what one clean run gives: every file replaced
once, nothing lost, nothing duplicated, the old versions in the trash.
"""

from __future__ import annotations

import pytest

from seedance_tasks import faults, storage
from tests.chaos.harness import call_in_process, points_hit, run_task

TARGET = "tests.chaos.tasks:replace_files"
ORIGINAL = {f"data/part-{i}.txt": f"rows of part {i}\n" for i in range(3)}
EXPECTED = {name.removesuffix(".txt") + ".TXT": text.upper() for name, text in ORIGINAL.items()}


def _fresh(uri: str) -> None:
    root = storage.resolve(uri)
    for name, text in ORIGINAL.items():
        storage.write_bytes_atomic(root.fs, root.join(name), text.encode())


def _visible(uri: str) -> dict[str, str]:
    root = storage.resolve(uri)
    return {root.relative(info.path): storage.read_bytes(root.fs, info.path).decode()
            for info in storage.list_files(root)}


@pytest.fixture(params=["local", "s3"])
def base_uri(request, tmp_path):
    if request.param == "local":
        return str(tmp_path)
    return f"s3://{request.getfixturevalue('s3_bucket')}"


def _chosen(points: list[str], uri: str) -> list[int]:
    """Every point on local disk; on S3 (same code, each request a round trip) every point kind once."""
    if not uri.startswith("s3://"):
        return list(range(1, len(points) + 1))
    first_of_kind: dict[str, int] = {}
    for index, name in enumerate(points, start=1):
        first_of_kind.setdefault(name, index)
    return sorted(set(first_of_kind.values()) | {len(points)})


def _kwargs(uri: str) -> dict:
    return {"root_uri": uri, "run_id": "run1", "holder": "h"}


@pytest.mark.parametrize("mode", ["kill", "raise"])
def test_every_point_faulted_then_retried_gives_the_clean_result(base_uri, mode):
    clean = f"{base_uri}/clean"
    _fresh(clean)
    points = points_hit(TARGET, _kwargs(clean))
    assert _visible(clean) == EXPECTED
    assert len(points) >= 10, points
    for index in _chosen(points, base_uri):
        uri = f"{base_uri}/case-{mode}-{index}"
        _fresh(uri)
        if mode == "kill":  # a real kill -9 of a fresh process, as a dead worker
            assert run_task(TARGET, _kwargs(uri), fault_at=index).returncode == -9, points[index - 1]
        else:
            with pytest.raises(faults.InjectedFault):
                call_in_process(TARGET, _kwargs(uri), fault_at=index)
        retry = call_in_process(TARGET, _kwargs(uri))  # Airflow's retry: same inputs
        assert _visible(uri) == EXPECTED, f"after a fault at point {index} ({points[index - 1]})"
        again = call_in_process(TARGET, _kwargs(uri))  # the next run finds the work done
        assert again["done_by"] == retry["done_by"]
        assert _visible(uri) == EXPECTED
