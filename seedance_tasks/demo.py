"""`make demo`: build a sample workspace and run every pipeline end to end through Airflow.

Runs on the embedded default: a SQLite Airflow metadata DB in a git-ignored AIRFLOW_HOME, local
disk storage, sample data generated under the workspace. Each pipeline contributes a module
(`DEMOS` below) with `demo(workspace, airflow) -> DemoResult`; this file runs them in order and
prints one readable summary.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Pipelines in data-flow order; each module defines demo(workspace: Path, airflow: DemoAirflow).
DEMOS = [
    "seedance_tasks.compaction.demo",
    "seedance_tasks.preprocess.demo",
    "seedance_tasks.training.demo",
    "seedance_tasks.checkpoint.demo",
    "seedance_tasks.lifecycle.demo",
    "seedance_tasks.cost.demo",
    "seedance_tasks.cost.actions_demo",
    "seedance_tasks.signals.demo",
]


@dataclass
class DemoResult:
    """What one pipeline's demo did, for the summary table."""

    pipeline: str
    dag_id: str
    state: str
    did: str
    figures: list[tuple[str, str]] = field(default_factory=list)  # (label, value)
    outputs: list[str] = field(default_factory=list)  # where to look


@contextmanager
def environment(overrides: Mapping[str, str]) -> Iterator[None]:
    """Set `overrides` in os.environ for the block (a demo's SEEDANCE__* settings), then restore."""
    saved = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class DemoAirflow:
    """Runs DAGs from dags/ for real (`dag.test()` on the demo's SQLite metadata DB)."""

    def __init__(self) -> None:
        from airflow.dag_processing.dagbag import DagBag
        from airflow.utils import db

        db.initdb()
        self.bag = DagBag(dag_folder=str(REPO / "dags"))
        if self.bag.import_errors:
            raise RuntimeError(f"DAG import errors: {self.bag.import_errors}")

    def run(self, dag_id: str, conf: dict | None = None, logical_date=None):
        """Run `dag_id` with `conf`; returns the DagRun (check its `.state`)."""
        return self.bag.dags[dag_id].test(run_conf=conf or {}, logical_date=logical_date)

    @staticmethod
    def xcom(dag_run, task_id: str, key: str = "return_value", map_index: int = -1):
        """The XCom value `task_id` pushed in `dag_run`, or None."""
        from seedance_tasks.dag_support import read_xcom

        return read_xcom(dag_run, task_id, key, map_index)


def configure_airflow(home: Path) -> None:
    """Point Airflow at a private home with a SQLite DB, our dags/ and plugins/ (before import)."""
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("AIRFLOW_HOME", str(home))
    os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{home / 'airflow.db'}")
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO / "dags"))
    os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(REPO / "plugins"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")


def _print_summary(results: list[DemoResult], workspace: Path, elapsed: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    overview = Table(title=f"Seedance demo — every pipeline through Airflow ({elapsed:.0f} s)", title_justify="left")
    for column in ("pipeline", "DAG", "run", "what it did"):
        overview.add_column(column)
    for result in results:
        colour = "green" if result.state == "success" else "red"
        overview.add_row(result.pipeline, result.dag_id, f"[{colour}]{result.state}[/]", result.did)
    console.print(overview)
    for result in results:
        if result.figures:
            figures = Table(title=result.pipeline, title_justify="left", show_header=False)
            figures.add_column("figure")
            figures.add_column("value", justify="right")
            for label, value in result.figures:
                figures.add_row(label, value)
            console.print(figures)
        for output in result.outputs:
            console.print(f"  [dim]output:[/] {output}")
    console.print(f"\nWorkspace: {workspace}\nAirflow home: {os.environ['AIRFLOW_HOME']}  (UI: make airflow)")
    console.print("Dashboard (cost, savings, data safety of this workspace): run `make airflow`, log in as admin, "
                  "open http://localhost:8080/plugin/seedance")


def main(argv: list[str] | None = None) -> int:
    """Run every demo; exit 0 only if every pipeline's DAG run succeeded."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, default=REPO / ".demo" / "workspace")
    parser.add_argument("--only", action="append", help="run only demos whose module name contains this")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    workspace = args.workspace.resolve()
    configure_airflow(workspace.parent / "airflow")
    workspace.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    airflow = DemoAirflow()
    results: list[DemoResult] = []
    for module_name in DEMOS:
        if args.only and not any(part in module_name for part in args.only):
            continue
        module = importlib.import_module(module_name)
        print(f"==> {module_name.split('.')[1]}: running through Airflow ...", flush=True)
        try:
            results.append(module.demo(workspace, airflow))
        except Exception as exc:  # one pipeline's failure must not hide the others' results
            traceback.print_exc()
            results.append(DemoResult(module_name.split(".")[1], "?", "failed", f"{type(exc).__name__}: {exc}"))
    _print_summary(results, workspace, time.monotonic() - started)
    return 0 if results and all(result.state == "success" for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
