"""What every `seedance` subcommand shares: JSON or human output, errors that say what to do,
progress bars on long work. Subcommand modules stay light at import time (heavy libraries are
imported inside the command functions) so `seedance --help` is instant."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from seedance_tasks.errors import SeedanceError

F = TypeVar("F", bound=Callable[..., Any])

console = Console(stderr=False)
err_console = Console(stderr=True)

JSON_OPTION = typer.Option(False, "--json", help="Print one machine-readable JSON document on stdout.")


def handle_errors(func: F) -> F:
    """Turn a SeedanceError into a red message with its hint on stderr and the error's exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SeedanceError as exc:
            err_console.print(f"[bold red]error:[/] {exc.message}", highlight=False)
            if exc.hint:
                err_console.print(f"[yellow]hint:[/] {exc.hint}", highlight=False)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def emit(result: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """Print `result` as JSON (stdout, nothing else) or through `render` for people."""
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, sort_keys=False, default=str) + "\n")
    else:
        render(result)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A rich table with right-aligned numbers."""
    out = Table(title=title, title_justify="left")
    materialized = [list(row) for row in rows]
    for index, name in enumerate(columns):
        numeric = bool(materialized) and all(isinstance(row[index], int | float) for row in materialized)
        out.add_column(name, justify="right" if numeric else "left")
    for row in materialized:
        out.add_row(*(f"{cell:,}" if isinstance(cell, int) else str(cell) for cell in row))
    return out


@contextmanager
def progress(description: str, total: float | None, *, enabled: bool = True) -> Iterator[Callable[[float], None]]:
    """A progress bar on stderr; yields `advance(n)`. Silent when disabled (e.g. with --json)."""
    if not enabled or not err_console.is_terminal:
        yield lambda _n=1: None
        return
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task_id = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task_id, n)
