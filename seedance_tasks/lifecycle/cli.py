"""`seedance ckpt gc | tier | thaw | tag`: lifecycle commands, added to the `ckpt` group."""

import typer


def register(ckpt_app: typer.Typer) -> None:
    """Add the lifecycle commands to the `seedance ckpt` group."""
