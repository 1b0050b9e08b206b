"""`seedance shards` subcommands: build and verify WebDataset shards."""

from __future__ import annotations

import typer

from seedance_tasks.cli_support import JSON_OPTION, console, emit, handle_errors, progress, table

app = typer.Typer(help="WebDataset shards: build and verify.", no_args_is_help=True)


@app.command("build")
@handle_errors
def build_command(
    src: str = typer.Argument(..., help="directory of sample files (KEY.jpg, KEY.cls...) or a Parquet dataset"),
    out: str = typer.Option(..., "--out", help="where the shards go: a local path, file:///path or s3://bucket/prefix"),
    shard_size: str = typer.Option(None, help="bytes per shard, headers included, e.g. 256MiB [config: 256MiB]"),
    max_samples: int = typer.Option(None, min=1, help="samples per shard at most [config: no limit]"),
    prefix: str = typer.Option(None, help="shard names: PREFIX-000000.tar [config: shard]"),
    shuffle: bool = typer.Option(False, "--shuffle", help="shuffle samples (Parquet: by row group, then rows)"),
    seed: int = typer.Option(0, help="seed of --shuffle"),
    check_decode: bool = typer.Option(
        None, "--check-decode/--no-check-decode",
        help="decode every image member (jpg, png, webp...); samples that do not decode are rejected [config: on]",
    ),
    wait: str = typer.Option(None, "--wait", help="if another run is writing OUT, wait up to this long, e.g. 10m"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Pack samples into tar shards of about --shard-size, with a wids-compatible shardindex.json.

    Shards and the index are written hidden and published together once complete, the index
    last. Incomplete, unreadable or undecodable samples and symbolic links are listed (and saved
    in OUT/_seedance/reports/), never dropped silently. Rebuilding the same source with the same
    settings changes nothing; a run killed anywhere is finished or undone by the next one. One
    build at a time per OUT: another is refused naming the holder (or waits, --wait).
    """
    from seedance_tasks.config import load_settings, settings_with
    from seedance_tasks.shards.build import build
    from seedance_tasks.units import parse_duration

    settings = settings_with(load_settings(), "shards", shard_size=shard_size, max_samples=max_samples, prefix=prefix,
                             check_decode=check_decode)
    wait_s = parse_duration(wait) if wait else 0.0
    with progress("building shards", enabled=not as_json) as bar:
        result = build(src, out, settings=settings, shuffle=shuffle, seed=seed, wait_s=wait_s,
                       on_progress=bar.update)
    emit(result, as_json, _render_build)


def _render_build(result: dict) -> None:
    from seedance_tasks.units import format_size

    if result["up_to_date"]:
        console.print(f"{result['out']} is up to date: {result['shards']} shard(s), {result['samples']:,} samples")
        return
    console.print(
        f"wrote {result['shards']} shard(s), {result['samples']:,} samples, {format_size(result['bytes'])} "
        f"to {result['out']} ({result['seconds']} s, {result['mb_per_s']} MB/s); index {result['index']}"
    )
    if result["rejected"]:
        console.print(table(
            f"[red]{len(result['rejected'])} sample(s) rejected[/]", ["key", "source", "reason"],
            [[item["key"] or "-", item["source"], item["reason"]] for item in result["rejected"][:50]],
        ))
        console.print(f"full list: {result.get('report')}")


@app.command("verify")
@handle_errors
def verify_command(
    dst: str = typer.Argument(..., help="shards: a directory (with or without index), an index, a tar, or a brace pattern"),
    no_index: bool = typer.Option(False, "--no-index", help="ignore shardindex.json; check every .tar found"),
    check_decode: bool = typer.Option(
        None, "--check-decode/--no-check-decode",
        help="decode every image member (jpg, png, webp...) as readers will [config: on]",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Check every shard: complete (end-of-archive marker), safe member names, types and sizes,
    images that decode, no duplicate keys, index counts/checksums.

    Exits 0 if all is well, 3 if a tar holds hostile members, 4 for any other problem.
    """
    from seedance_tasks.shards.verify import raise_for_problems, verify

    with progress("verifying shards", enabled=not as_json) as bar:
        report = verify(dst, use_index=not no_index, check_decode=check_decode, on_progress=bar.update)
    emit(report, as_json, _render_verify)
    if as_json:
        _exit_for(report)
    else:
        raise_for_problems(report)


def _exit_for(report: dict) -> None:
    if report["problems"]:
        code = 3 if any(item["kind"] == "refused" for item in report["problems"]) else 4
        raise typer.Exit(code)


def _render_verify(report: dict) -> None:
    from seedance_tasks.units import format_size

    state = "[green]ok[/]" if report["ok"] else f"[red]{len(report['problems'])} problem(s)[/]"
    console.print(
        f"{report['source']}: {report['shards']} shard(s), {report['samples']:,} samples, "
        f"{format_size(report['bytes'])}; index: {report['index'] or 'none'}; {state}"
    )
    if report["problems"]:
        console.print(table(
            "problems", ["shard", "key", "kind", "problem"],
            [[item["shard"], item["key"] or "-", item["kind"], item["problem"]] for item in report["problems"][:100]],
        ))
