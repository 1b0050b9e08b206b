"""Demo: a lake of small Parquet files compacted through the `seedance_compaction` DAG."""

from __future__ import annotations

from pathlib import Path

from seedance_tasks.demo import DemoAirflow, DemoResult
from seedance_tasks.units import format_size


def demo(workspace: Path, airflow: DemoAirflow) -> DemoResult:
    """Generate 96 small files in 8 partitions, compact them to 16 MiB files via Airflow."""
    from seedance_tasks.compaction.sample import make_sample_lake

    lake = workspace / "lake"
    if not lake.exists():
        make_sample_lake(str(lake), partitions=8, files_per_partition=12, rows_per_file=4_000)
    dag_run = airflow.run(
        "seedance_compaction",
        {"uri": str(lake), "target_file_size": "16MiB", "min_age": "0", "purge_older_than": "7d"},
    )
    report = airflow.xcom(dag_run, "report") or {}
    did = (
        f"{report.get('files_before', 0)} small files -> {report.get('files_after', 0)} in "
        f"{report.get('partitions_compacted', 0)} partitions"
        if report.get("partitions_compacted") else "lake already compacted: nothing to do"
    )
    figures = []
    if report.get("partitions_compacted"):
        figures = [
            ("files before -> after", f"{report['files_before']:,} -> {report['files_after']:,}"),
            ("bytes before -> after", f"{format_size(report['bytes_before'])} -> {format_size(report['bytes_after'])}"),
            ("rows (verified)", f"{report['rows']:,}"),
            ("S3 requests saved / month (est.)", f"{report['estimated_monthly_saving']['s3_requests']:,}"),
        ]
    return DemoResult(
        "data compaction", "seedance_compaction", dag_run.state, did, figures,
        outputs=[str(lake), *([report["trash"]] if report.get("trash") else [])],
    )
