"""`seedance signals run|list|import-metrics`: the nightly cost audit without Airflow."""

from __future__ import annotations

import typer

from seedance_tasks.cli_support import JSON_OPTION, console, emit, err_console, handle_errors, table

app = typer.Typer(help="Cost signals: the nightly early-warning audit, each signal wired to its fix.",
                  no_args_is_help=True)


def inputs_for(settings, billing=None, lakes=None, checkpoints=None, metrics=None):
    """The night's Inputs: the options given, else the `signals:` settings."""
    from seedance_tasks.config import load_settings
    from seedance_tasks.signals.sources import Inputs

    return Inputs(settings, billing_uri=billing or settings.billing_uri, lakes=list(lakes or settings.lakes),
                  checkpoints_uri=checkpoints or settings.checkpoints_uri, metrics_uri=metrics or settings.metrics_uri,
                  logs=list(settings.training_logs), basis=load_settings().cost.basis)


@app.command("run")
@handle_errors
def run(
    day: str = typer.Option(..., "--date", help="the night audited, YYYY-MM-DD"),
    billing: str = typer.Option(None, "--billing", help="FOCUS file or folder (default: signals.billing_uri)"),
    lake: list[str] = typer.Option(None, "--lake", help="a dataset root to audit (repeatable)"),
    checkpoints: str = typer.Option(None, "--checkpoints", help="checkpoint store URI"),
    metrics: str = typer.Option(None, "--metrics", help="Parquet samples URI or a Prometheus http:// URL"),
    out: str = typer.Option(None, "--out", help="output root (default: signals.root); none: print only"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Evaluate every signal for one night; print what fired, what was skipped and why. Exits with
    the first failed rule's error status (after the night is written) when a rule failed."""
    from seedance_tasks.config import load_settings
    from seedance_tasks.signals.audit import run_audit
    from seedance_tasks.signals.sources import parse_day

    settings = load_settings().signals
    root = out or settings.root
    night = run_audit(parse_day(day), inputs_for(settings, billing, lake, checkpoints, metrics),
                      None if root and root.lower() == "none" else root)
    from rich.markup import escape

    for warning in night["warnings"]:  # on stderr, so --json output stays one document
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)

    def render(doc: dict) -> None:
        from seedance_tasks.cost.money import display

        rows = [[s["id"], "FAILED" if s.get("error") else "skipped" if "skipped" in s else ("FIRED" if s["fired"] else "silent"),
                 len(s["findings"]), s.get("skipped", "")] for s in doc["signals"]]
        console.print(table(f"signals, night of {doc['date']}", ["signal", "state", "findings", "note"], rows))
        for signal in doc["signals"]:
            for f in signal["findings"]:
                stake = display(f["at_stake"], f["currency"])
                console.print(f"[{f['severity']}] {f['summary']} ({stake}/month)", markup=False)

    emit(night, as_json, render)
    failed = [s for s in night["signals"] if s.get("error")]
    if failed:  # the night is written and shown, each failure warned of: the exit status says it too
        from seedance_tasks.errors import SeedanceError

        error = SeedanceError(f"{len(failed)} signal(s) failed: {', '.join(s['id'] for s in failed)}; the other "
                              "signals ran" + (" and the night is written" if night.get("outputs") else ""),
                              hint="the warnings above say why")
        error.exit_code = failed[0]["error"].get("exit_code", 1)
        raise error


@app.command("list")
@handle_errors
def list_signals(as_json: bool = JSON_OPTION) -> None:
    """Every signal: id, family, the inputs it needs and what it detects."""
    from seedance_tasks.signals.registry import RULES

    rows = [{"id": r.id, "family": r.family, "needs": list(r.needs), "metrics": list(r.metrics),
             "description": r.description} for r in RULES.values()]
    emit({"signals": rows}, as_json, lambda doc: console.print(table(
        "signals", ["id", "family", "needs", "detects"],
        [[r["id"], r["family"], ",".join(r["needs"]), r["description"]] for r in doc["signals"]])))


@app.command("import-metrics")
@handle_errors
def import_metrics(
    source: str = typer.Argument(..., help="OpenMetrics or Prometheus text file"),
    out: str = typer.Option(..., "--out", help="Parquet file to write (timestamp, name, labels, value)"),
    at: str = typer.Option(None, "--at", help="ISO time of samples without a timestamp (default: now)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Turn OpenMetrics text into the Parquet metric samples the audit reads."""
    from datetime import datetime

    from seedance_tasks.errors import UsageError
    from seedance_tasks.signals.sources import import_openmetrics

    try:
        when = datetime.fromisoformat(at) if at else None
    except ValueError:
        raise UsageError(f"--at {at!r} is not an ISO time", hint="e.g. 2026-03-01T00:00:00+00:00") from None
    emit(import_openmetrics(source, out, at=when), as_json,
         lambda r: console.print(f"{r['samples']:,} samples of {len(r['metrics'])} metrics -> {r['out']}", markup=False))
