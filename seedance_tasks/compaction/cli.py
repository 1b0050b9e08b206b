"""`seedance compact`: compaction from the command line."""

import typer


def compact(uri: str = typer.Argument(...)) -> None:
    """Compact small Parquet files."""
