"""Task bodies of the `seedance_signals` DAG (imported inside tasks: parsing stays light)."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from seedance_tasks.dag_support import fail_fast

RULES_DIR = "rules"


def _settings():
    from seedance_tasks.config import load_settings

    return load_settings().signals


def _day(params: dict, logical_date) -> date:
    """The day audited: the `date` param; else the run's logical date (a scheduled run's data
    interval starts at 04:30 the day before it runs, so it audits that day, complete by then);
    else, for a run triggered without one, the day before it was triggered (the last whole day)."""
    from seedance_tasks.signals.sources import parse_day

    if params.get("date"):
        return parse_day(params["date"])
    if logical_date is None:
        from airflow.sdk import get_current_context

        return (get_current_context()["dag_run"].run_after - timedelta(days=1)).date()
    return logical_date.date()


def _root(params: dict):
    from seedance_tasks import storage
    from seedance_tasks.errors import ConfigError

    uri = params.get("out") or _settings().root
    if not uri:
        raise ConfigError("no output root for the signals", hint="set signals.root in config/seedance.yaml")
    return storage.resolve(uri)


def _inputs(params: dict):
    from seedance_tasks.signals.cli import inputs_for

    return inputs_for(_settings(), params.get("billing"), params.get("lakes"), params.get("checkpoints"),
                      params.get("metrics"))


@fail_fast
def prepare_task(params: dict, logical_date=None) -> dict[str, Any]:
    """The night audited and the rules to map over; skipped, with the reason, when no output root
    is configured (the `out` param, or `signals.root`)."""
    from seedance_tasks.dag_support import skip
    from seedance_tasks.signals.registry import RULES

    if not ((params or {}).get("out") or _settings().root):
        skip("no output root for the signals: set the `out` param, or signals.root in config/seedance.yaml")
    return {"date": _day(params, logical_date).isoformat(), "rules": list(RULES)}


def _retries_left() -> bool:
    """Whether Airflow runs this task again if it fails now (False outside an Airflow task)."""
    try:
        from airflow.sdk import get_current_context

        instance = get_current_context()["ti"]
    except (ImportError, RuntimeError, KeyError):
        return False
    return instance.try_number <= instance.max_tries


@fail_fast
def evaluate_task(rule_id: str, night: dict, params: dict) -> dict[str, Any]:
    """Evaluate one rule; its result is written to `<root>/nights/<date>/rules/<id>.json` (same
    content on a re-run) and summarised in XCom. A rule that failed for a transient reason (a
    source down) fails the task while Airflow has retries left; after the last, it is recorded
    failed and the night is published without it."""
    from seedance_tasks import storage
    from seedance_tasks.signals.audit import NIGHTS, evaluate_rule

    day = date.fromisoformat(night["date"])
    result = evaluate_rule(rule_id, day, _inputs(params))
    if (error := result.get("error")) and error.get("retryable") and _retries_left():
        from seedance_tasks.errors import UnavailableError

        raise UnavailableError(error["message"], hint=f"{error.get('hint') or 'check the source'}; Airflow "
                               "retries this rule, and after its last try the night is published with it failed")
    root = _root(params)
    folder = root.child(NIGHTS, night["date"], RULES_DIR)
    folder.fs.create_dir(folder.path, recursive=True)
    storage.write_json_atomic(folder.fs, folder.join(f"{rule_id}.json"), result)
    return {"id": rule_id, "fired": result["fired"], "findings": len(result["findings"]),
            **({"skipped": result["skipped"]} if "skipped" in result else {})}


@fail_fast
def publish_task(night: dict, params: dict) -> dict[str, Any]:
    """Merge the rules' results with the previous night's findings and write the night's outputs."""
    from seedance_tasks import storage
    from seedance_tasks.signals.audit import NIGHTS, failure_warnings, merge, previous_night, write_night
    from seedance_tasks.signals.registry import RULES

    root = _root(params)
    day = date.fromisoformat(night["date"])
    folder = root.child(NIGHTS, night["date"], RULES_DIR)
    results = [storage.read_json(folder.fs, folder.join(f"{rule_id}.json")) for rule_id in RULES
               if storage.is_file(folder.fs, folder.join(f"{rule_id}.json"))]
    history: list[str] = []
    document = merge(day, results, previous_night(root, day, history), history)
    document["warnings"] = failure_warnings(document) + history
    outputs = write_night(root, document)
    return {"date": night["date"], "outputs": outputs,
            "fired": [s["id"] for s in document["signals"] if s["fired"]],
            "skipped": {s["id"]: s["skipped"] for s in document["signals"] if "skipped" in s},
            "findings": sum(len(s["findings"]) for s in document["signals"]), "resolved": len(document["resolved"])}


def _night(params: dict, summary: dict) -> tuple[Any, dict]:
    from seedance_tasks import storage
    from seedance_tasks.signals.audit import NIGHTS

    root = _root(params)
    return root, storage.read_json(root.fs, root.join(NIGHTS, summary["date"], "findings.json"))


@fail_fast
def notify_task(summary: dict, params: dict) -> dict[str, Any]:
    """One message per new or escalated finding (e-mail, webhook); never twice."""
    from seedance_tasks.signals.notify import send_all

    root, night = _night(params, summary)
    return {"sent": send_all(night, root, _settings())}


@fail_fast
def fix_task(signal: str, summary: dict, params: dict, outlet_events, asset) -> dict[str, Any]:
    """Emit `asset`'s event carrying the fixes of `signal`'s new findings; skipped (no event) if none."""
    from airflow.sdk.exceptions import AirflowSkipException

    from seedance_tasks.signals.notify import fix_targets

    root, night = _night(params, summary)
    targets = fix_targets(night, signal, root)
    if not targets:
        raise AirflowSkipException(f"no new {signal} finding to fix")
    extra = {"signal": signal, "date": summary["date"], "apply": _settings().apply, "targets": targets}
    outlet_events[asset].extra = extra
    return extra
