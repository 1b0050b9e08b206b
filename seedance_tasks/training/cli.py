"""`seedance training` subcommands."""

import typer

app = typer.Typer(help="Training launch: plan NCCL settings, launch torchrun, read job health.", no_args_is_help=True)
