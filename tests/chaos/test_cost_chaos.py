"""Cost recovery under kill -9 and transient storage errors at every fault point of every stage.

The DAG's tasks are `recover.run_stage(stage, job)` under the month's lease of the DAG run's
holder. Each case starts from the state right before one stage (an earlier version of the month
already published), kills (or fails) the stage at one point, runs it again with the same inputs
(Airflow's retry), finishes the DAG run, then runs the next run of the month (the CLI's
`recover_month`): each time the month's files (statements, summary, report, allocations) are
byte-identical to a clean run's, no journal is left pending, and every file of the old version
is still there or in the trash. Two runs of one month started together: one wins, the other is
refused naming the holder (or waits, then gives the same files).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from seedance_tasks import faults, journal, lease, storage
from seedance_tasks.cost import recover
from tests.chaos.harness import REPO, _environment, call_in_process, points_hit, result_of, run_task
from tests.cost.helpers import line, write_focus, write_owners

MONTH = "2024-09"
HOLDER = "airflow:seedance_cost_recovery:manual__chaos"
STAGE_TASK = "seedance_tasks.cost.recover:run_stage"
RACE_TASK = "tests.chaos.test_cost_chaos:race_run"


@pytest.fixture(scope="module")
def scratch():
    """A scratch directory in memory where the machine has one (these tests fsync a lot)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="seedance-cost-chaos-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _month_files(out: Path) -> dict[str, bytes]:
    folder = out / f"month={MONTH}"
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def world(scratch):
    """Inputs, the clean run's files, and a template of the output root right before each stage."""
    v1 = write_focus(scratch / "v1.csv", [line("2024-09-01 00:00:00", "1", tags={"owner": "a"}),
                                          line("2024-09-02 00:00:00", "2", tags={"owner": "gone"})])
    v2 = write_focus(scratch / "v2.csv", [line("2024-09-01 00:00:00", "1.5", tags={"owner": "a"}),
                                          line("2024-09-02 00:00:00", "2", tags={"owner": "=b"}),
                                          line("2024-09-03 00:00:00", "-0.5")])
    owners = write_owners(scratch / "owners.yaml")
    clean = scratch / "clean"
    recover.recover_month(month=MONTH, billing=str(v1), owners=str(owners), out=str(clean))
    old = _month_files(clean)
    recover.recover_month(month=MONTH, billing=str(v2), owners=str(owners), out=str(clean))
    expected = _month_files(clean)
    assert "statements/owner=gone.csv" in old and "statements/owner=gone.csv" not in expected
    out = scratch / "before"
    recover.recover_month(month=MONTH, billing=str(v1), owners=str(owners), out=str(out))
    templates = {"published": scratch / "template-published"}
    shutil.copytree(out, templates["published"], symlinks=True)
    job = recover.prepare(month=MONTH, billing=str(v2), owners=str(owners), out=str(out), run_key="manual__chaos",
                          holder=HOLDER, release=False)
    for stage in recover.STAGES:
        templates[stage] = scratch / f"template-{stage}"
        shutil.copytree(out, templates[stage], symlinks=True)
        recover.run_stage(stage, job, release=stage == "report")
    assert _month_files(out) == expected  # the DAG's way gives the clean run's files
    return {"v2": v2, "owners": owners, "old": old, "expected": expected, "job": job, "templates": templates,
            "before": out}


def _case(world, stage: str, name: str) -> tuple[Path, dict]:
    """A fresh copy of the output root right before `stage`, and the job pointing at it."""
    case = world["templates"][stage].parent / name
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(world["templates"][stage], case, symlinks=True)
    before = str(world["before"])
    job = {**world["job"], "out": str(case), "state": world["job"]["state"].replace(before, str(case))}
    return case, job


def _finish_and_check(world, stage: str, out: Path, job: dict, label: str) -> None:
    """Airflow's retry of `stage`, the rest of the DAG run, then the next run: the clean run's files each time."""
    recover.run_stage(stage, job, release=stage == "report")
    for later in recover.STAGES[recover.STAGES.index(stage) + 1:]:
        recover.run_stage(later, job, release=later == "report")
    assert _month_files(out) == world["expected"], f"{label}: after the retried DAG run"
    root = storage.resolve(str(out))
    assert lease.current(root, recover.lease_name(MONTH)) is None, f"{label}: the DAG run left its lease"
    recover.recover_month(month=MONTH, billing=str(world["v2"]), owners=str(world["owners"]), out=str(out))
    assert _month_files(out) == world["expected"], f"{label}: after the next run"
    assert journal.pending(root) == [], f"{label}: a journal is left pending"
    kept = {path.read_bytes() for path in out.rglob("*") if path.is_file()}
    lost = [name for name, data in world["old"].items() if data not in kept]
    assert lost == [], f"{label}: files of the old version are neither in place nor in the trash"


