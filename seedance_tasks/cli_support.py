"""What every `seedance` subcommand shares: JSON or human output, errors that say what to do,
progress bars on long work. Subcommand modules stay light at import time (heavy libraries are
imported inside the command functions) so `seedance --help` is instant."""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

try:  # the click that typer runs on (typer >= 0.2x carries its own copy)
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - an older typer on the real click
    from click import exceptions as click_errors

from seedance_tasks.boundary import classify, debug_enabled

F = TypeVar("F", bound=Callable[..., Any])

console = Console(stderr=False)
err_console = Console(stderr=True)

JSON_OPTION = typer.Option(False, "--json", help="Print one machine-readable JSON document on stdout.")


def handle_errors(func: F) -> F:
    """Turn any exception into one red `error:` line and a `hint:` on stderr, with a meaningful exit code.

    A SeedanceError keeps its message, hint and exit code; everything else is classified by
    `seedance_tasks.boundary.classify` (disk full, permissions, S3 endpoint down, Arrow data
    errors...; an unexpected bug exits 70). Ctrl-C exits 130. The traceback is printed only with
    `seedance --debug` (or SEEDANCE_DEBUG=1). Every command of the `seedance` app is wrapped.
    """
    if getattr(func, "__seedance_handled__", False):
        return func

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import click

        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.TyperException, click.exceptions.Exit, click.exceptions.ClickException,
                click.exceptions.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/] (Ctrl-C); an interrupted run is finished or rolled "
                              "back by the next one", highlight=False)
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 - the one error boundary of the CLI
            report_error(exc)
            raise typer.Exit(classify(exc).exit_code) from None

    wrapper.__seedance_handled__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def report_error(exc: BaseException) -> None:
    """Print `exc` as `error:`/`hint:` lines on stderr (and its traceback first, with --debug)."""
    error = classify(exc)
    if debug_enabled():
        import traceback

        sys.stderr.write("".join(traceback.format_exception(exc)))
        sys.stderr.flush()
    err_console.print(f"[bold red]error:[/] {escape(error.message)}", highlight=False, soft_wrap=True)
    if error.hint:
        err_console.print(f"[yellow]hint:[/] {escape(error.hint)}", highlight=False, soft_wrap=True)


class SeedanceGroup(TyperGroup):
    """The `seedance` command group: a usage error (unknown command or option, a missing or
    malformed argument), wherever it is found in the command line, is printed like every other
    error, one `error:` line naming the command and a `hint:` pointing at its `--help`, exit code 2."""

    def make_context(self, *args: Any, **kwargs: Any):
        with _usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _usage_errors():
            return super().invoke(ctx)


@contextmanager
def _usage_errors() -> Iterator[None]:
    try:
        yield
    except click_errors.NoArgsIsHelpError:
        raise  # `seedance shards` alone prints its help: not an error
    except click_errors.ClickException as exc:
        command = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "seedance"
        err_console.print(f"[bold red]error:[/] {escape(command)}: {escape(exc.format_message())}",
                          highlight=False, soft_wrap=True)
        err_console.print(f"[yellow]hint:[/] see '{escape(command)} --help' for its arguments and options",
                          highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None


def wrap_commands(app: typer.Typer) -> None:
    """Wrap the callback of every command of `app` and its sub-apps in `handle_errors` (once)."""
    for command in app.registered_commands:
        if command.callback is not None:
            command.callback = handle_errors(command.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            wrap_commands(group.typer_instance)


def emit(result: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """Print `result` as JSON (stdout, nothing else; strict JSON: a NaN or infinite number is null)
    or through `render` for people."""
    if as_json:
        sys.stdout.write(json.dumps(_strict_json(result), indent=2, sort_keys=False, default=str,
                                    allow_nan=False) + "\n")
    else:
        render(result)


def _strict_json(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict_json(item) for item in value]
    return value


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A rich table with right-aligned numbers; cells are shown as they are (a '[' in a file name
    is not console markup). The title may use markup: it is the caller's text."""
    out = Table(title=title, title_justify="left")
    materialized = [list(row) for row in rows]
    for index, name in enumerate(columns):
        numeric = bool(materialized) and all(isinstance(row[index], int | float) for row in materialized)
        out.add_column(name, justify="right" if numeric else "left")
    for row in materialized:
        out.add_row(*(cell if isinstance(cell, Text) else Text(f"{cell:,}" if isinstance(cell, int) else str(cell))
                      for cell in row))
    return out


class _Bar:
    """What `progress` yields: `bar(n)` advances by n; `bar.update(done, total)` (an
    `on_progress(done, total)` callback for library functions) sets the position and the total."""

    def __init__(self, progress=None, task_id=None):
        self._progress, self._task_id = progress, task_id

    def __call__(self, n: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task_id, n)

    def update(self, done: float, total: float | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task_id, completed=done, **({"total": total} if total is not None else {}))


@contextmanager
def progress(description: str, total: float | None = None, *, enabled: bool = True) -> Iterator[_Bar]:
    """A progress bar on stderr with total, percentage and ETA; yields a `_Bar` (`bar(n)` advances,
    `bar.update(done, total)` suits `on_progress` callbacks). Silent when disabled (--json) or
    when stderr is not a terminal."""
    if not enabled or not err_console.is_terminal:
        yield _Bar()
        return
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        yield _Bar(bar, bar.add_task(description, total=total))
