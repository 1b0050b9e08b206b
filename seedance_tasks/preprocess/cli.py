"""`seedance preprocess` subcommands."""

import typer

app = typer.Typer(help="The I/O-pool / CPU-pool preprocessing pipeline.", no_args_is_help=True)
