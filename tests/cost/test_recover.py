"""A month's outputs: byte-identical re-runs, atomic replacement with the old output in the
trash, recovery of an interrupted publish, the report, and the `seedance cost recover` command."""

from __future__ import annotations

import json
from decimal import Decimal

from typer.testing import CliRunner

from seedance_tasks import journal, lease, storage
from seedance_tasks.cli import app
from seedance_tasks.cost import recover
from seedance_tasks.cost.recover import recover_month
from tests.cost.helpers import SAMPLE, line, write_focus, write_owners

OWNERS_FILE = SAMPLE.parents[3].parent / "config" / "owners.yaml"


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_rerun_is_byte_identical_and_replaces_the_month_atomically(tmp_path):
    billing = write_focus(tmp_path / "b.csv", [
        line("2024-09-01 00:00:00", "1.10", tags={"owner": "a"}),
        line("2024-09-02 00:00:00", "2.20", tags={"owner": "b"}),
        line("2024-09-03 00:00:00", "-0.30"),
    ])
    owners = write_owners(tmp_path / "owners.yaml")
    out = tmp_path / "out"
    recover_month(month="2024-09", billing=str(billing), owners=str(owners), out=str(out))
    first = _files(out / "month=2024-09")
    assert set(first) == {"allocations.parquet", "report.html", "summary.json", "statements/owner=a.csv",
                          "statements/owner=b.csv", "statements/unallocated.csv"}
    recover_month(month="2024-09", billing=str(billing), owners=str(owners), out=str(out))
    assert _files(out / "month=2024-09") == first

    # tags change: owner b's line is re-tagged to a; b's statement retires to the trash
    write_focus(billing, [
        line("2024-09-01 00:00:00", "1.10", tags={"owner": "a"}),
        line("2024-09-02 00:00:00", "2.20", tags={"owner": "a"}),
        line("2024-09-03 00:00:00", "-0.30"),
    ])
    result = recover_month(month="2024-09", billing=str(billing), owners=str(owners), out=str(out))
    assert result["report"]["retired"] == ["month=2024-09/statements/owner=b.csv"]
    assert result["summary"]["currencies"]["USD"]["by_owner"] == {"a": "3.3"}
    trash = out / "_seedance" / "trash" / result["report"]["run_id"] / "month=2024-09"
    assert (trash / "statements" / "owner=b.csv").read_bytes() == first["statements/owner=b.csv"]
    assert (trash / "summary.json").read_bytes() == first["summary.json"]  # the replaced version is kept
    assert not list((out / "_seedance" / "journal").glob("*.json"))  # every journal closed
    assert not (out / "_seedance" / "cost-work" / "month=2024-09").exists() or not any(
        p.is_file() for p in (out / "_seedance" / "cost-work").rglob("*"))


def _staged_month(tmp_path):
    """A month run through every stage but the report (nothing published yet): (job, out)."""
    billing = write_focus(tmp_path / "b.csv", [line("2024-09-01 00:00:00", "5", tags={"owner": "a"})])
    owners = write_owners(tmp_path / "owners.yaml")
    out = tmp_path / "out"
    job = recover.prepare(month="2024-09", billing=str(billing), owners=str(owners), out=str(out))
    for stage in ("ingest", "allocate", "rules", "statements", "check"):
        recover.run_stage(stage, job, release=True)
    return job, out


def test_an_interrupted_publish_is_rolled_forward_by_the_next_run(tmp_path):
    job, out = _staged_month(tmp_path)
    root = storage.resolve(str(out))
    staged = f"{recover._job(job).work}/out/summary.json"
    entry = journal.Journal.begin(root, storage.new_run_id(), recover.journal_kind("2024-09"),
                                  [{"staged": staged, "final": "month=2024-09/summary.json"}], [])
    entry.state = journal.PUBLISHING
    entry._save()  # killed right after the point of no return
    assert not (out / "month=2024-09" / "summary.json").exists()
    recover.prepare(month="2024-09", billing=job["billing"], owners=job["owners"], out=str(out))  # next run recovers
    summary = json.loads((out / "month=2024-09" / "summary.json").read_text())
    assert summary["currencies"]["USD"]["by_owner"] == {"a": "5"}


