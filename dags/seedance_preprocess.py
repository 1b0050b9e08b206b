"""Shards and preprocessing: samples packed into WebDataset shards, verified, then decoded/resized
by separate I/O and CPU pools into `KEY.npy` shards, mapped over groups of shards.

Wiring only; the work is in `seedance_tasks.shards` and `seedance_tasks.preprocess`. Triggered on
demand (before training) with the same parameters as `seedance shards build` and
`seedance preprocess run`. Emits the `seedance_preprocessed_shards` Asset when the output index
is written.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Asset, Param, dag, task

from seedance_tasks.dag_support import DEFAULT_ARGS, mapped_results, tags

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
        "source": Param(
            "", type="string", title="Source",
            description_md="Samples (a directory of `KEY.jpg`, `KEY.cls`… files, or a Parquet dataset with one row "
            "per sample), or existing WebDataset shards (see *Source kind*). Local path, `file:///…` or `s3://…`.",
            section="Data",
        ),
        "source_kind": Param(
            "samples", type="string", enum=["samples", "shards"], title="Source kind",
            values_display={"samples": "samples: build shards first", "shards": "shards: preprocess as they are"},
            description="Samples are packed into shards first; shards (any WebDataset tars) are used as they are.",
            section="Data",
        ),
        "shards": Param(
            None, type=["null", "string"], title="Shards URI",
            description="Where to build the shards; empty = <source>-shards.", section="Data",
        ),
        "out": Param(
            None, type=["null", "string"], title="Output URI",
            description="Where the preprocessed shards go; empty = <shards>-preprocessed.", section="Data",
        ),
        "shard_size": Param(
            "256MiB", type="string", pattern=r"^\d+(\.\d+)?\s*([KMGT]i?B|B)?$", title="Shard size",
            description="Bytes per shard, tar headers included, e.g. 256MiB.", section="Shards",
        ),
        "shuffle": Param(
            False, type="boolean", title="Shuffle samples", section="Shards",
            description="Shuffle samples across shards (Parquet: by row group, then rows).",
        ),
        "seed": Param(0, type="integer", minimum=0, title="Shuffle seed", description="Seed of the shuffle.",
                      section="Shards"),
        "check_decode": Param(
            True, type="boolean", title="Check that images decode",
            description="Decode every image member (jpg, png, webp...) at build and verify, as readers will: "
            "a sample that does not decode is rejected at build (and listed), a shard holding one fails verify.",
            section="Shards",
        ),
        "image_size": Param(
            224, type="integer", minimum=8, maximum=4096, title="Image size",
            description="Outputs are uint8 arrays of shape (3, size, size).", section="Preprocessing",
        ),
        "io_workers": Param(
            0, type="integer", minimum=0, maximum=64, title="I/O threads",
            description="Per task; 0 = chosen from a short measurement.", section="Preprocessing",
        ),
        "cpu_workers": Param(
            0, type="integer", minimum=0, maximum=256, title="CPU processes",
            description="Per task; 0 = one per core.", section="Preprocessing",
        ),
        "shards_per_group": Param(
            4, type="integer", minimum=1, title="Shards per task",
            description="One mapped preprocessing task per group of this many shards.", section="Preprocessing",
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
        """Every tar complete, readable and safe, images decodable, counts and checksums as the index says."""
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

        return airflow_tasks.finalize_task(built, mapped_results(results))

    built = build_shards()
    verified = verify_shards(built)
    groups = plan(built, verified)
    results = preprocess.expand(group=groups)
    finalize(built, results)


seedance_preprocess()
