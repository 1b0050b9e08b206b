"""`seedance cost` subcommands: monthly cost recovery (chargeback) and its backfill."""

from __future__ import annotations

import typer

from seedance_tasks.cli_support import JSON_OPTION, console, emit, err_console, handle_errors, progress, table

app = typer.Typer(help="Cost recovery: monthly chargeback and backfill.", no_args_is_help=True)


@app.command("recover")
@handle_errors
def recover(
    month: str = typer.Option(..., "--month", help="month to recover, YYYY-MM (by ChargePeriodStart, UTC)"),
    billing: str = typer.Option(..., "--billing", help="billing file or folder (local, file://, s3://); ce://TAG for Cost Explorer"),
    out: str = typer.Option(..., "--out", help="output root; the month goes to OUT/month=YYYY-MM/"),
    owners: str = typer.Option(None, "--owners", help="owners/CMDB YAML file (default: cost.owners_file)"),
    fmt: str = typer.Option("focus", "--format", help="focus (CSV/Parquet), cur (AWS CUR 2.0 Parquet) or ce (Cost Explorer)"),
    basis: str = typer.Option(None, "--basis", help="EffectiveCost (amortized, default) or BilledCost"),
    utilization: str = typer.Option(None, "--utilization", help="daily utilization CSV for the idle rule, or cloudwatch"),
    currency: str = typer.Option(None, "--currency", help="currency of files without a BillingCurrency column"),
    apply: bool = typer.Option(False, "--apply", help="tag idle resources, freeze quotas, notify (else dry-run)"),
    backfill: bool = typer.Option(None, "--backfill/--current", help="force backfill mode (no side effects) or not; default: by month"),
    refresh: bool = typer.Option(False, "--refresh", help="re-query Cost Explorer for a closed month already cached"),
    wait: str = typer.Option(None, "--wait", help="if another run holds the month's lease, wait up to this long: 30s, 10m"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Attribute a month's bill to owners; write allocations, statements, summary.json and a report.

    One run per month and output root at a time: a second one is refused naming the holder of
    the month's lease (or waits, --wait). A run killed at any moment is finished or rolled back
    by the next run of the month.
    """
    from seedance_tasks.cost import recover as recovery
    from seedance_tasks.units import parse_duration

    wait_s = parse_duration(wait) if wait else 0.0

    with progress(f"cost recovery {month}", len(recovery.STAGES), enabled=not as_json) as advance:
        result = recovery.recover_month(
            month=month, billing=billing, out=out, owners=owners, format=fmt, basis=basis, apply=apply,
            backfill=backfill, utilization=utilization, currency=currency, refresh=refresh, advance=advance,
            wait_s=wait_s,
        )

    from rich.markup import escape

    for warning in result["summary"]["warnings"]:  # on stderr, so --json output stays one document
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)

    def render(res: dict) -> None:
        from decimal import Decimal

        summary = res["summary"]
        for currency_code, entry in summary["currencies"].items():
            ranked = sorted(entry["by_owner"].items(), key=lambda item: (-abs(Decimal(item[1])), item[0]))
            rows = [[owner, amount] for owner, amount in ranked[:25]]
            if len(ranked) > 25:
                rows.append([f"... {len(ranked) - 25} more (see the statements)", ""])
            rows.append(["(unallocated)", entry["unallocated"]])
            rows.append(["TOTAL", entry["total"]])
            console.print(table(f"{month} {summary['basis']} by owner ({currency_code})", ["owner", "amount"], rows))
        console.print(
            f"{summary['lines']:,} lines, {summary['rejected_count']:,} rejected, "
            f"{summary['tag_conflicts']['count']:,} tag conflicts, {len(summary['idle'])} idle resources, "
            f"{len(summary['over_budget'])} over budget; actions: {res['rules']['actions']['mode']}"
        )
        console.print(f"outputs: {res['report']['out']}")

    emit(result, as_json, render)
