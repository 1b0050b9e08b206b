"""`seedance shards` subcommands."""

import typer

app = typer.Typer(help="WebDataset shards: build and verify.", no_args_is_help=True)
