"""`seedance checkpoint` subcommands."""

import typer

app = typer.Typer(help="Checkpoint store: put, get, ls, verify, gc, tier.", no_args_is_help=True)
