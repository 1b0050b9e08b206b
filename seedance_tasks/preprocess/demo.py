"""Demo: photo-like JPEGs packed into WebDataset shards and preprocessed through `seedance_preprocess`."""

from __future__ import annotations

from pathlib import Path

from seedance_tasks.demo import DemoAirflow, DemoResult

SAMPLES = 240
BAD = (17, 123)  # two samples whose "JPEG" is not an image: reported, the run goes on


def demo(workspace: Path, airflow: DemoAirflow) -> DemoResult:
    """Generate 240 samples (640x480 JPEG + class + JSON), shard them (4 MiB), verify, preprocess to 224."""
    from seedance_tasks.shards.sample import make_sample_files

    source = workspace / "images"
    if not source.exists():  # regenerating would change mtimes, and so the build's fingerprint
        make_sample_files(source, SAMPLES, width=640, height=480, corrupt=BAD)
    dag_run = airflow.run("seedance_preprocess", {
        "source": str(source), "shards": str(workspace / "images-shards"),
        "out": str(workspace / "images-preprocessed"), "shard_size": "4MiB", "image_size": 224,
        "shards_per_group": 2,
    })
    built = airflow.xcom(dag_run, "build_shards") or {}
    verified = airflow.xcom(dag_run, "verify_shards") or {}
    summary = airflow.xcom(dag_run, "finalize") or {}
    figures = []
    if summary:
        figures = [
            ("shards (verified)", f"{verified.get('shards', '?')} x 4 MiB, {verified.get('samples', 0):,} samples"),
            ("shard build", f"{built.get('mb_per_s') or 'up to date'} MB/s"),
            ("preprocessed samples", f"{summary['samples_out']:,} as uint8 (3, 224, 224) .npy"),
            ("failed to decode (reported)", f"{summary['failed']}"),
            ("samples/s per task (mean)", f"{summary['mean_group_samples_per_s'] or 'all done earlier'}"),
        ]
        did = (f"{SAMPLES} JPEGs -> {verified.get('shards', '?')} shards -> {summary['samples_out']} npy samples "
               f"({summary['failed']} bad reported)")
    else:
        did = "no summary (see the task logs)"
    return DemoResult(
        "shards + preprocessing", "seedance_preprocess", dag_run.state, did, figures,
        outputs=[summary.get("index", str(workspace / "images-preprocessed"))],
    )
