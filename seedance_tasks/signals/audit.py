"""One night of the audit: every rule evaluated (or skipped with its reason), findings merged with
the previous night's (first_seen kept, persisting ones updated, vanished ones resolved), outputs
written under `<root>/nights/<date>/` (findings.json, findings.parquet, report.html).

A night depends only on its inputs and on the nearest earlier night's findings, so re-running a
date writes the same outputs, and nights can be backfilled in order.
"""

from __future__ import annotations

import io
import json
from datetime import date
from typing import Any

from seedance_tasks import storage
from seedance_tasks.cost.money import LIMIT, display
from seedance_tasks.errors import InputError, UsageError
from seedance_tasks.signals.model import SEVERITIES, Finding, Skipped
from seedance_tasks.signals.registry import RULES
from seedance_tasks.signals.sources import Inputs

NIGHTS = "nights"


def evaluate_rule(rule_id: str, day: date, inputs: Inputs) -> dict[str, Any]:
    """`{"id", "fired", "findings"}` of one rule for `day`, or with `"skipped": reason`. A rule that
    raises (an unreadable source, a server error, a bug) never stops the others: it is skipped as
    `failed: <message>` with `"error": {"message", "hint", "retryable", "exit_code"}`, its open
    findings kept."""
    rule = RULES.get(rule_id)
    if rule is None:
        raise UsageError(f"unknown signal {rule_id!r}", hint="`seedance signals list` shows them")
    try:
        findings = rule.evaluate(day, inputs)
    except Skipped as why:
        return {"id": rule_id, "fired": False, "findings": [], "skipped": str(why)}
    except Exception as exc:  # one rule's failure is reported, the other rules still run
        from seedance_tasks.boundary import classify, debug_enabled

        if debug_enabled():
            raise  # --debug asks for the traceback
        error = classify(exc)
        return {"id": rule_id, "fired": False, "findings": [], "skipped": f"failed: {error.message}",
                "error": {"message": error.message, "hint": error.hint, "retryable": error.retryable,
                          "exit_code": error.exit_code}}
    for finding in findings:
        finding.first_seen = finding.last_seen = day.isoformat()
    findings.sort(key=lambda item: item.key)
    notes = inputs.notes(rule)
    return {"id": rule_id, "fired": bool(findings), "findings": [item.to_json() for item in findings],
            **({"warnings": notes} if notes else {})}


def _is_night(name: str) -> bool:
    """True for a folder named as a night (YYYY-MM-DD), not a copy or a stray folder beside them."""
    try:
        return date.fromisoformat(name).isoformat() == name
    except ValueError:
        return False


def _nights(root: storage.Location) -> list[str]:
    import pyarrow.fs as pafs

    base = root.child(NIGHTS)
    selector = pafs.FileSelector(base.path, recursive=False, allow_not_found=True)
    return sorted(info.base_name for info in base.fs.get_file_info(selector)
                  if info.type == pafs.FileType.Directory and _is_night(info.base_name))


def read_night(root: storage.Location, name: str) -> dict[str, Any]:
    """The findings document of night `name` under `root`; InputError naming the file when it is
    not one (damaged, truncated, or not a night's document)."""
    path = root.join(NIGHTS, name, "findings.json")
    try:
        document = storage.read_json(root.fs, path)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise InputError(f"{root.uri_of(path)}: unreadable night document ({str(exc)[:200]})",
                         hint="restore it from a backup, or move it aside and re-run that night") from None
    if not isinstance(document, dict) or not isinstance(document.get("signals"), list):
        raise InputError(f"{root.uri_of(path)}: not a night's findings document (no list of signals)",
                         hint="restore it from a backup, or move it aside and re-run that night")
    return document


def _is_day(text: Any) -> bool:
    return isinstance(text, str) and _is_night(text)


def _is_fix(fix: Any) -> bool:
    """None (no automatic fix), or a DAG id with a JSON object of conf, as `Finding.fix` holds it."""
    return fix is None or (isinstance(fix, dict) and isinstance(fix.get("dag_id"), str)
                           and isinstance(fix.get("conf", {}), dict))


