"""The dashboard's HTML pages: overview, cost, savings, training, open findings, data safety.
No script, no external resource.

Every string that comes from data (owner names, URIs, reasons, run ids) goes through `escape`;
money is shown by `cost.money.display` (half-up to the currency's minor unit, with its code);
negative amounts are shown (red, and below the axis in charts). Links are relative, so the pages
work under any base URL and framed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote

from seedance_tasks.dashboard import svg
from seedance_tasks.dashboard.cost import UNALLOCATED, CostView
from seedance_tasks.dashboard.sources import HOW_TO_CONFIGURE, Sources
from seedance_tasks.dashboard.svg import escape
from seedance_tasks.units import format_size

TABLE_OWNERS = 25  # owners listed by name per currency (the largest over the window); the rest in one row
PAGES = (("./", "Overview"), ("cost", "Cost"), ("savings", "Savings"), ("training", "Training"),
         ("findings", "Open findings"), ("safety", "Data safety"))
CHARTS = 12  # training runs drawn as a cost-over-steps chart (the newest); all are in the table
CSS = (
    "body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1f2328;background:#fff}"
    "main{padding:1em 1.5em 3em;max-width:1200px;overflow-wrap:anywhere}nav{background:#17324d;padding:.6em 1.5em}"
    "nav a{color:#dce6f0;margin-right:1.4em;text-decoration:none;font-weight:600}nav a.on{color:#fff;"
    "border-bottom:2px solid #fff}h1{font-size:1.5em;margin:.4em 0}h2{font-size:1.2em;margin-top:1.6em;"
    "border-bottom:1px solid #d8dee4;padding-bottom:.2em}h3{font-size:1.05em;margin-top:1.2em}"
    "table{border-collapse:collapse;margin:.4em 0 1em}td,th{border:1px solid #d0d7de;padding:.25em .6em;"
    "text-align:left;vertical-align:top;max-width:30em;overflow-wrap:anywhere}th{background:#f3f5f7}"
    "td.num,th.num{text-align:right;white-space:nowrap}.neg{color:#b5473a}.none{color:#6a737d}"
    ".muted{color:#6a737d;font-size:.9em}.cards{display:flex;flex-wrap:wrap;gap:1em}.card{border:1px solid "
    "#d0d7de;border-radius:6px;padding:.7em 1em;min-width:14em;color:inherit;text-decoration:none}.card b{font-size:1.25em;display:block}"
    ".err{background:#fff1f0;border:1px solid #f5c2c0;padding:.5em .8em;border-radius:4px}"
    ".hint{background:#f6f8fa;border:1px solid #d0d7de;padding:.5em .8em;border-radius:4px}"
    ".state-success{color:#1a7f37;font-weight:600}.state-failed{color:#b5473a;font-weight:600}"
    ".state-running,.state-queued{color:#9a6700;font-weight:600}svg.chart{max-width:100%;height:auto}"
    "code{background:#f3f5f7;padding:0 .25em;border-radius:3px}.sev-critical{color:#b5473a;font-weight:600}"
    ".sev-warning{color:#9a6700;font-weight:600}.est{color:#9a6700}.charts{display:flex;flex-wrap:wrap;gap:1em}"
)


def layout(title: str, active: str, body: str) -> str:
    """A full page: title, the dashboard's navigation (current page marked), and `body`."""
    links = "".join(f"<a href='{href}'{' class=on' if href == active else ''}>{escape(name)}</a>"
                    for href, name in PAGES)
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Seedance — {escape(title)}</title>"
            f"<style>{CSS}</style></head><body><nav>{links}</nav><main><h1>{escape(title)}</h1>{body}"
            "</main></body></html>")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str, *, numeric: Sequence[int] = ()) -> str:
    """A table of `rows`; a cell is escaped text, or a `Raw` fragment; `numeric` columns align right."""
    rows = list(rows)
    if not rows:
        return f"<p class='none'>{escape(empty)}</p>"
    head = "".join(f"<th{' class=num' if index in numeric else ''}>{escape(name)}</th>"
                   for index, name in enumerate(headers))
    body = "".join("<tr>" + "".join(_cell(cell, index in numeric) for index, cell in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


class Raw(str):
    """A cell or fragment that is already HTML (built from escaped parts)."""


def _cell(cell: Any, numeric: bool) -> str:
    if isinstance(cell, Raw):
        return f"<td{' class=num' if numeric else ''}>{cell}</td>"
    return f"<td{' class=num' if numeric else ''}>{escape('' if cell is None else str(cell))}</td>"


def amount(value: Decimal | None, currency: str | None = None, **data: str) -> Raw:
    """A money cell: `svg.money` (the currency's minor unit, with its code), red when negative,
    `data-*` attributes for tests and tools."""
    attributes = "".join(f" data-{key}='{escape(str(val), quote=True)}'" for key, val in data.items())
    if value is None:
        return Raw(f"<span class='none'{attributes}>no data</span>")
    css = " class='neg'" if value < 0 else ""
    return Raw(f"<span{css}{attributes}>{escape(svg.money(value, currency))}</span>")


def when(value: Any) -> str:
    """A time as `YYYY-MM-DD HH:MM UTC` (an aware time converted to UTC, a naive one taken as UTC);
    "—" for None. A value that is no ISO time (it is read from files) is shown as it is, never an error."""
    if value is None:
        return "—"
    if not isinstance(value, datetime):
        try:
            value = datetime.fromisoformat(str(value))
        except ValueError:
            return str(value)
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M UTC")


def error_box(message: str) -> str:
    return f"<p class='err'>{escape(message)}</p>"


def config_error(sources: Sources) -> str:
    """The config's error box, or nothing: every page shows it, whatever roots it still found."""
    return error_box(sources.error) if sources.error else ""


def config_hint(sources: Sources, what: str) -> str:
    """What to configure, shown when no root of `what` is known."""
    return f"{config_error(sources)}<p class='hint'><b>No {escape(what)} configured.</b> {HOW_TO_CONFIGURE}</p>"


# ----------------------------------------------------------------------------- overview


def overview_page(sources: Sources, cards: list[tuple[str, str, str]]) -> str:
    """Headline figures (title, value, link) and the roots the dashboard reads."""
    body = []
    if sources.error:
        body.append(error_box(sources.error))
    body.append("<div class=cards>" + "".join(
        f"<a class=card href='{escape(link, quote=True)}'>{escape(title)}<b>{escape(value)}</b></a>"
        for title, value, link in cards) + "</div>")
    body.append("<h2>Roots</h2>")
    if sources.workspace:
        body.append(f"<p class='muted'>Demo workspace: <code>{escape(sources.workspace)}</code></p>")
    if sources.roots:
        body.append(table(["pipeline", "role", "URI", "from"],
                          [[r.pipeline, r.role, r.uri, r.origin] for r in sources.roots], ""))
    else:
        body.append(config_hint(sources, "pipeline root"))
    return layout("Seedance", "./", "".join(body))


# ----------------------------------------------------------------------------- cost


def _report_link(index: int, month: str) -> Raw:
    return Raw(f"<a href='cost/report?root={index}&amp;month={quote(month)}'>{escape(month)}</a>")


def cost_section(index: int, origin: str, view: CostView) -> str:
    """One chargeback output root: per currency the stacked chart, owners table, share, movers; findings."""
    parts = [f"<h2>{escape(view.uri)} <span class='muted'>({escape(origin)})</span></h2>"]
    parts += [error_box(error) for error in view.errors]
    if not view.published:
        note = f" (open months not shown yet: {', '.join(view.open_months)})" if view.open_months else ""
        parts.append(f"<p class='hint'>No closed month published under <code>{escape(view.uri)}</code> yet"
                     f"{escape(note)}. Run <code>seedance_cost_recovery</code> (monthly, or triggered with a "
                     "month) to publish one.</p>")
        return "".join(parts)
    latest = view.published[-1]
    parts.append("<p>Months: " + escape(f"{view.months[0]} – {view.months[-1]}") + " &middot; reports: "
                 + ", ".join(_report_link(index, month) for month in view.published) + "</p>")
    for month in view.empty_months:
        parts.append(f"<p class='hint'>{escape(month)}: published with no billing line (an empty month).</p>")
    for currency in view.currencies:
        parts.append(_currency_section(currency))
    summary = view.latest or {}
    parts.append(f"<h3>Idle resources ({escape(latest)})</h3>")
    parts.append(table(
        ["resource", "owner", "cost", "max CPU %"],
        [[item.get("resource_id"), item.get("owner") or UNALLOCATED,
          Raw(", ".join(amount(Decimal(v), c) for c, v in sorted((item.get("cost") or {}).items()))),
          item.get("max_cpu_percent")] for item in summary.get("idle", [])],
        "No idle resource found (or no utilization data for the month).", numeric=(2, 3)))
    parts.append(f"<h3>Owners over budget ({escape(latest)})</h3>")
    parts.append(table(
        ["owner", "spend", "budget", "over by", "approved"],
        [[item.get("owner"), amount(Decimal(item["spend"]), item.get("currency"), owner=item.get("owner", "")),
          amount(Decimal(item["budget"]), item.get("currency")),
          f"{item['over_percent']}%" if item.get("over_percent") is not None else "—",
          "yes" if item.get("approved") is True else "no"] for item in summary.get("over_budget", [])],
        "No owner over budget.", numeric=(1, 2, 3)))
    from seedance_tasks.dashboard.budget import budget_section

    parts.append(budget_section(view.uri))
    return "".join(parts)


def _currency_section(view) -> str:
    currency = view.currency
    columns = [i for i, total in enumerate(view.totals) if total is not None]
    last = columns[-1]
    series = view.chart_series()
    names = [name for name, _ in series]
    chart = svg.stacked(f"Cost by owner per month ({currency})", view.months,
                        [(name, colour, values) for (name, values), colour in zip(series, svg.colours(names), strict=True)],
                        lambda value: svg.money(value, currency))
    share = view.share(last)
    parts = [f"<h3>{escape(currency)}: cost by owner per month</h3>",
             f"<p>{escape(view.months[last])}: total {amount(view.totals[last], currency, total=view.months[last])}"
             f" &middot; unallocated {amount(view.unallocated[last], currency)}"
             + (f" ({share:.1f}% of the total)" if share is not None else "") + "</p>", chart]
    nonzero = [o for o, values in view.by_owner.items() if any(values)]
    zero = len(view.by_owner) - len(nonzero)
    biggest = sorted(nonzero, key=lambda o: (-sum(abs(v or 0) for v in view.by_owner[o]), o))[:TABLE_OWNERS]
    owners = sorted(biggest, key=lambda o: (-(view.by_owner[o][last] or 0), o))
    rows = [[owner, *[amount(view.by_owner[owner][i], currency, owner=owner, month=view.months[i])
                      for i in range(len(view.months))]] for owner in owners]
    rest = [o for o in nonzero if o not in set(biggest)]
    if rest:
        rows.append([Raw(f"<i>{len(rest):,} more owners</i>"), *[
            amount(None if view.totals[i] is None else sum((view.by_owner[o][i] or 0 for o in rest), Decimal(0)),
                   currency, owner="(more owners)", month=view.months[i]) for i in range(len(view.months))]])
    rows.append([Raw(f"<i>{UNALLOCATED}</i>"), *[amount(view.unallocated[i], currency, owner=UNALLOCATED,
                                                        month=view.months[i]) for i in range(len(view.months))]])
    rows.append([Raw("<b>total</b>"), *[amount(view.totals[i], currency, owner="(total)", month=view.months[i])
                                        for i in range(len(view.months))]])
    rows.append(["unallocated share", *["—" if view.share(i) is None else f"{view.share(i):.1f}%"
                                        for i in range(len(view.months))]])
    numeric = tuple(range(1, len(view.months) + 1))
    parts.append(table([f"owner ({currency})", *view.months], rows, "", numeric=numeric))
    if zero:
        parts.append(f"<p class='muted'>{zero:,} owner(s) at {escape(svg.money(0, currency))} in every month are not listed; "
                     "each owner's statement is in the month's <code>statements/</code>.</p>")
    parts.append(f"<h3>{escape(currency)}: movers against the previous month</h3>")
    parts.append(table(
        ["owner", "from", "to", "before", "after", "change", "change %"],
        [[row["owner"], row["from"], row["to"], amount(row["before"], currency), amount(row["after"], currency),
          amount(row["change"], currency, mover=row["owner"]),
          "new" if row["percent"] is None else f"{row['percent']:+.1f}%"] for row in view.movers],
        "No previous month to compare with (or nothing changed).", numeric=(3, 4, 5, 6)))
    return "".join(parts)


def cost_page(sources: Sources, sections: list[str]) -> str:
    body = config_error(sources) + "".join(sections) if sections else config_hint(sources, "cost output root (cost.out_uri)")
    return layout("Cost recovery", "cost", body)


# ----------------------------------------------------------------------------- savings


def savings_page(result: dict[str, Any] | None, error: str | None) -> str:
    """Savings per pipeline per month (USD a month, requests, bytes), a stacked chart and the totals."""
    parts = []
    if error:
        parts.append(error_box(error))
    parts += [error_box(message) for message in (result or {}).get("errors", [])]
    if not result or not result["rows"]:
        parts.append("<p class='hint'>No saving reported yet: no successful run of <code>seedance_compaction</code>, "
                     "<code>seedance_checkpoints</code> or <code>seedance_checkpoint_lifecycle</code> (applied) has "
                     "a report that saved something. Trigger one from its DAG page, or run <code>make demo</code>.</p>")
        return layout("Savings", "savings", "".join(parts))
    months, rows = result["months"], result["rows"]
    pipelines = sorted({row.pipeline for row in rows})
    series = []
    for pipeline, colour in zip(pipelines, svg.PALETTE, strict=False):
        values = [sum((r.usd for r in rows if r.pipeline == pipeline and r.month == m), Decimal(0)) for m in months]
        series.append((pipeline, colour, values))
    parts.append("<p>Estimated monthly run-rate saved by the runs that ended in each month, from each run's own "
                 "report.</p>")
    parts.append(svg.stacked("Saved per month (USD a month)", months, series, lambda v: svg.money(v, "USD")))
    parts.append(table(
        ["pipeline", "month", "runs", "saved (USD a month)", "S3 requests a month", "bytes saved", "moved to colder tiers"],
        [[row.pipeline, row.month,
          Raw(escape(str(row.runs)) + (f" <span class='err'>{row.unreadable} figure(s) unreadable, see above</span>"
                                       if row.unreadable else "")),
          Raw(amount(row.usd, "USD", pipeline=row.pipeline, month=row.month)
              + (" <span class='muted'>(est. at the hot-tier price)</span>" if row.usd_estimated else "")),
          f"{row.requests:,}" if row.requests else "—", format_size(row.bytes_saved) if row.bytes_saved else "—",
          row.moved or "—"] for row in rows],
        "", numeric=(2, 3, 4, 5, 6)))
    parts.append("<h3>Total</h3>")
    parts.append(table(["month", "saved (USD a month)"],
                       [[month, amount(total, "USD", pipeline="(total)", month=month)]
                        for month, total in result["totals"].items()], "", numeric=(1,)))
    return layout("Savings", "savings", "".join(parts))


# ----------------------------------------------------------------------------- data safety


def _state(state: str | None) -> Raw:
    if state is None:
        return Raw("<span class='none'>never run</span>")
    return Raw(f"<span class='state-{escape(state, quote=True)}'>{escape(state)}</span>")


def safety_page(sources: Sources, runs: list[dict[str, Any]] | None, runs_error: str | None,
                roots: list[tuple[Any, dict[str, Any] | None, str | None]]) -> str:
    """Last run of each DAG, then per root: quarantine, trash, leases (a config error first, always)."""
    parts = [config_error(sources) if roots else "", "<h2>Last run of each DAG</h2>"]
    if runs_error:
        parts.append(error_box(runs_error))
    parts.append(table(
        ["DAG", "outcome", "run", "type", "started", "ended"],
        [[Raw(f"<a target=_top href='../dags/{quote(r['dag_id'])}'>{escape(r['dag_id'])}</a>")
          if r["dag_id"] else "", _state(r["state"]),
          Raw(f"<a target=_top href='../dags/{quote(r['dag_id'])}/runs/{quote(r['run_id'], safe='')}'>"
              f"{escape(r['run_id'])}</a>") if r["run_id"] else "—",
          r["run_type"] or "—", when(r["started"]), when(r["ended"])] for r in runs or []],
        "No Seedance DAG known to Airflow yet (the DAG processor has not parsed dags/?)."))
    if not roots:
        parts.append(config_hint(sources, "pipeline root"))
    for root, status, error in roots:
        parts.append(f"<h2>{escape(root.pipeline)} {escape(root.role)}: <code>{escape(root.uri)}</code> "
                     f"<span class='muted'>({escape(root.origin)})</span></h2>")
        if error:
            parts.append(error_box(error))
            continue
        parts.append("<h3>Quarantine</h3>")
        parts.append(table(["file", "reason", "run", "at"],
                           [[q["file"], q["reason"], q["run_id"], when(q["at"]) if q.get("at") else "—"]
                            for q in status["quarantined"]], "Nothing quarantined."))
        if status.get("quarantined_without_reason"):
            parts.append(f"<p class='muted'>{status['quarantined_without_reason']} more quarantined file(s) "
                         "without a reason file (e.g. refused journals).</p>")
        parts.append("<h3>Trash <span class='muted'>(awaiting a dated purge)</span></h3>")
        parts.append(table(["run", "files", "bytes"],
                           [[t["run_id"], t["files"], format_size(t["bytes"])] for t in status["trash"]],
                           "Empty.", numeric=(1, 2)))
        parts.append("<h3>Leases</h3>")
        parts.append(table(["lease", "holder", "purpose", "host / pid", "since", "heartbeat", "state"],
                           [[item["name"], item["holder"], item["purpose"], f"{item['host']} / {item['pid']}",
                             when(item["acquired_at"]), when(item["heartbeat_at"]),
                             "stale (may be taken over)" if item["stale"] else "held"] for item in status["leases"]],
                           "No lease held."))
        for item in status.get("damaged_leases", []):
            parts.append(error_box(f"error: {item['error']}" + (f" hint: {item['hint']}" if item["hint"] else "")))
    return layout("Data safety", "safety", "".join(parts))


# ----------------------------------------------------------------------------- training


def _energy_source(run) -> Raw:
    """nvml / rapl as measured; an estimate (TDP x utilisation) labelled so, also when partial."""
    sources = run.energy_sources or ["estimated"]
    text = " + ".join(sources)
    if run.estimated:
        note = "TDP x utilisation, not measured" if sources == ["estimated"] else "partly estimated"
        return Raw(f"<span class='est' data-run='{escape(run.name, quote=True)}' data-figure='energy-source'>"
                   f"{escape(text)} ({escape(note)})</span>")
    return Raw(f"<span data-run='{escape(run.name, quote=True)}' data-figure='energy-source'>{escape(text)} "
               "(measured)</span>")


def kwh(value: Decimal) -> str:
    """Energy for people: kWh, with the places a small run needs (1 from 10 kWh, 3 from 0.01, else 6)."""
    places = 1 if value >= 10 else 3 if value >= Decimal("0.01") else 6
    return f"{value:,.{places}f} kWh"


def _figure(run, figure: str, text: str) -> Raw:
    return Raw(f"<span data-run='{escape(run.name, quote=True)}' data-figure='{figure}'>{escape(text)}</span>")


NAME_SHOWN = 120
"""Characters of a run name shown at most (the rest behind "…", the whole name in its tooltip): a name
from telemetry of thousands of characters would otherwise fill the page."""


def clipped(text: str, limit: int = NAME_SHOWN) -> Raw:
    """`text` escaped, cut at `limit` characters with "…" and the whole of it as the tooltip."""
    if len(text) <= limit:
        return Raw(escape(text))
    return Raw(f"<span title='{escape(text, quote=True)}'>{escape(text[:limit])}…</span>")


def training_row(run) -> list[Any]:
    """One run's row: steps, cost so far, $ per 1,000 steps, energy and its source, utilisation."""
    utilisation = ("—" if run.utilisation is None else
                   f"{run.utilisation * 100:.1f}% {'/'.join(run.devices) or 'CPU'}")
    return [clipped(run.name), f"{run.steps:,}", amount(run.cost, run.currency, run=run.name, figure="cost"),
            amount(run.per_1000_steps, run.currency, run=run.name, figure="per-1000-steps"),
            _figure(run, "energy", kwh(run.energy_kwh)), _energy_source(run),
            _figure(run, "utilisation", utilisation), f"{run.ranks} × {run.attempts}", when(run.last_sample),
            run.folder]


def training_page(sources: Sources, roots: list[tuple[Any, list | None, list[str]]]) -> str:
    """Per training log root: every run's cost so far, $ per 1,000 steps, energy, utilisation; charts."""
    if not roots:
        hint = ("<p class='hint'><b>No training log folder configured.</b> Set <code>training.log_dir</code> in "
                "<code>config/seedance.yaml</code> (or <code>SEEDANCE__TRAINING__LOG_DIR</code>): each run of "
                "<code>seedance_training</code> writes its telemetry to <code>&lt;log_dir&gt;/&lt;run&gt;/telemetry/"
                "</code>; or run <code>make demo</code> and then <code>make airflow</code>.</p>")
        return layout("Training", "training", config_error(sources) + hint)
    parts = [config_error(sources)]
    for root, runs, errors in roots:
        parts.append(f"<h2><code>{escape(root.uri)}</code> <span class='muted'>({escape(root.origin)})</span></h2>")
        parts += [f"<p class='muted'>{escape(error.removeprefix('note: '))}</p>" if error.startswith("note: ")
                  else error_box(error) for error in errors]
        if runs is None:
            continue
        parts.append(table(
            ["run", "steps", "cost so far", "per 1,000 steps", "energy", "energy source", "utilisation",
             "ranks × attempts", "last sample", "folder"],
            [training_row(run) for run in runs],
            "No training run with telemetry here yet (runs write <run>/telemetry/ when telemetry.enabled).",
            numeric=(1, 2, 3, 4, 6)))
        charts = [f"<div><h3>{clipped(run.name)}: cost so far over steps</h3>"
                  + svg.line(f"{run.name[:NAME_SHOWN]}: cost so far ({run.currency}) over steps", run.cost_by_step,
                             lambda value, currency=run.currency: svg.money(value, currency)) + "</div>"
                  for run in runs[:CHARTS]]
        if charts:
            parts.append("<div class=charts>" + "".join(charts) + "</div>")
        if len(runs) > CHARTS:
            parts.append(f"<p class='muted'>Charts of the {CHARTS} newest runs; every run is in the table.</p>")
    parts.append("<p class='muted'>Cost: step seconds at the <code>telemetry.pricing</code> prices, every rank and "
                 "attempt (redone steps included). Energy: NVML or RAPL counters where readable, else an estimate "
                 "(labelled). Utilisation: step-time weighted mean over the ranks.</p>")
    return layout("Training", "training", "".join(parts))


# ----------------------------------------------------------------------------- open findings


def _fix(fix: dict[str, Any] | None) -> Raw | str:
    if not fix or not fix.get("dag_id"):
        return "—"
    dag_id = str(fix["dag_id"])
    conf = json.dumps(fix.get("conf") or {}, sort_keys=True)
    return Raw(f"<a target=_top href='../dags/{quote(dag_id, safe='')}'>{escape(dag_id)}</a> "
               f"<code>{escape(conf)}</code>")


def findings_section(root: Any, findings: list[Any], errors: Sequence[str] = ()) -> str:
    """One signals root: its `errors` (boxes), the open findings, most money at stake first, with
    totals per currency."""
    from seedance_tasks.dashboard.signals import at_stake_by_currency

    parts = [f"<h2><code>{escape(root.uri)}</code> <span class='muted'>({escape(root.origin)})</span></h2>"]
    parts += [error_box(error) for error in errors]
    if not findings:
        parts.append("<p class='none'>No open finding (or no night audited here yet: <code>seedance_signals</code> "
                     "runs nightly).</p>")
        return "".join(parts)
    totals = at_stake_by_currency(findings)
    parts.append(f"<p>{len(findings):,} open finding(s); at stake a month: "
                 + ", ".join(amount(total, currency, finding=f"(total {currency})")
                             for currency, total in totals.items()) + "</p>")
    parts.append(table(
        ["severity", "finding", "key", "what", "owner", "at stake / month", "first seen", "last seen", "change",
         "fix (DAG and conf)"],
        [[Raw(f"<span class='sev-{escape(f.severity, quote=True)}'>{escape(f.severity)}</span>"), f.id, f.key,
          f.summary, f.owner or "—", amount(f.at_stake, f.currency, finding=f.id), f.first_seen or "—",
          f.last_seen or "—", f.change, _fix(f.fix)] for f in findings], "", numeric=(5,)))
    return "".join(parts)


def findings_page(sources: Sources, sections: list[str]) -> str:
    """The open findings of every signals root (sections from `findings_section` or error boxes)."""
    if not sections:
        hint = ("<p class='hint'><b>No signals root configured.</b> Set <code>signals.root</code> in "
                "<code>config/seedance.yaml</code> (or <code>SEEDANCE__SIGNALS__ROOT</code>): the nightly "
                "<code>seedance_signals</code> audit writes <code>nights/&lt;date&gt;/findings.json</code> there; "
                "or run <code>make demo</code> and then <code>make airflow</code>.</p>")
        return layout("Open findings", "findings", config_error(sources) + hint)
    return layout("Open findings", "findings", config_error(sources) + "".join(sections))
