"""`seedance cost` subcommands."""

import typer

app = typer.Typer(help="Cost recovery: monthly chargeback and backfill.", no_args_is_help=True)
