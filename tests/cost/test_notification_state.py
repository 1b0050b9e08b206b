"""The notification state (`notified.json`, the outbox, the quota ledger) has one writer at a time:
the recovery's rules stage and the actions workflow, running at once, lose none of each other's entries."""

from __future__ import annotations

import json
import threading

from seedance_tasks.cost import actions
from seedance_tasks.cost.notify import Notifier
from seedance_tasks.cost.recover import recover_month
from tests.cost.helpers import line, write_focus, write_owners


def test_the_rules_stage_and_the_actions_notifying_at_once_keep_both_records(tmp_path, monkeypatch):
    out = tmp_path / "out"
    rows = [line("2024-09-01 00:00:00", "30", tags={"owner": "ml"})]
    owners = write_owners(tmp_path / "owners.yaml", budgets={"ml": {"amount": "10", "currency": "USD"}})
    inside, other_done = threading.Event(), threading.Event()
    outbox = Notifier._outbox
    main = threading.current_thread()

    def slow_outbox(self, record):  # the rules stage, between loading notified.json and writing it back
        if threading.current_thread() is main and not inside.is_set():
            inside.set()
            other_done.wait(3)
        outbox(self, record)

    monkeypatch.setattr(Notifier, "_outbox", slow_outbox)

    def the_actions_workflow():  # e.g. the previous month's confirmation request, sent meanwhile
        inside.wait(30)
        actions.notify(str(out), "ask:2024-08:web", "web", "Confirm the 2024-08 chargeback of web", "...",
                       {"month": "2024-08"})
        other_done.set()

    other = threading.Thread(target=the_actions_workflow)
    other.start()
    recover_month(month="2024-09", billing=str(write_focus(tmp_path / "b.csv", rows)), owners=str(owners),
                  out=str(out), apply=True, backfill=False)
    other.join(60)
    state = out / "_seedance" / "cost"
    notified = json.loads((state / "notified.json").read_text())
    assert {"budget:ml:2024-09", "ask:2024-08:web"} <= set(notified)
    sent = [json.loads(row)["key"] for row in (state / "outbox.jsonl").read_text().splitlines()]
    assert sorted(sent) == ["ask:2024-08:web", "budget:ml:2024-09"]
    assert not list((out / "_seedance" / "leases").glob("cost-notifications*"))  # released
