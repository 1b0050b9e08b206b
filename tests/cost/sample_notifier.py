"""A real Airflow notifier (BaseNotifier subclass) that appends to a file, for the notifier test."""

from __future__ import annotations

from airflow.sdk import BaseNotifier


class FileNotifier(BaseNotifier):
    template_fields = ("text",)

    def __init__(self, path: str, text: str):
        super().__init__()
        self.path = path
        self.text = text

    def notify(self, context):
        with open(self.path, "a") as handle:
            handle.write(self.text + "\n")