def document_findings(document: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The well-formed open findings of a night's document (read back: untrusted), each as
    `Finding.to_json` writes it, and how many malformed ones were left out (missing fields, an
    unknown severity, an amount or a date that is not one)."""
    kept, dropped = [], 0
    for signal in document.get("signals") or []:
        for data in (signal.get("findings") if isinstance(signal, dict) else None) or []:
            try:
                finding = Finding.from_json(data)
                well_formed = (isinstance(finding.signal, str) and isinstance(finding.key, str)
                               and finding.severity in SEVERITIES and isinstance(finding.evidence, dict)
                               and _is_day(finding.first_seen) and _is_day(finding.last_seen)
                               and finding.at_stake.is_finite() and abs(finding.at_stake) < LIMIT
                               and isinstance(finding.currency, str) and _is_fix(finding.fix))
                data = finding.to_json() if well_formed else None
            except (TypeError, ValueError, ArithmeticError, AttributeError):
                well_formed = False
            if well_formed:
                kept.append(data)
            else:
                dropped += 1
    return kept, dropped


def previous_night(root: storage.Location | None, day: date, warnings: list[str] | None = None
                   ) -> dict[str, Any] | None:
    """The findings document of the nearest night before `day` under `root`, or None. A damaged
    document is passed over for the night before it, with a line in `warnings` naming it."""
    if root is None:
        return None
    earlier = [name for name in _nights(root) if name < day.isoformat()]
    for name in reversed(earlier):
        if not storage.is_file(root.fs, root.join(NIGHTS, name, "findings.json")):
            continue
        try:
            return read_night(root, name)
        except InputError as exc:
            if warnings is not None:
                warnings.append(f"{exc.message}: passed over, the findings of the night before it are carried on"
                                f"\n  hint: {exc.hint}")
    return None


def merge(day: date, results: list[dict[str, Any]], previous: dict[str, Any] | None,
          warnings: list[str] | None = None) -> dict[str, Any]:
    """The night's document: every rule in registry order, each finding marked new, persisting or
    escalated (first_seen from the previous night), and `resolved` the previous night's open
    findings that are gone (their rule ran and stayed silent). Malformed findings of `previous`
    are left out, counted in `warnings`."""
    found, dropped = document_findings(previous) if isinstance(previous, dict) else ([], 0)
    if dropped and warnings is not None:
        warnings.append(f"{dropped:,} malformed finding(s) of the night of {str(previous.get('date'))[:10]} left out "
                        "(missing fields, unknown severity or date): they are not carried on")
    before = {f["id"]: f for f in found}
    by_id = {result["id"]: result for result in results}
    signals, resolved = [], []
    for rule_id in RULES:
        result = dict(by_id.get(rule_id) or {"id": rule_id, "fired": False, "findings": [], "skipped": "not evaluated"})
        merged = []
        for data in result["findings"]:
            finding = Finding.from_json(data)
            old = before.get(finding.id)
            if old:
                finding.first_seen = old["first_seen"]
                rank = SEVERITIES.index
                finding.change = "escalated" if rank(finding.severity) > rank(old["severity"]) else "persisting"
            merged.append(finding.to_json())
        result["findings"] = merged
        signals.append(result)
        if "skipped" not in result:
            now = {f["id"] for f in merged}
            for old in before.values():
                if old["signal"] == rule_id and old["id"] not in now:
                    resolved.append({**old, "status": "resolved", "change": "resolved", "last_seen": old["last_seen"]})
        else:  # a rule that could not look keeps its findings open, unconfirmed
            for old in before.values():
                if old["signal"] == rule_id:
                    result["findings"].append({**old, "change": "unconfirmed"})
    return {"date": day.isoformat(), "signals": signals, "resolved": sorted(resolved, key=lambda f: f["id"])}


def run_audit(day: date, inputs: Inputs, out: str | None = None) -> dict[str, Any]:
    """Evaluate every rule for `day`, merge with the previous night under `out`, write the outputs
    there (when `out` is given) and return the night's document; `billing` and `warnings` in it say
    which billing rows the rules could not use, and `billing_skipped` why the billing rules were
    skipped (no source configured, or a source present but leaving no line), null when they ran."""
    root = storage.resolve(out) if out else None
    results = [evaluate_rule(rule_id, day, inputs) for rule_id in RULES]
    history: list[str] = []
    night = merge(day, results, previous_night(root, day, history), history)
    problems = inputs.billing_problems
    night["warnings"] = (problems.warnings(inputs.billing_uri) if problems else []) + failure_warnings(night) + history
    night["billing_skipped"] = inputs.billing_skipped
    if problems:
        night["billing"] = problems.to_json()
    if root is not None:
        night["outputs"] = write_night(root, night)
    return night


def failure_warnings(night: dict[str, Any]) -> list[str]:
    """One line per failure of the rules of `night` (the rules that failed with the same message
    together, its hint when it has one), and what a rule's inputs left out (`Inputs.notes`)."""
    failed: dict[tuple[str, str | None], list[str]] = {}
    notes = []
    for signal in night["signals"]:
        error = signal.get("error")
        if error:
            failed.setdefault((error["message"], error.get("hint")), []).append(signal["id"])
        notes += [f"signal {signal['id']}: {note}" for note in signal.get("warnings", [])]
    out = []
    for (message, hint), ids in failed.items():
        which = f"signal {ids[0]}" if len(ids) == 1 else f"signals {', '.join(ids)}"
        out.append(f"{which} failed, the other signals ran: {message}" + (f"\n  hint: {hint}" if hint else ""))
    return out + notes


def night_findings(night: dict[str, Any]) -> list[dict[str, Any]]:
    """The open findings (as JSON dicts) of a night's document, in registry order."""
    return [f for signal in night["signals"] for f in signal["findings"]]


def open_findings(root: str, warnings: list[str] | None = None) -> list[Finding]:
    """The findings still open after the latest night audited under `root` (a URI: `signals.root`),
    most money at stake first; [] when no night has been written there yet. For the dashboard.
    A damaged night is passed over for the one before it, and malformed findings are left out;
    given `warnings`, each gets an `error: ... hint: ...` line there naming the file."""
    location = storage.resolve(root)
    for name in reversed(_nights(location)):
        path = location.join(NIGHTS, name, "findings.json")
        if storage.is_file(location.fs, path):
            try:
                document = read_night(location, name)
            except InputError as exc:  # damaged: the night before it is the latest readable
                if warnings is not None:
                    warnings.append(f"error: {exc.message}: passed over for the night before it hint: {exc.hint}")
                continue
            kept, dropped = document_findings(document)
            if dropped and warnings is not None:
                warnings.append(f"error: {location.uri_of(path)}: {dropped:,} malformed finding(s) left out "
                                f"hint: re-run that night's audit (`seedance signals run --date {name}`)")
            found = [Finding.from_json(data) for data in kept]
            return sorted(found, key=lambda f: (-f.at_stake, f.id))
    return []


def write_night(root: storage.Location, night: dict[str, Any]) -> dict[str, str]:
    """findings.json, findings.parquet and report.html of `night` under `<root>/nights/<date>/`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root.child(NIGHTS, night["date"])
    folder.fs.create_dir(folder.path, recursive=True)
    document = {key: value for key, value in night.items() if key != "outputs"}
    storage.write_bytes_atomic(folder.fs, folder.join("findings.json"),
                               json.dumps(document, indent=1, sort_keys=True, default=str).encode())
    rows = night_findings(night) + night["resolved"]
    columns = ["id", "signal", "key", "severity", "status", "change", "summary", "at_stake", "currency", "owner",
               "first_seen", "last_seen"]
    table = pa.table({name: pa.array([None if row.get(name) is None else str(row[name]) for row in rows], pa.string())
                      for name in columns})
    table = table.append_column("evidence", pa.array([json.dumps(row["evidence"], sort_keys=True) for row in rows],
                                                     pa.string()))
    table = table.append_column("fix", pa.array([json.dumps(row.get("fix"), sort_keys=True) for row in rows], pa.string()))
    sink = io.BytesIO()
    pq.write_table(table, sink)
    storage.write_bytes_atomic(folder.fs, folder.join("findings.parquet"), sink.getvalue())
    storage.write_bytes_atomic(folder.fs, folder.join("report.html"), render_html(night).encode())
    return {name: folder.uri_of(folder.join(name)) for name in ("findings.json", "findings.parquet", "report.html")}


def render_html(night: dict[str, Any]) -> str:
    """A self-contained HTML page of the night: one row per signal, why the billing rules were
    skipped (if they were) and the warnings, then every open finding."""
    from seedance_tasks.dashboard.svg import escape as e  # bidi controls shown, not obeyed

    lines = [f"<!doctype html><meta charset=utf-8><title>Seedance signals {e(night['date'])}</title>",
             f"<h1>Cost signals, night of {e(night['date'])}</h1><table border=1>",
             "<tr><th>signal</th><th>state</th><th>findings</th></tr>"]
    for signal in night["signals"]:
        state = f"skipped: {signal['skipped']}" if "skipped" in signal else ("fired" if signal["fired"] else "silent")
        lines.append(f"<tr><td>{e(signal['id'])}</td><td>{e(state)}</td><td>{len(signal['findings'])}</td></tr>")
    lines.append("</table>")
    if night.get("billing_skipped"):
        lines.append(f"<p>Billing rules skipped: {e(night['billing_skipped'])}</p>")
    if night.get("warnings"):
        lines.append("<h2>Warnings</h2><ul>" + "".join(f"<li>{e(w)}</li>" for w in night["warnings"]) + "</ul>")
    lines.append("<h2>Open findings</h2><table border=1><tr><th>severity</th><th>finding</th><th>at stake"
                 "/month</th><th>since</th><th>fix</th></tr>")
    for f in night_findings(night):
        fix = f"{f['fix']['dag_id']} {json.dumps(f['fix']['conf'])}" if f.get("fix") else ""
        stake = display(f["at_stake"], f["currency"])
        lines.append(f"<tr><td>{e(f['severity'])}</td><td>{e(f['summary'])}</td><td>{e(stake)}</td>"
                     f"<td>{e(f['first_seen'])}</td><td>{e(fix)}</td></tr>")
    lines.append("</table>")
    return "\n".join(lines) + "\n"
