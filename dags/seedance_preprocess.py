"""Shards and preprocessing: samples packed into WebDataset shards, verified, then decoded/resized
by separate I/O and CPU pools into `KEY.npy` shards, mapped over groups of shards.

Wiring only; the work is in `seedance_tasks.shards` and `seedance_tasks.preprocess`. Triggered on
demand (before training) with the same parameters as `seedance shards build` and
`seedance preprocess run`; every empty field is taken from config/seedance.yaml (a run without a
source is skipped, with the reason). Emits the `seedance_preprocessed_shards` Asset when the
output index is written (its extra: the output URI, index and counts). A teardown releases the
run's lease of its output however the run ended.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Asset, Param, dag, task, teardown

from seedance_tasks.dag_support import (
    DEFAULT_ARGS,
    from_config,
    mapped_results,
    optional_param,
    size_param,
    tags,
)

PREPROCESSED_SHARDS = Asset(name="seedance_preprocessed_shards", uri="seedance://preprocess/shards")


@dag(
    dag_id="seedance_preprocess",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=tags("shards", "preprocess"),
    doc_md=__doc__,
    params={
        "source": optional_param(
            "Source", "Samples (a directory of `KEY.jpg`, `KEY.cls`… files, or a Parquet dataset with one row "
            "per sample), or existing WebDataset shards (see *Source kind*). Local path, `file:///…` or `s3://…`.",
            empty="nothing to preprocess: the run is skipped", section="Data",
        ),
        "source_kind": Param(
            "samples", type="string", enum=["samples", "shards"], title="Source kind",
            values_display={"samples": "samples: build shards first", "shards": "shards: preprocess as they are"},
            description="Samples are packed into shards first; shards (any WebDataset tars) are used as they are.",
            section="Data",
        ),
        "shards": optional_param("Shards URI", "Where to build the shards.", empty="`<source>-shards`", section="Data"),
        "out": optional_param("Output URI", "Where the preprocessed shards go.", empty="`<shards>-preprocessed`",
                              section="Data"),
        "shard_size": size_param("Shard size", "Bytes per shard, tar headers included.",
                                 empty=from_config("shards.shard_size"), section="Shards"),
        "shuffle": Param(
            False, type="boolean", title="Shuffle samples", section="Shards",
            description="Shuffle samples across shards (Parquet: by row group, then rows).",
        ),
        "seed": Param(0, type="integer", minimum=0, title="Shuffle seed", description="Seed of the shuffle.",
                      section="Shards"),
        "check_decode": optional_param(
            "Check that images decode",
            "Decode every image member (jpg, png, webp...) at build and verify, as readers will: "
            "a sample that does not decode is rejected at build (and listed), a shard holding one fails verify. "
            "A shard whose tar is unsafe or damaged is quarantined instead and the other shards go on.",
            empty=from_config("shards.check_decode"), section="Shards", type="boolean",
        ),
        "image_size": optional_param("Image size", "Outputs are uint8 arrays of shape (3, size, size).",
                                     empty=from_config("preprocess.size"), section="Preprocessing", type="integer",
                                     minimum=8, maximum=4096),
        "io_workers": optional_param("I/O threads", "Per task; 0 = chosen from a short measurement.",
                                     empty=from_config("preprocess.io_workers"), section="Preprocessing",
                                     type="integer", minimum=0, maximum=64),
        "cpu_workers": optional_param("CPU processes", "Per task; 0 = one per core.",
                                      empty=from_config("preprocess.cpu_workers"), section="Preprocessing",
                                      type="integer", minimum=0, maximum=256),
        "parallel": optional_param(
            "Parallel by", "shards = each CPU process does whole shards (fastest; local disk only); samples = I/O "
            "threads feed image batches to the CPU processes (any storage); auto = shards where they can.",
            empty=from_config("preprocess.parallel"), section="Preprocessing", enum=["auto", "shards", "samples"]),
        "shards_per_group": optional_param(
            "Shards per task", "One mapped preprocessing task per group of this many shards (more, with a warning, "
            "where the groups would outnumber Airflow's `[core] max_map_length`).",
            empty=from_config("preprocess.shards_per_group"), section="Preprocessing", type="integer", minimum=1,
        ),
    },
)
def seedance_preprocess():
    @task(multiple_outputs=False)
    def build_shards(params: dict | None = None) -> dict:
        """Pack the source into shards (no-op when up to date or when the source is shards)."""
        from seedance_tasks.preprocess import airflow_tasks

        return airflow_tasks.build_task(params)

    @task(multiple_outputs=False)
    def verify_shards(built: dict, params: dict | None = None) -> dict:
        """Counts and checksums as the index says, images decodable; a tar that is unsafe or damaged
        is reported (error + hint) and left for preprocess to quarantine, the other shards go on."""
        from seedance_tasks.preprocess import airflow_tasks

        return airflow_tasks.verify_task(built, params)

    @task
    def plan(built: dict, verified: dict, params: dict | None = None) -> list[dict]:
        """Finish interrupted runs on the output; split the shards into groups."""
        from seedance_tasks.preprocess import airflow_tasks

        return airflow_tasks.plan_task(built, params)

    @task(multiple_outputs=False, max_active_tis_per_dagrun=2)
    def preprocess(group: dict, params: dict | None = None) -> dict:
        """One group of shards through the I/O pool and the CPU pool; outputs published when complete."""
        from seedance_tasks.preprocess import airflow_tasks

        return airflow_tasks.preprocess_group_task(group, params)

    @task(multiple_outputs=False, outlets=[PREPROCESSED_SHARDS])
    def finalize(built: dict, results: list[dict]) -> dict:
        """Write the output index; one summary for the run."""
        from seedance_tasks.preprocess import airflow_tasks

        return airflow_tasks.finalize_task(built, mapped_results(results), PREPROCESSED_SHARDS)

    @teardown
    def release_leases(params: dict | None = None) -> dict:
        """Release the run's lease of its output however the run ended (a no-op after `finalize`)."""
        from seedance_tasks.preprocess import airflow_tasks

        return airflow_tasks.release_task(params or {})

    built = build_shards()
    verified = verify_shards(built)
    groups = plan(built, verified)
    results = preprocess.expand(group=groups)
    # downstream of every task (its trigger rule sees only direct upstreams): runs once all are done
    [built, verified, groups, results, finalize(built, results)] >> release_leases()


seedance_preprocess()
