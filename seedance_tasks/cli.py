"""The `seedance` command: every pipeline's job runs here without Airflow."""

from __future__ import annotations

import os
import sys

import typer

from seedance_tasks.boundary import DEBUG_ENV
from seedance_tasks.checkpoint.cli import app as ckpt_app
from seedance_tasks.cli_support import (
    JSON_OPTION,
    SeedanceGroup,
    console,
    emit,
    handle_errors,
    report_error,
    table,
    wrap_commands,
)
from seedance_tasks.compaction.cli import compact
from seedance_tasks.cost.cli import app as cost_app
from seedance_tasks.lifecycle.cli import register as register_lifecycle_commands
from seedance_tasks.preprocess.cli import app as preprocess_app
from seedance_tasks.shards.cli import app as shards_app
from seedance_tasks.signals.cli import app as signals_app
from seedance_tasks.training.cli import app as train_app

app = typer.Typer(
    name="seedance",
    cls=SeedanceGroup,
    help="Cut the cost of AI training infrastructure: compaction, shards, preprocessing, "
    "training launch, checkpoints, chargeback.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command(name="compact")(compact)


@app.callback()
def options(
    debug: bool = typer.Option(
        False, "--debug", envvar=DEBUG_ENV, help="On an error, print the Python traceback too (or SEEDANCE_DEBUG=1)."
    ),
) -> None:
    """Cut the cost of AI training infrastructure."""
    if debug:
        os.environ[DEBUG_ENV] = "1"


trash_app = typer.Typer(help="The trash area that every destructive step moves old data into.", no_args_is_help=True)


@trash_app.command("purge")
@handle_errors
def trash_purge(
    uri: str = typer.Argument(..., help="dataset or store root whose _seedance/trash to purge"),
    older_than: str = typer.Option("7d", help="purge trash runs older than this (0 empties it)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="report what would be purged, delete nothing"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Free the bytes of trash runs older than --older-than (dated by their run id)."""
    from seedance_tasks import journal, storage
    from seedance_tasks.errors import InputError
    from seedance_tasks.units import format_size, parse_duration

    older_than_s = parse_duration(older_than)
    root = storage.resolve(uri)
    if not storage.exists(root.fs, root.path):  # a mistyped root would "purge 0 runs" and look fine
        raise InputError(f"no such dataset or store: {root.uri} does not exist", hint="check the path; nothing was purged")
    result = journal.purge_trash(root, older_than_s, apply=not dry_run)

    def render(res: dict) -> None:
        verb = "purged" if res["applied"] else "would purge"
        kept = [f"{len(res['kept'])} newer run(s)"]
        if res.get("in_use"):
            kept.append(f"{len(res['in_use'])} of unfinished run(s) (the next run of that job finishes them)")
        if res.get("undated"):
            kept.append(f"{len(res['undated'])} folder(s) not named by a run id ({', '.join(res['undated'][:3])}: "
                        "not Seedance's, never purged; move them away yourself)")
        console.print(
            f"{verb} {len(res['purged'])} trash run(s), {res['files']:,} files, {format_size(res['bytes'])}"
            f" from {res['trash']}; kept {', '.join(kept)}", markup=False
        )
        if res["purged"]:
            console.print(table("trash runs", ["run id"], [[run] for run in res["purged"]]))

    emit(result, as_json, render)


app.add_typer(trash_app, name="trash")
app.add_typer(shards_app, name="shards")
app.add_typer(preprocess_app, name="preprocess")
register_lifecycle_commands(ckpt_app)
app.add_typer(ckpt_app, name="ckpt")
app.add_typer(train_app, name="train")
app.add_typer(cost_app, name="cost")
app.add_typer(signals_app, name="signals")
wrap_commands(app)  # one error boundary for every command, whichever module registered it


def main() -> None:
    """Entry point of the `seedance` console script: no traceback escapes it without --debug."""
    try:
        app(prog_name="seedance")  # also when run as `python -m seedance_tasks.cli`
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - backstop of the boundary, outside any command
        from seedance_tasks.boundary import classify

        report_error(exc)
        sys.exit(classify(exc).exit_code)


if __name__ == "__main__":
    main()
