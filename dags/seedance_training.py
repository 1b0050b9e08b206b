"""Training launch: NCCL settings derived from the machine, torchrun, the reference trainer, job health.

Wiring only; the work is in `seedance_tasks.training`. On demand, with the same parameters as
`seedance train launch`:

1. **plan**: parse the GPU/NIC topology (a saved `nvidia-smi topo -m`, or `detect` on the worker),
   pick the NCCL profile and derive the environment, per-rank NIC and CPU binding; overrides are
   refused unless NCCL or PyTorch really reads them.
2. **launch**: torchrun + the reference trainer (small GPT, DDP, batch-size schedule, checkpoints
   through the checkpoint store, resume from the latest); logs stream into the task log, a
   failed job fails the task with the failing rank's error. A retry resumes from the checkpoint.
   Its summary shows the cost so far (every attempt, to the cent, with its currency), $ per
   1,000 steps, energy (and whether it was measured or estimated) and utilisation, from the
   run's telemetry; a job stopped by SIGTERM or a spot notice saved its step and is retried.
3. **health**: the job's log read for watchdog timeouts, channels, transports; a verdict with
   the likely cause and fix (runs after a failed launch too).
4. **checkpoints**: an event on `seedance_checkpoint_store` for the new checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from seedance_tasks.checkpoint.assets import CHECKPOINT_STORE
from seedance_tasks.dag_support import DEFAULT_ARGS, from_config, optional_param, tags


def _profile_names() -> list[str]:
    """Proposals for the profile field: the repository's profile names and `nccl-defaults` (a cheap
    YAML read; `auto` and `nccl-defaults` alone if the file is unreadable). Proposals, not a fixed
    list: a deployment's own `training.profiles_file` names others, which the plan task checks."""
    import yaml

    path = Path(__file__).resolve().parent.parent / "config" / "nccl_profiles.yaml"
    try:
        names = list((yaml.safe_load(path.read_text()) or {}).get("profiles", {}))
    except (OSError, yaml.YAMLError, AttributeError):
        names = []
    return ["auto", *names, *(["nccl-defaults"] if "nccl-defaults" not in names else [])]


@dag(
    dag_id="seedance_training",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=tags("training"),
    doc_md=__doc__,
    params={
        "nnodes": optional_param("Nodes", "Nodes in the job (more than one needs a rendezvous endpoint).",
                                 empty=from_config("training.nnodes"), section="Job", type="integer", minimum=1,
                                 maximum=100_000),
        "nproc_per_node": optional_param(
            "Processes per node", "0 = one per GPU (2 on a machine without GPUs).",
            empty=from_config("training.nproc_per_node"), section="Job", type="integer", minimum=0, maximum=1024,
        ),
        "rdzv_endpoint": optional_param(
            "Rendezvous endpoint", "HOST:PORT every node joins; needed for more than one node.",
            empty="none (a single-node job)", section="Job",
        ),
        "backend": optional_param("Backend", "auto = nccl with GPUs, gloo without.",
                                  empty=from_config("training.backend"), section="Job", enum=["auto", "nccl", "gloo"]),
        "steps": Param(None, type=["null", "integer"], minimum=1, title="Steps",
                       description="Optimizer steps. Empty: training.steps.", section="Job"),
        "max_restarts": optional_param(
            "Max restarts", "torchrun restarts of the worker group; each resumes from the latest checkpoint.",
            empty=from_config("training.max_restarts"), section="Job", type="integer", minimum=0, maximum=100,
        ),
        "data": Param(None, type=["null", "string"], title="Data",
                      description="Preprocessed shards. Empty: synthetic tokens.", section="Data"),
        "checkpoint_store": Param(
            None, type=["null", "string"], title="Checkpoint store",
            description_md="Absolute local path, `file:///…` or `s3://bucket/prefix`. Empty: `training.checkpoint_store`, "
            "then `checkpoint.store`; with neither, no checkpoints.", section="Checkpoints",
        ),
        "run": Param(None, type=["null", "string"], title="Run name",
                     description="Checkpoint run to continue. Empty: one per DAG run.", section="Checkpoints"),
        "checkpoint_every": Param(None, type=["null", "integer"], minimum=0, title="Checkpoint every",
                                  description="Save every K steps. Empty: training.checkpoint_every.",
                                  section="Checkpoints"),
        "topology": Param(
            None, type=["null", "string"], title="Topology",
            description_md="A saved `nvidia-smi topo -m` file on the worker, or `detect`. Empty: no GPUs "
            "(a CPU/gloo plan).", section="NCCL",
        ),
        "profile": optional_param(
            "NCCL profile", "auto = derived from the topology; or a profile of `training.profiles_file` "
            "(the plan refuses a name that file does not have, listing those it has).", examples=_profile_names(),
            empty=from_config("training.profile"), section="NCCL"),
        "nic_transport": optional_param(
            "NIC transport", "How the NICs carry inter-node traffic; auto = from the topology's NIC Legend.",
            empty=from_config("training.nic_transport"), section="NCCL", enum=["auto", "ib", "efa", "none"],
        ),
        "overrides": Param(
            {}, type="object", title="Environment overrides",
            description_md="`{\"NCCL_SOCKET_IFNAME\": \"=eth0\"}`. Names NCCL/PyTorch do not read are refused, and so "
            "are a plugin library's path and the files NCCL would write or read (`NCCL_DEBUG_FILE`, "
            "`NCCL_CONF_FILE`...): set those in `training.profiles_file`.",
            section="NCCL",
        ),
        "log_dir": Param(None, type=["null", "string"], title="Log folder",
                         description="launch.log and metrics.jsonl. Empty: training.log_dir or a temp folder.",
                         section="Job"),
    },
)
def seedance_training():
    @task(multiple_outputs=False)
    def plan(params: dict | None = None) -> dict:
        """Topology -> profile -> environment, per-rank binding, torchrun command."""
        from seedance_tasks.training import airflow_tasks

        return airflow_tasks.plan_task(params or {}, get_current_context()["run_id"])

    @task(multiple_outputs=False)
    def launch(planned: dict, params: dict | None = None) -> dict:
        """torchrun + the reference trainer; logs stream into this task's log."""
        from seedance_tasks.training import airflow_tasks

        return airflow_tasks.launch_task(planned, params or {})

    @task(multiple_outputs=False, trigger_rule="all_done")
    def health(planned: dict) -> dict:
        """Watchdog timeouts, channels, transports and a verdict from the job's log."""
        from seedance_tasks.training import airflow_tasks

        return airflow_tasks.health_task(planned)

    @task(multiple_outputs=False, outlets=[CHECKPOINT_STORE])
    def checkpoints(launched: dict) -> dict:
        """Announce the new checkpoints (skipped when the job saved none)."""
        from seedance_tasks.training import airflow_tasks

        summary = airflow_tasks.checkpoints_task(launched)
        get_current_context()["outlet_events"][CHECKPOINT_STORE].extra = summary
        return summary

    planned = plan()
    launched = launch(planned)
    launched >> health(planned)
    checkpoints(launched)


seedance_training()
