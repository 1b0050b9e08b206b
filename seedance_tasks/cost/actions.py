"""The cost actions workflow of a closed month, as steps the DAG `seedance_cost_actions` runs:

    plan -> isolate (within 48 h) -> confirm (owners, within 72 h; reminders while waiting)
         -> settle (on the 5th working day: deduct confirmed amounts, apply budget freezes)

Inputs are what the cost recovery published for the month (`OUT/month=M/summary.json`: charges
per owner and currency, idle resources, over-budget owners). Every action is a dry run unless the
run applies, and is keyed in the budget ledger (`budget_ledger.py`): a retried task or a re-run
month finds its key and repeats nothing (no second snapshot, deduction, freeze or reminder).
Deadlines come from the working-day calendar (`workdays.py`, settings `cost.actions`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from seedance_tasks import storage
from seedance_tasks.cost.budget_ledger import BudgetLedger, Entry, entry
from seedance_tasks.cost.money import display, parse_amount, rounded
from seedance_tasks.cost.workdays import CURRENCY_RE, Clock, WorkCalendar, close_instant, month_close
from seedance_tasks.errors import InputError, UsageError
from seedance_tasks.notifiers import markdown_literal

CONFIRM, DISPUTE = "Confirm", "Dispute"
UNALLOCATED = "unallocated"


def _settings():
    from seedance_tasks.config import load_section

    return load_section("cost")


def next_month(month: str) -> str:
    """The month after `month` (YYYY-MM)."""
    return month_close(month).strftime("%Y-%m")


def ledger_of(out: str, settings=None) -> BudgetLedger:
    """The budget ledger under the cost outputs root `out`."""
    settings = settings or _settings()
    return BudgetLedger(out, lock_wait_s=settings.actions.lock_wait)


def notifier_of(out: str, settings=None, owners: str | None = None):
    """The owners' notifier (`seedance_tasks.cost.notify.Notifier`), state beside the cost
    pipeline's; with the owners file, each owner's own contacts (e-mail, webhook) from the CMDB."""
    from seedance_tasks.cost.notify import Notifier

    settings = settings or _settings()
    root = storage.resolve(out)
    state = settings.state_uri or root.uri_of(root.join(storage.SEEDANCE_DIR, "cost"))
    return Notifier(storage.resolve(state), settings.notifier, settings.notifier_kwargs, owners=owners or None)


def notify(out: str, key: str, owner: str, subject: str, message: str, details: dict[str, Any],
           settings=None, owners: str | None = None) -> bool:
    """`Notifier.send` under a lease of the notification state (concurrent tasks of a run, e.g.
    two owners' confirmation tasks, never lose each other's outbox lines or keys). True if sent now."""
    from seedance_tasks.cost.notify import state_lease

    settings = settings or _settings()
    with state_lease(storage.resolve(out), settings.actions.lock_wait):
        return notifier_of(out, settings, owners).send(key, owner, subject, message, details)


EVENT_HINT = ("this seedance_cost_statements event is not one seedance_cost_recovery emits: trigger "
              "seedance_cost_actions by hand with the month and out params")


def statements_event(extra: Any) -> dict[str, Any]:
    """The fields of a `seedance_cost_statements` event's extra that start the actions, checked one
    by one (an event can be posted by anyone with the REST API): `month` (YYYY-MM or absent), `out`
    (the month's folder `ROOT/month=M` or the root, a string, or absent; returned as the root) and
    `backfill` (a JSON boolean or absent). A malformed field is an InputError naming it."""
    from seedance_tasks.cost.workdays import parse_month

    if not isinstance(extra, dict):
        raise InputError(f"event extra is a {type(extra).__name__}, not an object", hint=EVENT_HINT)
    month, out, backfill = extra.get("month"), extra.get("out"), extra.get("backfill")
    if month is not None:
        try:
            parse_month(month)
        except UsageError as exc:
            raise InputError(f"event field 'month': {exc.message}", hint=EVENT_HINT) from None
    if out is not None and (not isinstance(out, str) or not out.strip()):
        raise InputError(f"event field 'out' is {out!r}, not a URI or path", hint=EVENT_HINT)
    if backfill is not None and not isinstance(backfill, bool):
        raise InputError(f"event field 'backfill' is {backfill!r}, not true or false", hint=EVENT_HINT)
    root = out
    if out is not None and (found := re.search(r"/month=([0-9]{4}-[0-9]{2})/?$", out)):
        if month is not None and found.group(1) != month:
            raise InputError(f"event field 'out' ({out}) is the folder of month={found.group(1)}, but its "
                             f"'month' is {month}", hint=EVENT_HINT)
        root = out[:found.start()] or "/"
    return {"month": month, "out": root, "backfill": bool(backfill)}


def clock_of(month: str, out: str, *, apply: bool, now: datetime, settings=None) -> Clock:
    """The month's clock: anchored at the close (00:00 on the 1st, calendar time zone), or with
    `anchor: run_start` at the month's first applied run (kept in the ledger, so re-runs agree)."""
    settings = settings or _settings()
    actions = settings.actions
    anchor = close_instant(month, actions.timezone)
    if actions.anchor == "run_start":
        anchor = now
        if apply:
            key = f"anchor:{month}"
            ledger = ledger_of(out, settings)
            ledger.record(entry(key, "anchor", month, at=now))
            anchor = ledger.get(key).at
    return Clock(month_close(month), anchor, actions.day_length)


def _summary(month: str, out: str) -> dict[str, Any]:
    root = storage.resolve(out)
    path = root.join(f"month={month}", "summary.json")
    if not storage.is_file(root.fs, path):
        raise InputError(f"no published statements for {month}: {root.uri_of(path)} does not exist",
                         hint="run seedance_cost_recovery for that month first (its event starts this workflow)")
    try:
        summary = _PublishedMonth.model_validate(storage.read_json(root.fs, path))
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        problem = (f"{'.'.join(map(str, exc.errors()[0]['loc']))}: {exc.errors()[0]['msg']}"
                   if hasattr(exc, "errors") else repr(exc))
        raise InputError(f"{root.uri_of(path)}: not a cost summary ({problem})",
                         hint="re-run seedance_cost_recovery for the month") from None
    charges: dict[str, dict[str, str]] = {}
    for currency, by_currency in sorted(summary.currencies.items()):
        for owner, amount in by_currency.by_owner.items():
            if amount:
                charges.setdefault(owner, {})[currency] = str(amount)
    return {"charges": dict(sorted(charges.items())),
            "idle": [item.model_dump(mode="json") for item in summary.idle],
            "over_budget": [item.model_dump(mode="json") for item in summary.over_budget]}


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


def _amount(value: Any) -> Decimal:
    """An amount as the recovery writes one (a decimal string, `money.parse_amount`: finite, below
    10**18, at most 12 places); ValueError otherwise, which would break the rounding of a deduction."""
    if not isinstance(value, str | int | Decimal) or isinstance(value, bool):
        raise ValueError(f"not an amount: {value!r}")
    return parse_amount(str(value))


def _currency(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(CURRENCY_RE, value):
        raise ValueError(f"not a currency code: {value!r}")
    return value


Amount = Annotated[Decimal, BeforeValidator(_amount)]
Currency = Annotated[str, BeforeValidator(_currency)]


class _Currency(_Lenient):
    by_owner: dict[str, Amount]


class _Idle(_Lenient):
    resource_id: str
    owner: str | None = None


class _OverBudget(_Lenient):
    owner: str
    spend: Amount
    budget: Amount
    currency: Currency
    approved: bool = False


class _PublishedMonth(_Lenient):
    """What the workflow reads of a month's `summary.json` (written by the cost recovery), checked:
    the file is input like any other (a hand edit must be an error, not a crash): amounts as the
    recovery writes them, currencies ISO 4217 codes."""

    currencies: dict[Currency, _Currency]
    idle: list[_Idle] = []
    over_budget: list[_OverBudget] = []


def _approvers(owners_uri: str | None) -> dict[str, list[str]]:
    if not owners_uri:
        return {}
    from seedance_tasks.cost.owners import load_owners

    return dict(getattr(load_owners(owners_uri), "approvers", {}) or {})


def _money(charges: dict[str, str]) -> str:
    return ", ".join(display(amount, currency) for currency, amount in sorted(charges.items()))


def plan(*, month: str, out: str, owners: str | None = None, apply: bool = False, now: datetime | None = None,
         settings=None) -> dict[str, Any]:
    """What the workflow will do for `month` (JSON-able; the DAG passes it to every step).

    Reads the published summary (InputError if the month was not published), fixes the clock and
    the deadlines (isolation, reminders, confirmation, deduction day), and, when applying, lists
    one confirmation request per charged owner (`confirmations`). A dry run asks nobody and
    waits for nothing (`waits` are now); the real deadlines are still reported.
    """
    settings = settings or _settings()
    actions = settings.actions
    month_close(month)
    now = now or datetime.now(UTC)
    found = _summary(month, out)
    clock = clock_of(month, out, apply=apply, now=now, settings=settings)
    calendar = WorkCalendar.from_settings(actions)
    deduct_day = calendar.nth_working_day(month_close(month), actions.deduct_on_working_day)
    deadlines = {
        "anchor": clock.anchor.isoformat(),
        "isolate_by": clock.after_hours(actions.isolate_within_hours).isoformat(),
        "remind_at": [clock.after_hours(h).isoformat() for h in sorted(actions.reminders_after_hours)
                      if h < actions.confirm_within_hours],
        "confirm_by": clock.after_hours(actions.confirm_within_hours).isoformat(),
        "deduct_day": deduct_day.isoformat(),
        "deduct_at": max(clock.at_day(deduct_day), clock.after_hours(actions.confirm_within_hours)).isoformat(),
    }
    owners = owners or settings.owners_file
    approvers = _approvers(owners)
    charged = [owner for owner in found["charges"] if owner and owner != UNALLOCATED]
    confirmations = []
    if apply:
        for owner in charged:
            users = approvers.get(owner) or []
            confirmations.append({
                "request": {"owner": owner, "month": month, "out": out, "confirm_by": deadlines["confirm_by"],
                            "day_length_s": clock.day_length_s, "owners": owners},
                "subject": f"Confirm the {month} chargeback of {owner}: {_money(found['charges'][owner])}",
                "body": _confirmation_body(month, owner, found, deadlines),
                "assigned_users": [{"id": user, "name": user} for user in users] or None,
            })
    return {
        "month": month, "out": out, "owners": owners, "apply": bool(apply), "mode": "apply" if apply else "dry-run",
        "ledger": ledger_of(out, settings).uri, "deadlines": deadlines,
        "waits": {"deduct_at": deadlines["deduct_at"] if apply else now.isoformat()},
        "charges": found["charges"], "idle": found["idle"], "over_budget": found["over_budget"],
        "confirmations": confirmations, "day_length_s": clock.day_length_s,
    }


def _confirmation_body(month: str, owner: str, found: dict[str, Any], deadlines: dict[str, Any]) -> str:
    idle = [markdown_literal(item["resource_id"]) for item in found["idle"] if item.get("owner") == owner]
    lines = [f"**{markdown_literal(owner)}** is charged **{_money(found['charges'][owner])}** for {month}.", "",
             f"*{CONFIRM}*: the amount is deducted from your budget pool on {deadlines['deduct_day']} "
             f"(working day {_settings().actions.deduct_on_working_day} after the close). *{DISPUTE}*: nothing is "
             "deducted; FinOps reviews the statement with you. Give a reason either way.",
             "", f"Answer by {deadlines['confirm_by']}."]
    if idle:
        lines += ["", "Idle resources snapshotted and isolated for review: " + ", ".join(idle)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- isolate (48 h)


# AWS's answers that one resource cannot be handled this way (an instance-store-backed instance
# cannot be stopped, a database in a state that cannot be snapshotted...): retrying will not help
PERMANENT_REFUSALS = frozenset({
    "UnsupportedOperation", "IncorrectInstanceState", "IncorrectState", "InvalidDBInstanceState",
    "InvalidDBInstanceStateFault", "OperationNotPermitted", "InvalidParameterCombination", "InvalidParameterValue",
})


def _refusal(exc: BaseException) -> str | None:
    """'Code: message' when `exc` is AWS refusing the request for this resource for good, else None."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    error = response.get("Error") or {}
    code = str(error.get("Code") or "")
    return f"{code}: {error.get('Message') or ''}".strip() if code in PERMANENT_REFUSALS else None


def isolate(data: dict[str, Any], *, isolator=None, now: datetime | None = None, settings=None) -> dict[str, Any]:
    """Snapshot and isolate the month's idle resources (dry run: the plan only).

    A resource whose key is in the ledger was handled before and is not touched again; one
    younger than the tuning window is flagged (ledger + owner notified), not acted on; ids that
    are not EC2/EBS/RDS resources are reported as skipped; one AWS refuses for good (e.g. an
    instance-store instance cannot be stopped) is reported in `failed` and the others go on.
    Applying holds the month's isolation lease: a second attempt waits (up to `lock_wait`) and
    then sees the first one's ledger entries. Returns what was done and planned.
    """
    from seedance_tasks.cost.isolation import Isolator

    settings = settings or _settings()
    now = now or datetime.now(UTC)
    month, out, apply = data["month"], data["out"], data["apply"]
    isolator = isolator or Isolator(settings, now=now)
    if not apply:
        return _isolate(data, isolator, now, settings)
    from seedance_tasks import lease

    # one applying attempt at a time per month: a retry started while a lost attempt still runs
    # waits for it, then finds its ledger entries, and snapshots nothing twice
    with lease.holding(storage.resolve(out), f"cost-isolate-{month}",
                       holder=f"isolate:{os.getpid()}:{secrets.token_hex(4)}", purpose=f"isolate idle resources of {month}",
                       wait_s=settings.actions.lock_wait):
        return _isolate(data, isolator, now, settings)


def _isolate(data: dict[str, Any], isolator, now: datetime, settings) -> dict[str, Any]:
    from seedance_tasks.cost.isolation import action_key, parse_resource

    month, out, apply = data["month"], data["out"], data["apply"]
    ledger = ledger_of(out, settings)
    done = ledger.load()
    result: dict[str, Any] = {"mode": data["mode"], "isolated": [], "flagged": [], "skipped": [], "missing": [],
                              "failed": [], "done_before": [], "snapshots": [], "planned": [],
                              "within_deadline": now <= datetime.fromisoformat(data["deadlines"]["isolate_by"])}
    for item in data["idle"]:
        resource_id, owner = item["resource_id"], item.get("owner") or UNALLOCATED
        resource = parse_resource(resource_id)
        if resource is None:
            result["skipped"].append({"resource_id": resource_id, "reason": "not an EC2 instance, EBS volume or "
                                      "RDS instance"})
            continue
        key = action_key(month, resource)
        flag_key = f"flag:{month}:{resource.ident}"
        if key in done or flag_key in done:
            previous = done.get(key) or done[flag_key]
            result["done_before"].append({"resource_id": resource_id, "kind": previous.kind,
                                          "snapshots": previous.details.get("snapshots", [])})
            continue
        try:
            outcome = isolator.isolate(resource, month, owner, apply=apply)
        except Exception as exc:  # noqa: BLE001 - AWS refusing one resource must not stop the others
            refusal = _refusal(exc)
            if refusal is None:
                raise  # throttling, credentials, an endpoint down: the task's retry is the fix
            result["failed"].append({"resource_id": resource_id, "owner": owner, "error": refusal,
                                     "hint": "isolate it by hand or exclude it; the next run tries again"})
            continue
        row = {"resource_id": resource_id, "owner": owner, "steps": outcome["steps"],
               "snapshots": outcome["snapshots"]}
        if outcome["outcome"] == "missing":
            result["missing"].append(row)
            continue
        if outcome["outcome"] == "flagged":
            result["flagged"].append(row)
            if apply:
                ledger.record(entry(flag_key, "flag", month, owner=owner, at=now, resource_id=resource_id,
                                    reason=outcome["steps"][0], created=outcome.get("created")))
                notify(out, flag_key, owner, f"{resource_id} is idle but young: flagged, left running",
                              f"{resource_id} was idle through the end of {month}, but it is younger than the "
                              "tuning window, so it was only flagged for review, not snapshotted or stopped.",
                       {"month": month, "resource_id": resource_id}, settings, data.get("owners"))
            else:
                result["planned"].append(f"flag {resource_id} (younger than the tuning window)")
            continue
        if not apply:
            result["planned"] += [f"{resource_id}: {step}" for step in outcome["steps"]]
            continue
        ledger.record(entry(key, "isolation", month, owner=owner, at=now, resource_id=resource_id,
                            snapshots=outcome["snapshots"], steps=outcome["steps"]))
        result["isolated"].append(row)
        result["snapshots"] += outcome["snapshots"]
        notify(out, key, owner, f"Idle {resource_id} snapshotted and isolated for cost review",
                      f"{resource_id} was idle through the end of {month}. It was snapshotted "
                      f"({', '.join(outcome['snapshots']) or 'no volume'}) and isolated: "
                      + "; ".join(outcome["steps"]) + ". Start it again if you still need it.",
                      {"month": month, "resource_id": resource_id, "snapshots": outcome["snapshots"]}, settings,
                      data.get("owners"))
    return result


# ---------------------------------------------------------------------------- confirm (72 h)


def confirm_key(month: str, owner: str) -> str:
    return f"confirm:{month}:{owner}"


def decision(out: str, month: str, owner: str, settings=None) -> Entry | None:
    """The owner's recorded answer for the month (confirmed, disputed, unanswered), or None."""
    return ledger_of(out, settings).get(confirm_key(month, owner))


def ask(request: dict[str, Any], settings=None) -> bool:
    """Tell the owner a confirmation is waiting (once per month and owner); True if sent now."""
    owner, month = request["owner"], request["month"]
    return notify(request["out"], f"ask:{month}:{owner}", owner, request["subject"],
                  request["body"] + "\n\nAnswer in Airflow: Browse > Required actions.",
                  {"month": month, "confirm_by": request["confirm_by"]}, settings, request.get("owners"))


REASON_LIMIT = 2000
"""Characters of an owner's reason kept in the budget ledger (the rest is cut, marked with …)."""


def _reason_text(reason: Any) -> str:
    """An owner's reason as the ledger keeps it: text (a number or list a REST client sent, as its
    JSON), stripped, at most `REASON_LIMIT` characters."""
    if reason is None:
        return ""
    text = (reason if isinstance(reason, str) else json.dumps(reason, default=str, ensure_ascii=False)).strip()
    return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT - 1] + "…"


def _responder(by: Any) -> str | None:
    """Who answered: the user's name, else id, as text (Airflow's HITL user; anything else: None)."""
    if not isinstance(by, dict):
        return None
    found = next((by[key] for key in ("name", "id") if isinstance(by.get(key), (str, int)) and by.get(key) != ""),
                 None)
    return None if found is None else str(found)


def record_decision(request: dict[str, Any], chosen: str | None, reason: Any, by: dict[str, Any] | None,
                    settings=None) -> Entry:
    """Record the owner's answer (`Confirm`, `Dispute`, or None: no answer by the deadline) once;
    a later answer for the same month and owner never replaces the first. Returns the entry kept.
    Whatever a REST client sent as the reason is kept as text (`_reason_text`): an answer is
    never lost to the shape of its reason."""
    owner, month = request["owner"], request["month"]
    status = {CONFIRM: "confirmed", DISPUTE: "disputed", None: "unanswered"}.get(chosen)
    if status is None:
        raise UsageError(f"unknown answer {chosen!r} for {owner} {month}", hint=f"answer {CONFIRM} or {DISPUTE}")
    ledger = ledger_of(request["out"], settings)
    key = confirm_key(month, owner)
    ledger.record(entry(key, "confirmation", month, owner=owner, status=status, reason=_reason_text(reason),
                        by=_responder(by)))
    return ledger.get(key)


def pending(data: dict[str, Any], settings=None) -> list[str]:
    """Charged owners asked to confirm who have not answered yet."""
    entries = ledger_of(data["out"], settings).load()
    return [ask_["request"]["owner"] for ask_ in data["confirmations"]
            if confirm_key(data["month"], ask_["request"]["owner"]) not in entries]


def remind(data: dict[str, Any], index: int, settings=None) -> list[str]:
    """Reminder number `index` to every owner who has not answered; each at most once. Returns
    the owners reminded now."""
    month, sent = data["month"], []
    for owner in pending(data, settings):
        asked = next(r for r in data["confirmations"] if r["request"]["owner"] == owner)
        if notify(data["out"], f"remind:{month}:{owner}:{index}", owner, f"Reminder: {asked['subject']}",
                  asked["body"] + f"\n\nReminder {index + 1}: no answer yet.",
                  {"month": month, "confirm_by": asked["request"]["confirm_by"], "reminder": index + 1}, settings,
                  data.get("owners")):
            sent.append(owner)
    return sent


def next_reminder(data: dict[str, Any], now: datetime, settings=None) -> tuple[int, datetime] | None:
    """(index, when) of the next reminder still due before the confirmation deadline, or None when
    nothing is left to remind (dry run, everyone answered, deadline passed, no reminders left)."""
    if not data["apply"] or not pending(data, settings):
        return None
    notified = notifier_of(data["out"], settings).ledger
    confirm_by = datetime.fromisoformat(data["deadlines"]["confirm_by"])
    for index, when in enumerate(datetime.fromisoformat(t) for t in data["deadlines"]["remind_at"]):
        if when >= confirm_by or now >= confirm_by:
            return None
        if any(f"remind:{data['month']}:{owner}:{index}" not in notified for owner in pending(data, settings)):
            return index, when
    return None


def response_timeout(request: dict[str, Any], now: datetime) -> timedelta:
    """How long the owner still has: until the deadline, and at least one calendar day."""
    left = datetime.fromisoformat(request["confirm_by"]) - now
    return max(left, timedelta(seconds=request.get("day_length_s") or 86400))


# ---------------------------------------------------------------------------- settle (5th working day)


def settle(data: dict[str, Any], *, now: datetime | None = None, settings=None) -> dict[str, Any]:
    """Deduct every confirmed charge from the owner's budget pool (one ledger entry per owner and
    currency, the charge `money.rounded` to the currency's minor unit: the amount the plan, the
    confirmation and the notification show) and apply the budget freezes of the over-budget rule
    (not approved: next month's budget frozen); disputed or unanswered charges are not deducted.
    Dry run: the plan only.
    Idempotent: an entry already in the ledger is neither recorded nor notified again."""
    settings = settings or _settings()
    now = now or datetime.now(UTC)
    month, out, apply = data["month"], data["out"], data["apply"]
    ledger = ledger_of(out, settings)
    entries = ledger.load()
    result: dict[str, Any] = {"mode": data["mode"], "deducted": [], "not_deducted": [], "frozen": [],
                              "done_before": [], "planned": []}
    new: list[Entry] = []
    for owner, charges in data["charges"].items():
        if owner == UNALLOCATED:
            continue
        answer = entries.get(confirm_key(month, owner))
        status = answer.details.get("status") if answer else "no answer recorded"
        for currency, amount in sorted(charges.items()):
            key = f"deduct:{month}:{owner}:{currency}"
            deduction = rounded(amount, currency)
            if not apply:
                result["planned"].append(f"deduct {display(deduction, currency)} from {owner}'s budget pool "
                                         "if the owner confirms")
            elif key in entries:
                result["done_before"].append(key)
            elif status == "confirmed":
                new.append(entry(key, "deduction", month, owner=owner, amount=deduction, currency=currency,
                                 at=now, confirmed_by=answer.details.get("by"), reason=answer.details.get("reason")))
            else:
                result["not_deducted"].append({"owner": owner, "currency": currency, "amount": amount,
                                               "status": status})
    target = next_month(month)
    for item in data["over_budget"]:
        if item.get("approved"):
            continue
        key = f"freeze:{item['owner']}:{target}"
        if not apply:
            spent, budget = display(item["spend"], item["currency"]), display(item["budget"], item["currency"])
            result["planned"].append(f"freeze {item['owner']}'s {target} budget ({spent} spent against {budget})")
        elif key in entries:
            result["done_before"].append(key)
        else:
            new.append(entry(key, "freeze", month, owner=item["owner"], amount=Decimal(item["spend"]),
                             currency=item["currency"], at=now, budget=item["budget"], frozen_month=target,
                             over_percent=item.get("over_percent")))
    if new:
        added = ledger.update(lambda _entries: new)
        for made in added:
            if made.kind == "deduction":
                result["deducted"].append(made.key)
                shown = display(made.amount, made.currency)
                notify(out, made.key, made.owner, f"{month} chargeback deducted: {shown}",
                              f"{shown} (confirmed) was deducted from the budget pool of "
                              f"{made.owner} for {month}.", {"month": month, "amount": str(made.amount),
                                                             "currency": made.currency}, settings, data.get("owners"))
            else:
                result["frozen"].append(made.key)
                budget = display(made.details["budget"], made.currency)
                notify(out, made.key, made.owner, f"{made.details['frozen_month']} budget frozen",
                              f"{made.owner} spent {display(made.amount, made.currency)} in {month} against a budget of "
                              f"{budget}: the {made.details['frozen_month']} budget is frozen "
                              "until an ROI document is approved.", {"month": month}, settings, data.get("owners"))
    return result


# ---------------------------------------------------------------------------- the dashboard's view


def owner_positions(out: str) -> list[dict[str, Any]]:
    """Per owner, month and currency: deducted, frozen (the month frozen), and the answer, from
    the ledger of `out` (Decimals as recorded: deductions at the currency's minor unit)."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    entries = BudgetLedger(out).load()
    for item in entries.values():
        if item.kind not in ("deduction", "freeze") or not item.owner:
            continue
        row = rows.setdefault((item.owner, item.month, item.currency or ""), {
            "owner": item.owner, "month": item.month, "currency": item.currency, "deducted": Decimal(0),
            "frozen": None, "answer": None})
        if item.kind == "deduction":
            row["deducted"] += item.amount or 0
        else:
            row["frozen"] = item.details.get("frozen_month")
    for (owner, month, _), row in rows.items():
        answer = entries.get(confirm_key(month, owner))
        row["answer"] = answer.details.get("status") if answer else None
    for item in entries.values():  # disputed or unanswered: shown, with nothing deducted
        if item.kind == "confirmation" and item.details.get("status") != "confirmed" and not any(
                key[0] == item.owner and key[1] == item.month for key in rows):
            rows[(item.owner, item.month, "")] = {"owner": item.owner, "month": item.month, "currency": None,
                                                  "deducted": None, "frozen": None, "answer": item.details["status"]}
    return [rows[key] for key in sorted(rows)]