def test_report_has_the_four_charts(tmp_path):
    out = tmp_path / "out"
    for month in ("2024-08", "2024-09"):
        recover_month(month=month, billing=str(SAMPLE), owners=str(OWNERS_FILE), out=str(out), basis="BilledCost")
    html = (out / "month=2024-09" / "report.html").read_text()
    for title in ("Cost by owner (USD)", "Unallocated by month (USD)", "Cost by service (USD, top 15)",
                  "Top idle resources"):
        assert title in html
    assert html.count("<svg") >= 3 and ">2024-08<" in html  # the trend reads earlier months


def test_cli_recover_json_and_errors(tmp_path):
    runner = CliRunner()
    out = tmp_path / "out"
    result = runner.invoke(app, ["cost", "recover", "--month", "2024-09", "--billing", str(SAMPLE),
                                 "--owners", str(OWNERS_FILE), "--out", str(out), "--basis", "BilledCost", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    usd = data["summary"]["currencies"]["USD"]
    assert sum(map(Decimal, usd["by_owner"].values())) + Decimal(usd["unallocated"]) == Decimal(usd["total"])
    assert data["summary"]["month"] == "2024-09" and data["summary"]["basis"] == "BilledCost"
    assert usd["by_owner"]["PlatformTeam"]  # a CMDB rule of config/owners.yaml
    bad = runner.invoke(app, ["cost", "recover", "--month", "2024-13", "--billing", str(SAMPLE),
                              "--owners", str(OWNERS_FILE), "--out", str(out)])
    assert bad.exit_code == 2 and "not a month" in bad.output
    (tmp_path / "owners.yaml").write_text("owner_tag: [owner]\n")
    bad = runner.invoke(app, ["cost", "recover", "--month", "2024-09", "--billing", str(SAMPLE),
                              "--owners", str(tmp_path / "owners.yaml"), "--out", str(out)])
    assert bad.exit_code == 2 and "owner_tag" in bad.output


def test_a_retried_report_task_never_retires_the_published_month(tmp_path):
    job, out = _staged_month(tmp_path)
    assert recover.run_stage("report", job)["published"]
    before = _files(out / "month=2024-09")
    again = recover.run_stage("report", job)  # Airflow retries the task after it had published
    assert again["published"] == [] and again["retired"] == []
    assert _files(out / "month=2024-09") == before


def test_owner_names_that_collide_as_file_names_get_their_own_statements(tmp_path):
    billing = write_focus(tmp_path / "b.csv", [line("2024-09-01 00:00:00", "1", tags={"owner": "data eng"}),
                                               line("2024-09-02 00:00:00", "2", tags={"owner": "data/eng"})])
    owners = write_owners(tmp_path / "owners.yaml")
    recover_month(month="2024-09", billing=str(billing), owners=str(owners), out=str(tmp_path / "out"))
    statements = sorted((tmp_path / "out" / "month=2024-09" / "statements").iterdir())
    assert len(statements) == 2
    assert {row.split(",")[1] for path in statements for row in path.read_text().splitlines()[1:]} == {
        "data eng", "data/eng"}


def test_a_second_run_of_a_month_is_refused_naming_the_holder_or_waits(tmp_path, request):
    """Local disk and S3 (moto_server) through the same code: the month's lease decides."""
    for out in (str(tmp_path / "out"), None):
        if out is None:
            bucket = request.getfixturevalue("s3_bucket")
            out = f"s3://{bucket}/chargeback"
        billing = write_focus(tmp_path / "b.csv", [line("2024-09-01 00:00:00", "5", tags={"owner": "a"})])
        owners = write_owners(tmp_path / "owners.yaml")
        root = storage.resolve(out)
        held = lease.acquire(root, recover.lease_name("2024-09"), holder="airflow:seedance_cost_recovery:nightly",
                             purpose="cost recovery 2024-09", detached=True)
        args = ["cost", "recover", "--month", "2024-09", "--billing", str(billing), "--owners", str(owners),
                "--out", out]
        for extra in ([], ["--wait", "1s"]):
            refused = CliRunner().invoke(app, args + extra)
            assert refused.exit_code == 5, refused.output
            assert "held by airflow:seedance_cost_recovery:nightly" in refused.output and "since" in refused.output
            assert "hint:" in refused.output and "Traceback" not in refused.output
        assert not storage.list_files(root.child("month=2024-09"))  # the refused runs wrote nothing
        held.release()
        done = CliRunner().invoke(app, args + ["--json"])
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout)["summary"]["currencies"]["USD"]["by_owner"] == {"a": "5"}
        assert lease.current(root, recover.lease_name("2024-09")) is None  # released at the end
