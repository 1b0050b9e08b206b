"""A generated data lake of small Parquet files: event logs with embeddings, Hive-partitioned.

Used by the demo, the tests and the benchmark; deterministic for a given seed.
"""

from __future__ import annotations

import os
import posixpath

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seedance_tasks import storage

EVENT_TYPES = ["view", "click", "add_to_cart", "purchase", "search", "share", "like", "comment"]


def event_table(rows: int, rng: np.random.Generator, *, start_id: int = 0, embedding_dim: int = 32) -> pa.Table:
    """`rows` synthetic events: ids, low-cardinality strings, timestamps, text, an embedding."""
    event_ids = np.arange(start_id, start_id + rows, dtype=np.int64)
    embedding = rng.standard_normal((rows, embedding_dim), dtype=np.float32)
    words = rng.integers(0, 1 << 40, size=rows)
    return pa.table(
        {
            "event_id": event_ids,
            "user_id": rng.integers(0, 50_000, size=rows, dtype=np.int32),
            "event_type": pa.array(np.array(EVENT_TYPES)[rng.integers(0, len(EVENT_TYPES), size=rows)]),
            "ts": pa.array(1_700_000_000_000_000 + event_ids * 1_000, type=pa.timestamp("us", tz="UTC")),
            "price": np.round(rng.gamma(2.0, 20.0, size=rows), 2),
            "query": pa.array([f"q{w:x}" for w in words]),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(embedding.ravel()), embedding_dim),
        }
    )


def make_sample_lake(
    uri: str,
    *,
    partitions: int = 4,
    files_per_partition: int = 12,
    rows_per_file: int = 5_000,
    seed: int = 7,
    age_s: float = 2 * 3600,
) -> dict:
    """Write `partitions` x `files_per_partition` small Parquet files under `uri/date=.../`.

    Local files are back-dated by `age_s` so the default minimum age lets them be compacted.
    Returns {"files", "bytes", "rows"} written.
    """
    root = storage.resolve(uri)
    rng = np.random.default_rng(seed)
    files = total_bytes = rows = 0
    for p in range(partitions):
        partition = f"date=2026-11-{p + 1:02d}"
        for f in range(files_per_partition):
            table = event_table(rows_per_file, rng, start_id=rows)
            path = root.join(partition, f"part-{f:05d}.parquet")
            root.fs.create_dir(posixpath.dirname(path), recursive=True)
            with root.fs.open_output_stream(path) as sink:
                pq.write_table(
                    table, sink, compression="snappy", row_group_size=max(rows_per_file // 2, 1), write_page_checksum=True
                )
            if not root.is_s3:
                mtime = os.path.getmtime(path) - age_s
                os.utime(path, (mtime, mtime))
            files += 1
            rows += rows_per_file
            total_bytes += root.fs.get_file_info(path).size
    return {"files": files, "bytes": total_bytes, "rows": rows}