@pytest.mark.slow
@pytest.mark.parametrize("stage", recover.STAGES)
def test_a_stage_killed_at_any_point_is_finished_by_its_retry(world, stage):
    case, job = _case(world, stage, f"trace-{stage}")
    count = len(points_hit(STAGE_TASK, {"stage": stage, "data": job}))
    assert count >= 1
    for index in range(1, count + 1):
        case, job = _case(world, stage, f"kill-{stage}")
        killed = run_task(STAGE_TASK, {"stage": stage, "data": job}, fault_at=index)
        assert killed.returncode == -9, (index, killed.stderr[-2000:])
        _finish_and_check(world, stage, case, job, f"{stage}: killed at point {index} of {count}")


@pytest.mark.parametrize("stage", recover.STAGES)
def test_a_transient_storage_error_at_any_point_is_fixed_by_the_retry(world, stage):
    case, job = _case(world, stage, f"trace-raise-{stage}")
    with faults.tracing() as names:
        recover.run_stage(stage, job)
    for index in range(1, len(names) + 1):
        case, job = _case(world, stage, f"raise-{stage}")
        with pytest.raises(faults.InjectedFault):
            call_in_process(STAGE_TASK, {"stage": stage, "data": job, "release": stage == "report"}, fault_at=index)
        _finish_and_check(world, stage, case, job, f"{stage}: error at point {names[index - 1]} ({index})")


def race_run(go: str, run_key: str, wait_s: float, **kwargs) -> dict:
    """A CLI run of the month that starts when the file `go` appears and holds its lease a while
    (a pause after each stage), so that two of them surely overlap."""
    while not os.path.exists(go):
        time.sleep(0.01)
    result = recover.recover_month(run_key=run_key, wait_s=wait_s, advance=lambda _n: time.sleep(0.3), **kwargs)
    return {"holder": result["lease"]["holder"], "lines": result["summary"]["lines"]}


@pytest.mark.slow
@pytest.mark.parametrize("wait_s", [0.0, 60.0])
def test_two_runs_of_one_month_started_together(world, scratch, wait_s):
    out, _ = _case(world, "published", f"race-{int(wait_s)}")
    go = scratch / f"go-{int(wait_s)}"
    kwargs = {"month": MONTH, "billing": str(world["v2"]), "owners": str(world["owners"]), "out": str(out),
              "go": str(go), "wait_s": wait_s}
    processes = [  # started side by side; both wait for `go`
        subprocess.Popen([sys.executable, "-m", "tests.chaos.runner", RACE_TASK, json.dumps({**kwargs, "run_key": name})],
                         cwd=REPO, env=_environment(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("run-one", "run-two")
    ]
    go.touch()
    finished = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=300)
        finished.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    codes = sorted(item.returncode for item in finished)
    if wait_s:  # the second waits for the first, then recovers the month the same way
        assert codes == [0, 0], [item.stderr[-2000:] for item in finished]
    else:
        assert codes == [0, 1], [item.stderr[-2000:] for item in finished]
        winner = next(item for item in finished if item.returncode == 0)
        loser = next(item for item in finished if item.returncode != 0)
        holder = result_of(winner)["holder"]
        assert "LeaseHeldError" in loser.stderr and f"is held by {holder}" in loser.stderr
        assert " since " in loser.stderr
    assert _month_files(out) == world["expected"]  # never a lost or duplicated line
    assert journal.pending(storage.resolve(str(out))) == []



def cli_run(**kwargs) -> dict:
    """What `seedance cost recover` runs (JSON-able for the harness)."""
    result = recover.recover_month(**kwargs)
    return {"holder": result["lease"]["holder"], "lines": result["summary"]["lines"]}


@pytest.mark.parametrize("match", ["journal.publishing", "storage.publish.after", "storage.retire.after"])
def test_a_cli_run_killed_while_publishing_is_taken_over_and_finished_by_the_next(world, match):
    out, _ = _case(world, "published", f"cli-{match}")
    kwargs = {"month": MONTH, "billing": str(world["v2"]), "owners": str(world["owners"]), "out": str(out)}
    killed = run_task("tests.chaos.test_cost_chaos:cli_run", {**kwargs, "run_key": "killed-run"}, fault_at=1,
                      match=match)
    assert killed.returncode == -9, killed.stderr[-2000:]
    root = storage.resolve(str(out))
    stale = lease.current(root, recover.lease_name(MONTH))
    assert stale is not None and stale.holder == "killed-run"  # its process is dead: stale at once
    result = recover.recover_month(run_key="next-run", **kwargs)
    assert result["lease"]["holder"] == "next-run"
    assert [item["action"] for item in result["recovered"]] == ["rolled forward"]
    assert _month_files(out) == world["expected"]
    assert journal.pending(root) == [] and lease.current(root, recover.lease_name(MONTH)) is None
