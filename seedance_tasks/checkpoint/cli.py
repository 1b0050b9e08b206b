"""`seedance ckpt` subcommands: put, get, ls, verify."""

from __future__ import annotations

import typer

from seedance_tasks.cli_support import JSON_OPTION, console, emit, escape, handle_errors, progress, table

app = typer.Typer(help="Checkpoint store: put, get, ls, verify.", no_args_is_help=True)

STORE_OPTION = typer.Option(..., "--store", help="checkpoint store: path, file:///path or s3://bucket/prefix")
RUN_OPTION = typer.Option(..., "--run", help="run name (one path component)")


def _size(num: int) -> str:
    from seedance_tasks.units import format_size

    return format_size(num)


@app.command("put")
@handle_errors
def put(
    src: str = typer.Argument(..., help="raw checkpoint: .pt/.pth/.ckpt (weights only) or .safetensors"),
    store: str = STORE_OPTION,
    run: str = RUN_OPTION,
    step: int = typer.Option(..., "--step", min=0, help="training step of this checkpoint"),
    codec: str = typer.Option("auto", help="auto | zstd | lz4 | bgzstd | delta"),
    keyframe_every: int = typer.Option(None, "--keyframe-every", min=1, help="store every K-th checkpoint full"),
    lossy: str = typer.Option(None, "--lossy", help="bf16: opt-in lossy downcast of float32/64 tensors"),
    metric: list[str] = typer.Option(None, "--metric", help="NAME=VALUE recorded for retention (e.g. val_loss=1.9)"),
    tag: list[str] = typer.Option(None, "--tag", help="a tag recorded in the manifest (e.g. release)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Compress a raw checkpoint into the store (delta against the previous step where it pays)."""
    import os

    from seedance_tasks.errors import UsageError

    metrics = {}
    for item in metric or []:
        key, _, value = item.partition("=")
        try:
            metrics[key.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--metric {item!r} is not NAME=NUMBER", hint="e.g. --metric val_loss=1.93") from None

    from seedance_tasks.checkpoint import _settings
    from seedance_tasks.checkpoint.files import read_checkpoint
    from seedance_tasks.checkpoint.store import save_state

    state = read_checkpoint(src)
    settings = _settings()
    with progress("compressing", os.path.getsize(src), enabled=not as_json) as advance:
        result = save_state(
            state, store, run, step, settings=settings, codec=codec, keyframe_every=keyframe_every,
            lossy=lossy, metrics=metrics, tags=tag or (),
            source={"file": os.path.abspath(src), "size": os.path.getsize(src)}, progress=advance,
        )

    def render(res: dict) -> None:
        base = f" against step {res['base']}" if res["base"] is not None else ""
        console.print(
            f"stored {res['run']}/step-{res['step']} ({res['kind']}{base}): {_size(res['raw_bytes'])} -> "
            f"{_size(res['stored_bytes'])}, {res['ratio']}x, {res['mb_per_s']} MB/s"
            + (f"; lossy {res['lossy']}" if res["lossy"] else ""), markup=False
        )

    emit(result, as_json, render)


@app.command("get")
@handle_errors
def get(
    store: str = STORE_OPTION,
    run: str = RUN_OPTION,
    step: int = typer.Option(None, "--step", min=0, help="step to restore (default: the latest)"),
    out: str = typer.Option(..., "--out", help="output file (.pt or .safetensors)"),
    fmt: str = typer.Option(None, "--format", help="pt | safetensors (default: from --out)"),
    force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Restore a checkpoint bit-exact (every chunk digest-verified) into a .pt or .safetensors file.

    An existing --out file is left alone unless --force: it may be another checkpoint."""
    import time
    from pathlib import Path

    from seedance_tasks.checkpoint import _settings
    from seedance_tasks.checkpoint.catalog import existing_store
    from seedance_tasks.checkpoint.files import write_checkpoint
    from seedance_tasks.checkpoint.store import check_run_name, load_state, read_manifest, resolve_step
    from seedance_tasks.errors import RefusedError

    if Path(out).exists() and not force:
        raise RefusedError(f"{out} exists; not replaced", hint="pass --force to replace it, or choose another --out")
    started = time.perf_counter()
    location = existing_store(store)
    wanted = read_manifest(location, run, resolve_step(location, check_run_name(run), step))
    with progress("restoring", sum(t["nbytes"] for t in wanted["tensors"]), enabled=not as_json) as advance:
        state, manifest = load_state(store, run, step, workers=_settings().workers, progress=advance)
    size = write_checkpoint(state, out, fmt, replace=force)
    result = {
        "run": run, "step": manifest["step"], "out": out, "bytes": size, "kind": manifest["kind"],
        "chain": manifest.get("chain", []), "lossy": manifest.get("lossy"),
        "raw_bytes": manifest["stats"]["raw_bytes"], "seconds": round(time.perf_counter() - started, 3),
    }

    def render(res: dict) -> None:
        chain = f" (read {len(res['chain'])} base checkpoint(s))" if res["chain"] else ""
        console.print(f"restored {run}/step-{res['step']} to {out}: {_size(res['bytes'])}{chain}, verified", markup=False)
        if res["lossy"]:
            console.print(f"[yellow]note:[/] stored lossy ({res['lossy']}): tensors carry {res['lossy']} precision")

    emit(result, as_json, render)


@app.command("ls")
@handle_errors
def ls(
    store: str = STORE_OPTION,
    run: str = typer.Option(None, "--run", help="only this run"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Committed checkpoints: step, kind, base, sizes, ratio, tier, age."""
    from seedance_tasks.checkpoint.catalog import damaged_error
    from seedance_tasks.checkpoint.store import list_checkpoints
    from seedance_tasks.units import format_duration

    damaged: list[dict] = []
    rows = list_checkpoints(store, run, damaged)

    def render(items: list[dict]) -> None:
        console.print(
            table(
                f"checkpoints in {escape(store)}",
                ["run", "step", "kind", "base", "raw", "stored", "ratio", "tier", "age"],
                [
                    [r["run"], r["step"], r["kind"] + (f" ({r['lossy']})" if r["lossy"] else ""),
                     "" if r["base"] is None else str(r["base"]), _size(r["raw_bytes"]), _size(r["stored_bytes"]),
                     f"{r['ratio']}x", r["tier"], format_duration(int(r["age_s"]))]
                    for r in items
                ],
            )
        )

    emit(rows, as_json, render)
    if damaged:  # the others are listed above; the damaged ones fail the command (error + hint)
        raise damaged_error(damaged, "left out of the listing")


@app.command("verify")
@handle_errors
def verify(
    store: str = STORE_OPTION,
    run: str = RUN_OPTION,
    step: int = typer.Option(None, "--step", min=0, help="only this step (default: every step of the run)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Decode every tensor and check every chunk digest; exits non-zero on any damage."""
    from seedance_tasks.checkpoint import _settings
    from seedance_tasks.checkpoint.store import verify_run

    with progress("verifying", enabled=not as_json) as bar:
        result = verify_run(store, run, step, workers=_settings().workers, on_progress=bar.update)

    def render(res: dict) -> None:
        console.print(f"verified {len(res['checked'])} checkpoint(s) of {run}: {len(res['damaged'])} damaged", markup=False)
        for item in res["damaged"]:
            console.print(f"[red]step {item['step']}:[/] {escape(item['error'])}", highlight=False)

    emit(result, as_json, render)
    if result["damaged"]:
        raise typer.Exit(4)
