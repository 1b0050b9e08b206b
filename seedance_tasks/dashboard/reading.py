"""Reading one file of a root for a page: never through a symlink below the root, never more than a page can use.

The roots the dashboard reads are written by pipelines, and by whoever else can write there: a
`report.html` or `summary.json` that is a symlink could lead to any file the API server can
read (its config, its secrets), and a huge one would fill its memory. Both are refused.
"""

from __future__ import annotations

MAX_SUMMARY_BYTES = 16 * 1024**2
"""The largest month summary read (a real one is a few KiB, a few MiB with thousands of owners)."""
MAX_REPORT_BYTES = 64 * 1024**2
"""The largest report.html served (a real one is well under 1 MiB)."""


def read_root_file(root, relative: str, limit: int) -> bytes:
    """The bytes of `root/relative` (`root` a storage.Location, `relative` a path the dashboard
    built). FileNotFoundError when it is not a regular file; ValueError saying why when a
    component of it below `root` is a symlink (never followed, as listings never follow one) or
    it is larger than `limit` bytes."""
    import pyarrow.fs as pafs

    from seedance_tasks import storage

    link = storage.through_link(root, relative)
    if link is not None:
        raise ValueError(f"{root.uri_of(root.join(link))} is a symlink: not followed (it may lead out of {root.uri})")
    path = root.join(relative)
    info = root.fs.get_file_info(path)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"{root.uri_of(path)} is not a file")
    too_big = ValueError(f"{root.uri_of(path)} is larger than {limit // 1024**2} MiB, more than a page shows")
    if info.size is not None and info.size > limit:
        raise too_big
    with root.fs.open_input_stream(path) as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise too_big
    return data
