"""`seedance ckpt gc | tier | thaw | tag | cost`: lifecycle commands, added to the `ckpt` group."""

from __future__ import annotations

import typer

from seedance_tasks.cli_support import JSON_OPTION, console, emit, escape, handle_errors, progress, table

STORE_OPTION = typer.Option(None, "--store", help="checkpoint store (default: lifecycle.store, else checkpoint.store)")


def _store(store: str | None) -> str:
    from seedance_tasks.config import load_settings
    from seedance_tasks.errors import UsageError

    settings = load_settings()
    chosen = store or settings.lifecycle.store or settings.checkpoint.store
    if not chosen:
        raise UsageError("no checkpoint store given", hint="pass --store, or set lifecycle.store / checkpoint.store")
    return chosen


def _size(num: int) -> str:
    from seedance_tasks.units import format_size

    return format_size(num)


def _fail_if_damaged(result: dict, what: str) -> None:
    """After the report of a pass: its damaged manifests (left alone, `what`) fail the command."""
    from seedance_tasks.checkpoint.catalog import damaged_error

    if result.get("damaged"):
        for item in result["damaged"][1:]:  # the first is in the error line
            console.print(f"[red]damaged:[/] {escape(item['manifest'])}: {escape(item['error'])}", highlight=False)
        raise damaged_error(result["damaged"], what)


def _cost_line(cost: dict) -> str:
    from seedance_tasks.lifecycle.costs import shown

    before, after, saving = cost["before"], cost["after"], cost["saving"]
    return (
        f"monthly storage cost {shown(before['monthly_usd'])} -> {shown(after['monthly_usd'])} "
        f"(saves {shown(saving['monthly_usd'])}/month, {saving['fraction']:.0%}); "
        + ", ".join(f"{tier} {_size(row['bytes'])}" for tier, row in after["tiers"].items())
    )


