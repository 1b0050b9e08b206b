"""`seedance preprocess` subcommands: run the I/O-pool / CPU-pool pipeline, tune its pool sizes."""

from __future__ import annotations

import typer

from seedance_tasks.cli_support import (
    JSON_OPTION,
    console,
    emit,
    err_console,
    escape,
    handle_errors,
    progress,
    table,
)

app = typer.Typer(help="The I/O-pool / CPU-pool preprocessing pipeline.", no_args_is_help=True)

SHARDS_HELP = "WebDataset shards: a directory (with or without shardindex.json), an index, a tar or a brace pattern; local or s3://"


@app.command("run")
@handle_errors
def run_command(
    shards: str = typer.Option(..., "--shards", help=SHARDS_HELP),
    out: str = typer.Option(..., "--out", help="where the preprocessed shards go (local path or s3://)"),
    size: int = typer.Option(None, min=8, help="output arrays are uint8 (3, SIZE, SIZE) [config: 224]"),
    io_workers: int = typer.Option(None, min=1, help="I/O threads [default: from a short measurement]"),
    cpu_workers: int = typer.Option(None, min=1, help="CPU worker processes [default: one per core]"),
    parallel: str = typer.Option(None, help="shards (each CPU process does whole local shards), samples (I/O threads "
                                 "feed image batches; any storage) or auto [config: auto]"),
    wait: str = typer.Option(None, "--wait", help="if another run is writing OUT, wait up to this long, e.g. 10m"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Decode, resize and convert every image sample into OUT as KEY.npy shards (plus the other members).

    Every input sample comes out exactly once: in the output, or in the failed list with its
    shard, key and reason. A hostile or unreadable input shard is quarantined (an `error:` line
    naming the shard and the member, a `hint:`, a record in OUT/_seedance/quarantine/preprocess/;
    the shard itself is left where it is) and the other shards are processed and published: exit
    0, as compaction does when it quarantines a file. Only a run whose every shard is quarantined
    fails (exit 3 if one was hostile, else 1), or whose every sample failed (exit 1). Outputs are published only when the run completes.
    Finished shards are skipped on a rerun, and a run killed anywhere is finished or undone by the
    next one. One writer at a time per OUT: another is refused naming the holder (or waits, --wait).
    """
    from seedance_tasks.config import load_settings, settings_with
    from seedance_tasks.preprocess.run import run
    from seedance_tasks.units import parse_duration

    settings = settings_with(load_settings(), "preprocess", size=size, io_workers=io_workers, cpu_workers=cpu_workers,
                             parallel=parallel)
    wait_s = parse_duration(wait) if wait else 0.0
    with progress("preprocessing", enabled=not as_json) as bar:
        result = run(shards, out, settings=settings, wait_s=wait_s, on_progress=bar.update)
    report_quarantined(result["quarantined"])
    emit(result, as_json, _render_run)
    if result.get("samples_in") and not result.get("samples_out"):
        from seedance_tasks.preprocess.run import all_failed_error

        raise all_failed_error(shards, result["samples_in"], result["failed"])


def report_quarantined(quarantined: list[dict]) -> None:
    """One `error:` line (the shard, the member, what is wrong) and one `hint:` on stderr per
    quarantined shard, as every Seedance error is printed (also with --json: stdout stays JSON)."""
    from seedance_tasks.preprocess.run import report_lines

    for item in quarantined:
        error, hint = report_lines(item)
        err_console.print(f"[bold red]error:[/] {escape(error)}", highlight=False, soft_wrap=True)
        err_console.print(f"[yellow]hint:[/] {escape(hint)}", highlight=False, soft_wrap=True)


def _pools(result: dict) -> str:
    """The run's pools in words: whole shards per process, or I/O threads feeding processes."""
    if result.get("parallel") == "shards":
        return f"{result['cpu_workers']} CPU process(es), each doing whole shards"
    return f"{result['io_workers']} I/O thread(s), {result['cpu_workers']} CPU process(es)"


def _render_run(result: dict) -> None:
    if not result["shards"]:
        done = f"all {len(result['skipped'])} shard(s) already preprocessed in {result['out']}"
        if result["quarantined"]:
            done = (f"{len(result['skipped'])} shard(s) already preprocessed in {result['out']}, "
                    f"{len(result['quarantined'])} quarantined")
        console.print(f"nothing to do: {done}", markup=False)
        return
    console.print(
        f"preprocessed {result['samples_in']:,} samples from {result['shards']} shard(s) into {result['out']}: "
        f"{result['samples_out']:,} written, {len(result['failed'])} failed; "
        f"{result['samples_per_s']} samples/s ({_pools(result)})",
        markup=False,
    )
    console.print(table("time per stage", ["stage", "seconds", "share"],
                        [[stage, result["stage_seconds"][stage], f"{share:.0%}"]
                         for stage, share in result["stage_shares"].items()]))
    if result["failed"]:
        console.print(table(f"[red]{len(result['failed'])} sample(s) failed[/]", ["shard", "key", "reason"],
                            [[f["shard"], f["key"], f["reason"]] for f in result["failed"][:50]]))
    if result["skipped"]:
        console.print(f"[dim]skipped {len(result['skipped'])} shard(s) already done[/]")
    if result["quarantined"]:
        console.print(f"[red]quarantined {len(result['quarantined'])} shard(s)[/] (not published; see the errors above): "
                      + escape(", ".join(item["name"] for item in result["quarantined"])))
    console.print(f"[dim]pools: {escape(result['pools_basis'])}; index {escape(str(result.get('index')))}[/]")


@app.command("tune")
@handle_errors
def tune_command(
    shards: str = typer.Option(..., "--shards", help=SHARDS_HELP),
    samples: int = typer.Option(None, min=8, help="samples per trial [config: 256]"),
    size: int = typer.Option(None, min=8, help="output size [config: 224]"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Try a few I/O-thread / CPU-process splits on the first samples and print the table it chose from."""
    from seedance_tasks.config import load_settings, settings_with
    from seedance_tasks.preprocess.tune import tune

    settings = settings_with(load_settings(), "preprocess", size=size)
    result = tune(shards, settings=settings, samples=samples)

    def render(res: dict) -> None:
        best = res["chosen"]
        rows = []
        for row in res["table"]:
            mark = "<- chosen" if (row["io_workers"], row["cpu_workers"]) == (best["io_workers"], best["cpu_workers"]) else ""
            shares = ", ".join(f"{k} {v:.0%}" for k, v in row["stage_shares"].items() if k != "write")
            rows.append([row["io_workers"], row["cpu_workers"], row["samples_per_s"], shares, mark])
        console.print(table(f"pool splits on {res['samples']} samples, {res['cores']} core(s)",
                            ["I/O threads", "CPU processes", "samples/s", "stage shares", ""], rows))
        console.print(res["hint"], markup=False)

    emit(result, as_json, render)
