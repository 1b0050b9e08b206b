"""An S3 output's bucket must exist before a build or a preprocess run takes its lease there."""

from __future__ import annotations

import pyarrow.fs as pafs

from seedance_tasks.errors import InputError
from seedance_tasks.storage import Location


def refuse_missing_bucket(location: Location, what: str, *, output: bool = True) -> None:
    """InputError naming `what` (e.g. `--out s3://b/x`) and the bucket when `location` is on S3
    and its bucket does not exist (else the first write fails as AWS's bare `NoSuchBucket` of a
    lease's GET); a local location, or an existing bucket, passes. One HEAD request. The hint
    says to create the bucket for an `output`, to correct the URI for an input."""
    if not location.is_s3:
        return
    bucket = location.path.split("/", 1)[0]
    if location.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        raise InputError(f"{what}: the bucket {bucket!r} does not exist (or these credentials cannot see it)",
                         hint=f"create the bucket s3://{bucket} (or correct the name), then run again" if output
                         else "correct the bucket's name in the URI (or use credentials that can see it)")