def gc(
    store: str = STORE_OPTION,
    run: list[str] = typer.Option(None, "--run", help="only this run (repeatable; default: every run)"),
    keep_last: int = typer.Option(None, "--keep-last", help="keep the N latest steps (>= 1)"),
    keep_every: int = typer.Option(None, "--keep-every", help="keep every step that is a multiple of M"),
    keep_best: int = typer.Option(None, "--keep-best", help="keep the K best steps by --metric"),
    metric: str = typer.Option(None, "--metric", help="metric recorded at save time (e.g. val_loss)"),
    higher_is_better: bool = typer.Option(None, "--higher-is-better/--lower-is-better", help="how --metric ranks"),
    apply: bool = typer.Option(False, "--apply", help="delete (to the trash); without it, only report"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Retention GC: drop checkpoints the policy does not keep (dry run unless --apply).

    Keeps the last N, every M-th step, the best K by a metric, every tagged checkpoint, and every
    base a kept delta needs. With --apply the manifests leave first, then the data moves to the
    store's trash; `seedance trash purge STORE` frees the bytes.
    """
    from seedance_tasks.lifecycle.gc import collect

    mode = None if higher_is_better is None else ("max" if higher_is_better else "min")
    with progress("checkpoint gc", enabled=not as_json) as bar:
        result = collect(
            _store(store), run or None, apply=apply, keep_last=keep_last, keep_every=keep_every,
            keep_best=keep_best, metric=metric, metric_mode=mode, on_progress=bar.update,
        )

    def render(res: dict) -> None:
        verb = "deleted" if res["applied"] else "would delete"
        console.print(
            f"{verb} {res['checkpoints_deleted']} checkpoint(s), {_size(res['bytes_freed'])}; "
            f"kept {res['checkpoints_kept']}", markup=False
        )
        rows = [
            [p["run"], item["step"], item["kind"], item["tier"], _size(item["bytes"])]
            for p in res["runs"] for item in p["delete"]
        ]
        if rows:
            console.print(table("to delete" if not res["applied"] else "deleted", ["run", "step", "kind", "tier", "size"], rows))
        earlier = sum(p.get("earlier", {}).get("deleted", 0) for p in res["runs"])
        if earlier:
            console.print(f"of them, {earlier} by an interrupted earlier attempt, finished now", markup=False)
        if res["stray_files"]:
            console.print(f"{'moved' if res['applied'] else 'would move'} {res['stray_files']} file(s) of interrupted "
                          f"saves ({_size(res['stray_bytes'])}, named by no manifest) to the trash")
        kept = [[p["run"], k["step"], ", ".join(k["reasons"])] for p in res["runs"] for k in p["kept"]]
        console.print(table("kept", ["run", "step", "why"], kept))
        for p in res["runs"]:
            if p["left_alone"] and not p["damaged"]:  # damaged manifests: the error line below
                console.print(f"[yellow]warning:[/] run {escape(p['run'])} left alone: {escape(p['left_alone'])} "
                              "(check --metric / lifecycle.retention.metric, or keep_best 0 for this run)")
            for item in p["refused"]:
                console.print(f"[yellow]left alone[/] {escape(p['run'])}/step-{item['step']}: {escape(item['reason'])}")
            for step, lost in p["unrestorable_kept"].items():
                console.print(f"[red]warning:[/] {escape(p['run'])}/step-{step} is kept but its base(s) {lost} are missing")
        console.print(_cost_line(res["cost"]))
        if res["applied"] and (res["checkpoints_deleted"] or res["stray_files"]):
            console.print(f"bytes are freed by: seedance trash purge {res['store']} --older-than 7d", markup=False)
        elif not res["applied"]:
            console.print("dry run: nothing changed (add --apply)")

    emit(result, as_json, render)
    _fail_if_damaged(result, "nothing of their runs was collected")


def tier(
    store: str = STORE_OPTION,
    run: list[str] = typer.Option(None, "--run", help="only this run (repeatable; default: every run)"),
    apply: bool = typer.Option(False, "--apply", help="move the files; without it, only report"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Move checkpoints due to a colder tier (hot -> warm -> cold by age since save / last restore).

    Each file is copied, its sha256 verified, the manifest switched, then the source retired.
    """
    from seedance_tasks.lifecycle.tiering import TieringFailedError
    from seedance_tasks.lifecycle.tiering import tier as run_tiering

    failure = None
    with progress("tiering", enabled=not as_json) as bar:
        try:
            result = run_tiering(_store(store), run or None, apply=apply, on_progress=bar.update)
        except TieringFailedError as exc:  # the report of the runs that went on, then the error
            result, failure = exc.result, exc

    def render(res: dict) -> None:
        verb = "moved" if res["applied"] else "would move"
        console.print(f"{verb} {len(res['moves'])} checkpoint(s), {_size(res['bytes_moved'])}")
        if res["moves"]:
            console.print(table("tiering", ["run", "step", "from", "to", "size"],
                                [[m["run"], m["step"], m["from"], m["to"], _size(m["bytes"])] for m in res["moves"]]))
        for note in res["notes"]:
            console.print(f"[yellow]note:[/] {escape(note)}")
        for item in res["skipped"]:
            console.print(f"[yellow]skipped[/] {escape(item['run'])}/step-{item['step']}: {escape(item['reason'])}")
        for item in res.get("failed", []):
            where = f"/step-{item['step']}" if item["step"] is not None else ""
            console.print(f"[red]failed[/] {escape(item['run'])}{where}: {escape(item['reason'])} "
                          f"({escape(item['recovery'])})")
        console.print(_cost_line(res["cost"]))
        if not res["applied"]:
            console.print("dry run: nothing changed (add --apply)")

    emit(result, as_json, render)
    _fail_if_damaged(result, "nothing of their runs was moved")
    if failure:
        raise failure


def thaw(
    store: str = STORE_OPTION,
    run: str = typer.Option(..., "--run", help="run name"),
    step: int = typer.Option(None, "--step", min=0, help="step to thaw (default: the latest); its chain too"),
    days: int = typer.Option(None, "--days", min=1, help="days the restored copy stays readable"),
    retrieval: str = typer.Option(None, "--retrieval", help="Expedited | Standard | Bulk"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Request the restore of a checkpoint's archived (GLACIER / DEEP_ARCHIVE) files, chain included."""
    from seedance_tasks.errors import UsageError
    from seedance_tasks.lifecycle.archive import thaw as run_thaw

    if retrieval and retrieval not in ("Expedited", "Standard", "Bulk"):
        raise UsageError(f"unknown retrieval tier {retrieval!r}", hint="use Expedited, Standard or Bulk")
    result = run_thaw(_store(store), run, step, days=days, retrieval=retrieval)

    def render(res: dict) -> None:
        if res["missing"]:
            state = (f"{res['missing']} file(s) missing (a tier volume not mounted, or deleted?): the checkpoint "
                     "cannot be restored until they are back")
        else:
            state = "every file is readable now" if res["ready"] else "not readable yet: retry `ckpt get` later"
        console.print(f"{run}/step-{res['step']}: {res['requested']} restore request(s) sent; {state}", markup=False)
        console.print(table("files", ["step", "file", "class", "state", "action"],
                            [[f["step"], f["uri"], f["storage_class"] or "local", f["state"], f["action"]]
                             for f in res["files"]]))

    emit(result, as_json, render)


def tag(
    tags: list[str] = typer.Argument(..., help="tags to add (or remove with --remove), e.g. release"),
    store: str = STORE_OPTION,
    run: str = typer.Option(..., "--run", help="run name"),
    step: int = typer.Option(..., "--step", min=0, help="step to tag"),
    remove: bool = typer.Option(False, "--remove", help="remove these tags instead"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Tag a checkpoint: GC keeps every tagged checkpoint (and the bases it needs)."""
    from seedance_tasks.lifecycle.inventory import set_tags

    result = set_tags(_store(store), run, step, add=[] if remove else tags, remove=tags if remove else [])
    emit(result, as_json, lambda res: console.print(f"{run}/step-{step} tags: {', '.join(res['tags']) or '(none)'}", markup=False))


def cost(
    store: str = STORE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Bytes per tier and the monthly storage cost by tier (price table: lifecycle.prices)."""
    from seedance_tasks.lifecycle.costs import shown
    from seedance_tasks.lifecycle.report import store_report

    result = store_report(_store(store))

    def render(res: dict) -> None:
        console.print(table(f"checkpoint storage of {escape(res['store'])}", ["tier", "files", "bytes", "per month"],
                            [[t, r["files"], _size(r["bytes"]), shown(r["monthly_usd"])] for t, r in res["tiers"].items()]))
        console.print(f"{res['checkpoints']} checkpoint(s), {_size(res['bytes'])}, {shown(res['monthly_usd'])}/month; "
                      f"trash {_size(res['trash_bytes'])}", markup=False)

    emit(result, as_json, render)
    _fail_if_damaged(result, "they are not counted")


def register(ckpt_app: typer.Typer) -> None:
    """Add the lifecycle commands to the `seedance ckpt` group."""
    for name, func in (("gc", gc), ("tier", tier), ("thaw", thaw), ("tag", tag), ("cost", cost)):
        ckpt_app.command(name)(handle_errors(func))
