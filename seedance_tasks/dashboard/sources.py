"""What the dashboard reports on: every pipeline root of the config, and the demo workspace's.

Roots come from `config/seedance.yaml` (`compaction.default_uri`, `checkpoint.store` and
`.inbox`, `lifecycle.store` and its tier locations, `training.checkpoint_store` and `.log_dir`,
`cost.out_uri`, `signals.root`) and, when `SEEDANCE_WORKSPACE` names a folder (`make demo` and
`make airflow` set it), the folders the demo writes there. Nothing configured is a state the pages explain.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

WORKSPACE_ENV = "SEEDANCE_WORKSPACE"
RUN_LOGS = "run logs"  # training: <log_dir>/<run>/telemetry/ (see training.airflow_tasks)
FINDINGS = "findings"  # signals: nights/<date>/findings.json (see signals.audit)

# (pipeline, role, setting) of each configured root; the setting is `section.key[.key...]`.
CONFIGURED = (
    ("compaction", "lake", "compaction.default_uri"),
    ("checkpoints", "inbox", "checkpoint.inbox"),
    ("checkpoints", "store", "checkpoint.store"),
    ("lifecycle", "store", "lifecycle.store"),
    ("lifecycle", "warm tier", "lifecycle.tiers.warm.uri"),
    ("lifecycle", "cold tier", "lifecycle.tiers.cold.uri"),
    ("training", "checkpoint store", "training.checkpoint_store"),
    ("training", RUN_LOGS, "training.log_dir"),
    ("cost", "chargeback output", "cost.out_uri"),
    ("signals", FINDINGS, "signals.root"),
)
# (pipeline, role, folder under the workspace) of what `seedance_tasks.demo` writes (see each demo.py).
DEMO = (
    ("compaction", "lake", "lake"),
    ("shards", "shard output", "images-shards"),
    ("preprocess", "output", "images-preprocessed"),
    ("checkpoints", "inbox", "checkpoints/inbox"),
    ("checkpoints", "store", "checkpoints/store"),
    ("training", "checkpoint store", "training-checkpoints"),
    ("training", RUN_LOGS, "training-logs"),
    ("lifecycle", "store", "lifecycle/store"),
    ("lifecycle", "warm tier", "lifecycle/warm"),
    ("lifecycle", "cold tier", "lifecycle/cold"),
    ("cost", "chargeback output", "cost/chargeback"),
    ("signals", FINDINGS, "signals/out"),
)


@dataclass(frozen=True)
class Root:
    """One root a pipeline writes, and where the dashboard learnt of it."""

    pipeline: str
    role: str
    uri: str
    origin: str  # "config: <key>" or "demo workspace"


@dataclass(frozen=True)
class Sources:
    """Every root to report on; `error` is the config's error line (with its hint) if it failed to load."""

    roots: tuple[Root, ...]
    error: str | None = None
    workspace: str | None = None

    def of(self, pipeline: str, role: str | None = None) -> list[Root]:
        """The roots of `pipeline` (of that `role` only, when given)."""
        return [root for root in self.roots if root.pipeline == pipeline and role in (None, root.role)]


def _setting(settings, dotted: str):
    value = settings
    for part in dotted.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def find_sources(environ: dict[str, str] | None = None) -> Sources:
    """The configured roots, then the demo workspace's folders that exist; duplicates once."""
    from seedance_tasks import storage
    from seedance_tasks.config import load_settings
    from seedance_tasks.errors import SeedanceError

    environ = os.environ if environ is None else environ
    found: list[Root] = []
    error = None
    try:
        settings = load_settings()
    except SeedanceError as exc:
        settings, error = None, f"error: {exc.message}" + (f" hint: {exc.hint}" if exc.hint else "")
    if settings is not None:
        for pipeline, role, key in CONFIGURED:
            uri = _setting(settings, key)
            if uri:
                found.append(Root(pipeline, role, str(uri), f"config: {key}"))
    workspace = environ.get(WORKSPACE_ENV)
    if workspace and Path(workspace).is_dir():
        for pipeline, role, folder in DEMO:
            path = Path(workspace) / folder
            if path.is_dir():
                found.append(Root(pipeline, role, str(path), "demo workspace"))
    unique: dict[tuple[str, str], Root] = {}
    for root in found:
        try:
            key = (root.pipeline, storage.resolve(root.uri).uri)
        except SeedanceError:
            key = (root.pipeline, root.uri)
        unique.setdefault(key, root)
    return Sources(tuple(unique.values()), error, workspace if workspace and Path(workspace).is_dir() else None)


HOW_TO_CONFIGURE = (
    "Set the roots in <code>config/seedance.yaml</code> (or <code>SEEDANCE__SECTION__KEY</code> in the "
    "API server's environment): <code>cost.out_uri</code> for the cost pages, <code>compaction.default_uri</code>, "
    "<code>checkpoint.store</code> / <code>checkpoint.inbox</code> and <code>lifecycle.store</code> for data "
    "safety; or run <code>make demo</code> and then <code>make airflow</code>, which point "
    "<code>SEEDANCE_WORKSPACE</code> at the demo's workspace. Restart the API server after a change."
)
