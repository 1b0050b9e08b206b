"""The Seedance page in Airflow's UI: what each pipeline keeps aside for people to look at.

Served by the plugin in `plugins/seedance_plugin.py` under `/seedance/`, behind Airflow's own
login (the JWT the UI holds): plugin endpoints are not protected by Airflow on their own.
Read-only; it lists the quarantine (files set aside, with the reason) and the trash (old data
awaiting purge) of the configured dataset roots.
"""

from __future__ import annotations

import html

from seedance_tasks import storage


def configured_roots() -> list[str]:
    """Dataset roots the page reports on: `compaction.default_uri` (more as pipelines add them)."""
    from seedance_tasks.config import load_settings

    settings = load_settings()
    return [uri for uri in (settings.compaction.default_uri,) if uri]


def root_status(uri: str) -> dict:
    """Quarantined files (with reasons) and trash runs (files, bytes) under one root."""
    root = storage.resolve(uri)
    quarantined = []
    for info in storage.list_files(root.child(storage.QUARANTINE_DIR), include_hidden=True):
        if info.path.endswith(".reason.json"):
            reason = storage.read_json(root.fs, info.path)
            quarantined.append({"file": reason.get("file"), "reason": reason.get("reason"),
                                "run_id": reason.get("run_id"), "at": reason.get("at")})
    trash: dict[str, dict] = {}
    trash_root = root.child(storage.TRASH_DIR)
    for info in storage.list_files(trash_root, include_hidden=True):
        run_id = trash_root.relative(info.path).split("/", 1)[0]
        entry = trash.setdefault(run_id, {"run_id": run_id, "files": 0, "bytes": 0})
        entry["files"] += 1
        entry["bytes"] += info.size or 0
    return {"uri": root.uri, "quarantined": quarantined, "trash": sorted(trash.values(), key=lambda t: t["run_id"])}


def render_page(statuses: list[dict]) -> str:
    """The page's HTML (escaped; no scripts, no external resources)."""
    from seedance_tasks.units import format_size

    parts = ["<!doctype html><meta charset=utf-8><title>Seedance</title>",
             "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}</style>",
             "<h1>Seedance</h1>"]
    if not statuses:
        parts.append("<p>No dataset root configured: set <code>compaction.default_uri</code> in "
                     "<code>config/seedance.yaml</code>.</p>")
    for status in statuses:
        parts.append(f"<h2>{html.escape(status['uri'])}</h2><h3>Quarantine</h3>")
        parts.append(_table(["file", "reason", "run"],
                            [[q["file"], q["reason"], q["run_id"]] for q in status["quarantined"]],
                            "<p>Nothing quarantined.</p>"))
        parts.append("<h3>Trash (awaiting <code>seedance trash purge</code>)</h3>")
        parts.append(_table(["run", "files", "bytes"],
                            [[t["run_id"], t["files"], format_size(t["bytes"])] for t in status["trash"]],
                            "<p>Empty.</p>"))
    return "".join(parts)


def _table(headers: list[str], rows: list[list], empty: str) -> str:
    """An HTML table of `rows` (every cell escaped), or `empty` when there are none."""
    if not rows:
        return empty
    head = "".join(f"<th>{name}</th>" for name in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def create_app():
    """The FastAPI app the plugin mounts; every route needs a logged-in Airflow user."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi import Depends, FastAPI
    from fastapi.responses import HTMLResponse

    app = FastAPI(title="Seedance", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse, dependencies=[Depends(get_user)])
    def index() -> str:
        return render_page([root_status(uri) for uri in configured_roots()])

    @app.get("/api/status", dependencies=[Depends(get_user)])
    def status() -> list[dict]:
        return [root_status(uri) for uri in configured_roots()]

    return app


