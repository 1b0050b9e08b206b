"""`seedance cost` subcommands: monthly cost recovery (chargeback) and its backfill, the recovery
workflow's plan (dry run) and the owners' budget-pool ledger."""

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

        from seedance_tasks.cost.money import display  # as the report shows them (outputs stay exact)

        summary = res["summary"]
        for currency_code, entry in summary["currencies"].items():
            ranked = sorted(entry["by_owner"].items(), key=lambda item: (-abs(Decimal(item[1])), item[0]))
            rows = [[owner, display(Decimal(amount), currency_code)] for owner, amount in ranked[:25]]
            if len(ranked) > 25:
                rows.append([f"... {len(ranked) - 25} more (see the statements)", ""])
            rows.append(["(unallocated)", display(Decimal(entry["unallocated"]), currency_code)])
            rows.append(["TOTAL", display(Decimal(entry["total"]), currency_code)])
            console.print(table(f"{month} {summary['basis']} by owner ({currency_code})", ["owner", "amount"], rows))
        console.print(
            f"{summary['lines']:,} lines, {summary['rejected_count']:,} rejected, "
            f"{summary['tag_conflicts']['count']:,} tag conflicts, {len(summary['idle'])} idle resources, "
            f"{len(summary['over_budget'])} over budget; actions: {res['rules']['actions']['mode']}"
        )
        if summary["rejected_truncated"]:
            console.print(f"rejected rows: the first {len(summary['rejected']):,} of {summary['rejected_count']:,} "
                          "are listed in summary.json")
        console.print(f"outputs: {res['report']['out']}", markup=False)

    emit(result, as_json, render)


@app.command("actions")
@handle_errors
def actions(
    month: str = typer.Option(..., "--month", help="a recovered month, YYYY-MM (its summary.json is read)"),
    out: str = typer.Option(..., "--out", help="the recovery's output root (as given to `seedance cost recover`)"),
    owners: str = typer.Option(None, "--owners", help="owners/CMDB YAML file (default: cost.owners_file)"),
    as_json: bool = JSON_OPTION,
) -> None:
    """What the month's recovery workflow would do, as a dry run: deadlines from the working-day
    calendar, the idle resources it would snapshot and isolate, the deductions and freezes.

    Nothing is changed, nobody is asked. The workflow itself runs as the `seedance_cost_actions`
    DAG, where each owner confirms or disputes in the Airflow UI (human-in-the-loop).
    """
    from seedance_tasks.cost import actions as workflow

    plan = workflow.plan(month=month, out=out, owners=owners, apply=False)
    result = {"plan": plan, "isolate": workflow.isolate(plan), "settle": workflow.settle(plan)}

    def render(res: dict) -> None:
        deadlines = res["plan"]["deadlines"]
        console.print(table(f"{month}: the recovery workflow's deadlines", ["step", "by"], [
            ["isolate idle resources", deadlines["isolate_by"]],
            *[["remind owners", moment] for moment in deadlines["remind_at"]],
            ["owners confirm or dispute", deadlines["confirm_by"]],
            ["deduct confirmed charges", deadlines["deduct_at"]],
        ]))
        isolate = res["isolate"]
        rows = [[step, ""] for step in isolate["planned"]]
        rows += [[item["resource_id"], f"skipped: {item['reason']}"] for item in isolate["skipped"]]
        rows += [[item["resource_id"], "not found in AWS"] for item in isolate["missing"]]
        rows += [[item["resource_id"], f"refused by AWS: {item['error']}"] for item in isolate["failed"]]
        rows += [[item["resource_id"], f"done before ({item['kind']})"] for item in isolate["done_before"]]
        console.print(table("idle resources", ["resource / step", "note"], rows or [["(none idle)", ""]]))
        from decimal import Decimal

        from seedance_tasks.cost.money import display

        charges = sorted(((owner, currency, Decimal(amount)) for owner, by_currency in res["plan"]["charges"].items()
                          if owner != workflow.UNALLOCATED for currency, amount in by_currency.items()),
                         key=lambda row: (-abs(row[2]), row[0], row[1]))
        rows = [[owner, display(amount, currency)] for owner, currency, amount in charges[:25]]
        if len(charges) > 25:
            rows.append([f"... {len(charges) - 25} more (see --json)", ""])
        console.print(table("deducted from each budget pool if its owner confirms", ["owner", "amount"],
                            rows or [["(no charges)", ""]]))
        freezes = [line for line in res["settle"]["planned"] if line.startswith("freeze ")]
        if freezes:
            console.print(table("budget freezes (over budget, not approved)", ["would"], [[line] for line in freezes]))
        console.print("dry run: nothing changed; apply through the seedance_cost_actions DAG")

    emit(result, as_json, render)


@app.command("ledger")
@handle_errors
def ledger(
    out: str = typer.Option(..., "--out", help="the recovery's output root"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Each owner's budget pool position from the ledger under OUT: deducted, frozen, the answer.

    The ledger is verified first (a tampered or damaged one is an error naming the file).
    """
    from seedance_tasks.cost.actions import owner_positions
    from seedance_tasks.cost.money import display

    positions = owner_positions(out)

    def render(rows: list[dict]) -> None:
        console.print(table("budget pools", ["owner", "month", "deducted", "frozen", "answer"], [
            [row["owner"], row["month"],
             display(row["deducted"], row["currency"]) if row["deducted"] is not None else "-",
             row["frozen"] or "-", row["answer"] or "-"] for row in rows] or [["(no entries)", "", "", "", ""]]))

    emit(positions, as_json, render)
