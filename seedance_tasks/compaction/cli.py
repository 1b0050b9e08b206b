"""`seedance compact`: compaction from the command line."""

from __future__ import annotations

import typer

from seedance_tasks.cli_support import JSON_OPTION, console, emit, escape, handle_errors, progress, table


@handle_errors
def compact(
    uri: str = typer.Argument(..., help="dataset root: a local path, file:///path or s3://bucket/prefix"),
    target_file_size: str = typer.Option(None, help="size of the files written, e.g. 512MiB [config: 512MiB]"),
    small_file_size: str = typer.Option(None, help="compact files smaller than this [default: 75% of target]"),
    min_age: str = typer.Option(None, help="leave files younger than this alone: 0, 30m, 1h, 7d [config: 1h]"),
    workers: int = typer.Option(None, min=1, help="partitions compacted at once [default: one per core]"),
    dry_run: bool = typer.Option(False, "--dry-run", help="plan and report; change nothing"),
    wait: str = typer.Option(None, "--wait", help="if another run holds the lake's lease, wait up to this long: 30s, 10m"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Rewrite each partition's small Parquet files into files of about the target size.

    New files are written hidden, verified, published; only then do the old files move to
    URI/_seedance/trash/<run-id>/ (free them with `seedance trash purge`). Unreadable files go
    to URI/_seedance/quarantine/. An interrupted run is finished by the next one. One run at a
    time per lake: a second one is refused, naming the holder of the lake's lease (or waits, --wait).
    """
    from seedance_tasks.compaction.run import compact_dataset
    from seedance_tasks.config import load_settings, settings_with
    from seedance_tasks.units import parse_duration

    wait_s = parse_duration(wait) if wait else 0.0

    settings = settings_with(
        load_settings(), "compaction", target_file_size=target_file_size,
        small_file_size=small_file_size, min_age=min_age, workers=workers,
    )
    with progress("compacting", enabled=not as_json) as bar:
        report = compact_dataset(uri, settings, dry_run=dry_run, on_progress=bar.update, wait_s=wait_s)
    emit(report, as_json, render_report)


def render_report(report: dict) -> None:
    """The compaction report for people: a headline, a table of partitions, skipped and quarantined."""
    from seedance_tasks.units import format_size

    for item in report["recovered"]:
        console.print(f"[yellow]recovered interrupted run {escape(item['run_id'])}: {escape(item['action'])}[/]")
    verb = "would compact" if report["dry_run"] else "compacted"
    headline = (
        f"{verb} {report['partitions_compacted']} partition(s) of {escape(report['uri'])}: "
        f"{report['files_before']:,} files -> {report['files_after']:,}"
    )
    if report["bytes_before"]:
        headline += f", {format_size(report['bytes_before'])}"
        if report["bytes_after"] is not None:
            headline += f" -> {format_size(report['bytes_after'])}"
    if report["rows"] is not None:
        headline += f", {report['rows']:,} rows"
    console.print(headline)
    if report["partitions"] and not report["dry_run"]:
        console.print(table(
            "partitions",
            ["partition", "files before", "files after", "bytes before", "bytes after", "rows"],
            [[p["partition"], p["files_before"], p["files_after"], format_size(p["bytes_before"]),
              format_size(p["bytes_after"]), p["rows"]] for p in report["partitions"]],
        ))
    elif report["partitions"]:
        console.print(table("partitions to compact", ["partition", "files", "bytes"],
                            [[p["partition"], p["files"], format_size(p["bytes"])] for p in report["partitions"]]))
    for item in report["skipped"]:
        console.print(f"[dim]skipped {escape(item['partition'])}: {escape(item['reason'])}[/]")
    for item in report["quarantined"]:
        console.print(f"[red]quarantined {escape(item['file'])}[/]: {escape(item['reason'])} -> {escape(item['moved_to'])}")
    saving = report["estimated_monthly_saving"]
    console.print(f"estimated saving: {saving['s3_requests']:,} S3 requests/month (${saving['usd']}; {saving['basis']})")
    if report.get("trash"):
        console.print(f"old files kept in {escape(report['trash'])} until `seedance trash purge`")
    if report.get("mb_per_s"):
        console.print(f"[dim]{report['seconds']} s, {report['mb_per_s']} MB/s[/]")
