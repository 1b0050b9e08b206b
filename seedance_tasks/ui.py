"""The Seedance dashboard in Airflow's UI: cost, savings, training, open findings and data safety
(`seedance_tasks.dashboard`).

Served by the plugin in `plugins/seedance_plugin.py` under `/seedance/`, behind Airflow's own
login: plugin endpoints are not protected by Airflow on their own, so the app itself requires a
valid Airflow JWT (the UI's `_token` cookie or an `Authorization: Bearer` header) on every route,
through an app-wide dependency on Airflow's `get_user`. Read-only.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from seedance_tasks.dashboard import pages, svg
from seedance_tasks.dashboard.safety import root_status
from seedance_tasks.dashboard.signals import at_stake_by_currency
from seedance_tasks.dashboard.sources import FINDINGS, RUN_LOGS, Sources, find_sources
from seedance_tasks.dashboard.svg import escape
from seedance_tasks.errors import SeedanceError

MONTH = re.compile(r"\d{4}-(0[1-9]|1[0-2])")
PAGE_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
"""Content-Security-Policy of every response: the pages have no script, so none runs even if data
ever slipped through unescaped (inline styles and inline SVG are all they use)."""
REPORT_POLICY = f"sandbox; {PAGE_POLICY}"
"""... and of a served report.html, a file read from the output root: sandboxed too (an origin of
its own, no script, no forms, no top navigation), so even a planted file cannot act as the user."""


def _failure(exc: Exception) -> str:
    """One `error:` line (with the hint) for a failure to read a root or the metadata DB."""
    if isinstance(exc, SeedanceError):
        return f"error: {exc.message}" + (f" hint: {exc.hint}" if exc.hint else "")
    return f"error: {type(exc).__name__}: {exc}"


def safety_statuses(sources: Sources) -> list[tuple[Any, dict | None, str | None]]:
    """(root, status, error) for every root: one unreadable root does not hide the others."""
    result = []
    for root in sources.roots:
        try:
            result.append((root, root_status(root.uri), None))
        except (SeedanceError, OSError, ValueError) as exc:
            result.append((root, None, _failure(exc)))
    return result


def cost_sections(sources: Sources, now: datetime | None = None) -> tuple[list[str], list]:
    """The HTML section and the view of every chargeback output root."""
    from seedance_tasks.dashboard.cost import cost_view

    sections, views = [], []
    for index, root in enumerate(sources.of("cost")):
        try:
            view = cost_view(root.uri, now)
        except (SeedanceError, OSError, ValueError) as exc:
            sections.append(f"<h2>{escape(root.uri)}</h2>" + pages.error_box(_failure(exc)))
            continue
        views.append(view)
        sections.append(pages.cost_section(index, root.origin, view))
    return sections, views


def training_roots(sources: Sources) -> list[tuple[Any, list | None, list[str]]]:
    """(root, runs, error lines) of every training log root: an unreadable root or run says so."""
    from seedance_tasks.dashboard.training import training_runs

    result = []
    for root in sources.of("training", RUN_LOGS):
        try:
            result.append((root, *training_runs(root.uri)))
        except (SeedanceError, OSError, ValueError) as exc:
            result.append((root, None, [_failure(exc)]))
    return result


def findings_roots(sources: Sources) -> list[tuple[Any, list | None, list[str]]]:
    """(root, open findings, error lines) of every signals root: findings None when unreadable; a
    damaged night passed over or malformed findings left out each have their line."""
    from seedance_tasks.dashboard.signals import open_findings

    result = []
    for root in sources.of("signals", FINDINGS):
        errors: list[str] = []
        try:
            result.append((root, open_findings(root.uri, errors), errors))
        except (SeedanceError, OSError) as exc:
            result.append((root, None, [*errors, _failure(exc)]))
    return result


def findings_sections(sources: Sources) -> list[str]:
    """The HTML section of every signals root, with its error boxes (only those when unreadable)."""
    return [pages.findings_section(root, findings, errors) if findings is not None
            else f"<h2>{escape(root.uri)}</h2>" + "".join(pages.error_box(error) for error in errors)
            for root, findings, errors in findings_roots(sources)]


def savings_result() -> tuple[dict | None, str | None]:
    from seedance_tasks.dashboard.airflow_runs import report_runs
    from seedance_tasks.dashboard.savings import PIPELINES, savings

    try:
        return savings(report_runs(list(PIPELINES))), None
    except Exception as exc:  # the metadata DB unreadable: say so on the page, do not fail it
        return None, _failure(exc)


def dag_runs() -> tuple[list[dict] | None, str | None]:
    from seedance_tasks.dashboard.airflow_runs import last_runs

    try:
        return last_runs(), None
    except Exception as exc:  # as above
        return None, _failure(exc)


def overview() -> str:
    """Headline figures of the pages, and the roots read."""
    sources = find_sources()
    _, views = cost_sections(sources)
    cards = []
    for view in views:
        for currency in view.currencies:
            last = max(i for i, total in enumerate(currency.totals) if total is not None)
            cards.append((f"Cost {currency.months[last]} ({currency.currency})",
                          svg.money(currency.totals[last], currency.currency), "cost"))
    result, _ = savings_result()
    if result and result["totals"]:
        month, total = list(result["totals"].items())[-1]
        cards.append((f"Saved {month} (a month)", svg.money(total, "USD"), "savings"))
    roots = training_roots(sources)
    runs = [run for _, found, _ in roots for run in found or []]
    capped = any(line.startswith("note: ") for _, _, lines in roots for line in lines)
    for currency in sorted({run.currency for run in runs}):
        cost = sum((run.cost for run in runs if run.currency == currency), Decimal(0))
        counted = f"{len(runs):,} {'newest runs' if capped else 'runs'}"
        cards.append((f"Training cost so far ({currency}, {counted})", svg.money(cost, currency), "training"))
    findings = [f for _, found, _ in findings_roots(sources) for f in found or []]
    cards.append(("Open cost findings", f"{len(findings):,}", "findings"))
    for currency, total in at_stake_by_currency(findings).items():
        cards.append((f"At stake a month ({currency})", svg.money(total, currency), "findings"))
    statuses = safety_statuses(sources)
    quarantined = sum(len(status["quarantined"]) for _, status, _ in statuses if status)
    leases = sum(len(status["leases"]) for _, status, _ in statuses if status)
    last, _ = dag_runs()
    failed = sum(1 for run in last or [] if run["state"] == "failed")
    cards += [("Quarantined files", f"{quarantined:,}", "safety"), ("Leases held", f"{leases:,}", "safety"),
              ("DAGs whose last run failed", f"{failed:,}", "safety")]
    return pages.overview_page(sources, cards)


def create_app():
    """The FastAPI app the plugin mounts; every route needs a logged-in Airflow user."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.responses import HTMLResponse

    app = FastAPI(title="Seedance", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(get_user)])

    @app.middleware("http")
    async def no_script(request, call_next):
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", PAGE_POLICY)
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return overview()

    @app.get("/cost", response_class=HTMLResponse)
    def cost() -> str:
        sources = find_sources()
        return pages.cost_page(sources, cost_sections(sources, datetime.now(UTC))[0])

    @app.get("/cost/report", response_class=HTMLResponse)
    def cost_report(root: int, month: str) -> HTMLResponse:
        """The month's report.html of the `root`-th chargeback root (only configured roots are served)."""
        from seedance_tasks import storage
        from seedance_tasks.dashboard.reading import MAX_REPORT_BYTES, read_root_file

        roots = find_sources().of("cost")
        if not MONTH.fullmatch(month) or not 0 <= root < len(roots):
            raise HTTPException(404, "no such cost root or month")
        location = storage.resolve(roots[root].uri)
        try:  # never through a symlink below the root: it could lead to any file the server reads
            html = read_root_file(location, f"month={month}/report.html", MAX_REPORT_BYTES)
        except FileNotFoundError:
            raise HTTPException(404, f"no report.html for {month}") from None
        except ValueError as exc:
            raise HTTPException(404, f"report.html for {month} not served: {exc}") from None
        return HTMLResponse(html.decode(errors="replace"), headers={"Content-Security-Policy": REPORT_POLICY})

    @app.get("/savings", response_class=HTMLResponse)
    def savings() -> str:
        return pages.savings_page(*savings_result())

    @app.get("/training", response_class=HTMLResponse)
    def training() -> str:
        sources = find_sources()
        return pages.training_page(sources, training_roots(sources))

    @app.get("/findings", response_class=HTMLResponse)
    def findings() -> str:
        sources = find_sources()
        return pages.findings_page(sources, findings_sections(sources))

    @app.get("/safety", response_class=HTMLResponse)
    def safety() -> str:
        sources = find_sources()
        runs, error = dag_runs()
        return pages.safety_page(sources, runs, error, safety_statuses(sources))

    @app.get("/api/status")
    def status() -> list[dict]:
        """Data safety of every root, as JSON."""
        return [{"pipeline": root.pipeline, "role": root.role, "origin": root.origin, **(found or {"error": error})}
                for root, found, error in safety_statuses(find_sources())]

    return app
