"""One way to reach data by URI: local paths, `file://` and `s3://`, through `pyarrow.fs`.

Data I/O streams through pyarrow's native filesystems. Writes that must never be seen half done
go through `write_bytes_atomic` (local: hidden temp file + rename; S3: a single PUT is already
atomic) and `publish` (hidden name -> visible name; on S3 copy + delete). Nothing here deletes a
visible file: old data goes to `<root>/_seedance/trash/<run-id>/`, bad data to
`<root>/_seedance/quarantine/<run-id>/`, and only `purge_trash` frees bytes, by age.
"""

from __future__ import annotations

import contextvars
import json
import os
import posixpath
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs

from seedance_tasks import faults
from seedance_tasks.boundary import utf8
from seedance_tasks.errors import IntegrityError, UsageError

SEEDANCE_DIR = "_seedance"
TRASH_DIR = f"{SEEDANCE_DIR}/trash"
QUARANTINE_DIR = f"{SEEDANCE_DIR}/quarantine"
LEASE_DIR = f"{SEEDANCE_DIR}/leases"
RUN_ID_TIME_FORMAT = "%Y%m%dT%H%M%SZ"


@dataclass(frozen=True)
class Location:
    """A place in a filesystem: `fs` plus the fs-native `path` (no scheme), and how to print it."""

    fs: pafs.FileSystem
    path: str
    scheme: str  # "file" or "s3"

    @property
    def uri(self) -> str:
        return f"s3://{self.path}" if self.scheme == "s3" else self.path

    @property
    def is_s3(self) -> bool:
        return self.scheme == "s3"

    def join(self, *parts: str) -> str:
        """The fs-native path of `parts` below this location."""
        return posixpath.join(self.path, *parts) if parts else self.path

    def child(self, *parts: str) -> Location:
        return Location(self.fs, self.join(*parts), self.scheme)

    def relative(self, path: str) -> str:
        """`path` (fs-native, below this location) relative to it."""
        prefix = self.path.rstrip("/") + "/"
        if path.startswith(prefix):  # the common case, without relpath's cost on big listings
            return path[len(prefix):]
        return posixpath.relpath(path, self.path)

    def uri_of(self, path: str) -> str:
        return f"s3://{path}" if self.is_s3 else path


def _s3_settings():
    from seedance_tasks.config import load_section

    return load_section("storage").s3


def _airflow_connection(s3_settings) -> dict[str, Any]:
    """Credentials, endpoint and region of the configured Airflow AWS connection ({} if none)."""
    if not s3_settings.aws_conn_id:
        return {}
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    hook = AwsBaseHook(aws_conn_id=s3_settings.aws_conn_id, client_type="s3")
    creds = hook.get_credentials()
    found = {
        "access_key": creds.access_key,
        "secret_key": creds.secret_key,
        "session_token": creds.token,
        "endpoint_url": hook.conn_config.get_service_endpoint_url("s3"),
        "region": hook.conn_config.region_name,
    }
    return {key: value for key, value in found.items() if value}


def _aws_options(s3_settings=None) -> dict[str, Any]:
    """Endpoint, region and credentials, each from the first place that sets it.

    Order: settings (`storage.s3`), the Airflow connection they name, the environment
    (AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_DEFAULT_REGION); credentials not found there are
    left to the standard AWS chain. Secrets are never logged. Timeouts and the number of tries
    come from `storage.s3.connect_timeout` / `request_timeout` / `max_attempts`.
    """
    s3_settings = s3_settings or _s3_settings()
    connection = _airflow_connection(s3_settings)
    return {
        "endpoint_url": s3_settings.endpoint_url or connection.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
        "region": s3_settings.region or connection.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        "credentials": {key: connection[key] for key in ("access_key", "secret_key", "session_token") if key in connection},
        "connect_timeout": float(s3_settings.connect_timeout),
        "request_timeout": float(s3_settings.request_timeout),
        "max_attempts": int(s3_settings.max_attempts),
    }


def s3_filesystem(s3_settings=None) -> pafs.S3FileSystem:
    """A pyarrow S3 filesystem on the configured endpoint and credentials.

    Bounded: each request gives up on a connection after `connect_timeout`, on a silent
    (frozen) endpoint after `request_timeout`, and is tried `max_attempts` times with the AWS
    standard backoff; then the OSError names the operation (the CLI/DAG boundary names the
    endpoint).
    """
    options = _aws_options(s3_settings)
    kwargs: dict[str, Any] = {
        "region": options["region"],
        "allow_bucket_creation": True,
        "check_directory_existence_before_creation": False,
        "connect_timeout": options["connect_timeout"],
        "request_timeout": options["request_timeout"],
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=options["max_attempts"]),
        **options["credentials"],
    }
    if options["endpoint_url"]:
        endpoint = options["endpoint_url"]
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = parsed.netloc
        kwargs["scheme"] = parsed.scheme
    return pafs.S3FileSystem(**kwargs)


def boto3_client(service: str, s3_settings=None):
    """A boto3 client for control-plane calls (tagging, storage classes...), same credentials.

    The configured endpoint applies to S3 only; other services use boto3's own resolution
    (AWS_ENDPOINT_URL_<SERVICE> / AWS_ENDPOINT_URL, else AWS).
    """
    import boto3
    from botocore.config import Config

    options = _aws_options(s3_settings)
    creds = options["credentials"]
    return boto3.client(
        service,
        region_name=options["region"],
        endpoint_url=options["endpoint_url"] if service == "s3" else None,
        aws_access_key_id=creds.get("access_key"),
        aws_secret_access_key=creds.get("secret_key"),
        aws_session_token=creds.get("session_token"),
        config=Config(
            connect_timeout=options["connect_timeout"],
            read_timeout=options["request_timeout"],
            retries={"total_max_attempts": options["max_attempts"], "mode": "standard"},  # tries, first included
        ),
    )


_ABSOLUTE_ONLY: contextvars.ContextVar[str | None] = contextvars.ContextVar("seedance_absolute_only", default=None)


@contextmanager
def absolute_paths_only(where: str) -> Iterator[None]:
    """Within the block (this thread), `resolve` refuses a relative local path, naming `where`:
    in an Airflow task it would resolve against the worker's working folder, which nobody chose
    (a form's `lake` would become `/opt/airflow/lake` on one worker and something else on the next)."""
    token = _ABSOLUTE_ONLY.set(where)
    try:
        yield
    finally:
        _ABSOLUTE_ONLY.reset(token)


def resolve(uri: str | os.PathLike[str]) -> Location:
    """The Location of `uri`: a local path, `file:///abs/path` (percent-decoded), or `s3://bucket/key`."""
    text = os.fspath(uri)
    if not text.strip():  # an unset shell variable, a blank form field: never the current directory by accident
        raise UsageError(f"empty path or URI: {text!r}", hint="give a local path, file:///path or s3://bucket/prefix")
    if text.startswith("s3://"):
        path = text[len("s3://"):].strip("/")
        if not path:
            raise UsageError(f"no bucket in {text!r}", hint="write s3://bucket/prefix")
        return Location(s3_filesystem(), path, "s3")
    if "://" in text:
        parsed = urlparse(text)
        if parsed.scheme != "file":
            raise UsageError(
                f"unsupported storage scheme {parsed.scheme!r} in {text!r}",
                hint="use a local path, file:///path or s3://bucket/prefix",
            )
        if parsed.netloc not in ("", "localhost"):
            raise UsageError(f"{text!r} names host {parsed.netloc!r}; a file:// URI is a path on this machine",
                             hint=f"write file:///path (three slashes), e.g. file:///{parsed.netloc}{parsed.path}")
        text = unquote(parsed.path)  # RFC 8089: file URIs are percent-encoded
        if not text:  # `file://` alone, or `file://localhost`: no path, never the current directory
            raise UsageError(f"no path in {uri!s}", hint="write file:///path (three slashes and the path)")
    local = os.path.expanduser(text)
    if (where := _ABSOLUTE_ONLY.get()) is not None and not os.path.isabs(local):
        raise UsageError(f"{text!r} is a relative path: {where} would take it from its working folder "
                         f"({os.getcwd()}), which is not one you chose",
                         hint="give an absolute path, file:///path or s3://bucket/prefix")
    return Location(pafs.LocalFileSystem(), os.path.abspath(local), "file")


def is_hidden(relative_path: str) -> bool:
    """True if any component of `relative_path` starts with `_` or `.` (readers skip those)."""
    return any(part.startswith(("_", ".")) for part in relative_path.split("/") if part)


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def is_file(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pafs.FileType.File


@dataclass(frozen=True)
class Listing:
    """What one recursive listing found: the regular files, and the symlinks it did not follow."""

    files: list[pafs.FileInfo]
    symlinks: list[str]  # relative to the listed location, directories and files alike
    # local names that are not UTF-8 (pyarrow cannot open them), relative, undecodable bytes as \xNN
    undecodable: list[str] = field(default_factory=list)
    # local entries that are neither a regular file, a directory nor a symlink (FIFOs, sockets,
    # devices): never opened (a FIFO blocks its reader), relative
    special: list[str] = field(default_factory=list)
    # S3 keys with a `.` or `..` component (`src/../x`): no path names them as listed, relative
    dot_keys: list[str] = field(default_factory=list)


def list_tree(location: Location, *, include_hidden: bool = False) -> Listing:
    """Every file below `location` in one recursive listing, sorted by path; symlinks not followed.

    Hidden files and directories (`_`/`.` prefix, which includes `_seedance/`) are left out unless
    `include_hidden`. On local disk a symlink (to a file or a directory, inside the root or not)
    is never followed: it is reported in `symlinks` so the caller can skip it and say so; a FIFO,
    socket or device is never opened and is reported in `special`. On S3 a key with a `.` or `..`
    component (`src/../x`) is not skipped as hidden: unless `include_hidden`, it is reported in
    `dot_keys` instead of listed.
    """
    info = location.fs.get_file_info(location.path)
    if info.type == pafs.FileType.NotFound:
        return Listing([], [])
    if info.type == pafs.FileType.File:
        return Listing([info], [])
    if location.is_s3:
        selector = pafs.FileSelector(location.path, recursive=True, allow_not_found=True)
        files, dot_keys = [], []
        for item in location.fs.get_file_info(selector):
            if item.type != pafs.FileType.File:
                continue
            relative = location.relative(item.path)
            if include_hidden or not is_hidden(relative):
                files.append(item)
            elif any(part in (".", "..") for part in relative.split("/")):  # not hidden: reported, never read
                dot_keys.append(relative)
        return Listing(sorted(files, key=lambda item: item.path), [], dot_keys=sorted(dot_keys))
    return _walk_local(location, include_hidden)


def _walk_local(location: Location, include_hidden: bool) -> Listing:
    paths: list[str] = []
    symlinks: list[str] = []
    undecodable: list[str] = []
    special: list[str] = []
    pending = [location.path]
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:  # removed while listing
            continue
        for entry in entries:
            relative = location.relative(entry.path)
            if not include_hidden and entry.name.startswith(("_", ".")):
                continue
            if not is_utf8(entry.name):
                undecodable.append(utf8(relative))
            elif entry.is_symlink():
                symlinks.append(relative)
            elif entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            elif entry.is_file(follow_symlinks=False):
                paths.append(entry.path)
            else:
                special.append(relative)
    files = location.fs.get_file_info(sorted(paths)) if paths else []
    return Listing([item for item in files if item.type == pafs.FileType.File], sorted(symlinks), sorted(undecodable),
                   sorted(special))


def is_utf8(name: str) -> bool:
    """False for a name holding lone surrogates (undecodable bytes from os.scandir, a JSON
    `\\udce9`...): no path pyarrow opens can carry it."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def list_files(location: Location, *, include_hidden: bool = False) -> list[pafs.FileInfo]:
    """The regular files of `list_tree(location)` (symlinks are never followed), sorted by path."""
    return list_tree(location, include_hidden=include_hidden).files


_CONFINE_HINT = "the file was edited or damaged by someone else; restore it from the trash or remove it"


def confine(relative_path: str, *, what: str, root: Location | None = None) -> str:
    """`relative_path` normalised, if it stays below its root; else IntegrityError naming `what`.

    Refused: absolute paths, `..` components, empty paths, NUL bytes, backslashes. With `root`
    (on local disk), also a path that passes through a symlink below `root` (see
    `refuse_symlinks`). Metadata (manifests, journals, plans) is untrusted input: every path it
    names goes through here.
    """
    text = relative_path if isinstance(relative_path, str) else None
    problem = None
    if not text:
        problem = "an empty or non-text path"
    elif "\x00" in text or "\\" in text:
        problem = "a NUL byte or a backslash"
    elif text.startswith("/") or os.path.isabs(text) or "://" in text:
        problem = "an absolute path or URI"
    else:
        parts = [part for part in text.split("/") if part not in ("", ".")]
        if not parts or ".." in parts:
            problem = "a `..` component" if parts else "an empty path"
        else:
            normal = "/".join(parts)
            if root is not None:
                refuse_symlinks(root, normal, what=what)
            return normal
    raise IntegrityError(f"{what}: path {relative_path!r} is {problem}, which would leave its root; refused",
                         hint=_CONFINE_HINT)


def refuse_symlinks(root: Location, relative_path: str, *, what: str) -> None:
    """IntegrityError naming `what` if any component of `relative_path` below `root` is a symlink.

    Local disk only (S3 has no symlinks). `root` itself may be reached through a symlink; what
    lies below it may not, so a path named by metadata never leads out of its root the way a
    listing never follows a link. Components that do not exist (yet) are fine: nothing below
    them can be a link. `relative_path` must already be confined (`confine`).
    """
    link = through_link(root, relative_path)
    if link is not None:
        raise IntegrityError(
            f"{what}: path {relative_path!r} passes through the symlink {root.join(link)}, which may lead "
            f"out of {root.uri}; refused (symlinks below a root are never followed)",
            hint=_CONFINE_HINT,
        )


def through_link(root: Location, rel: str) -> str | None:
    """The first component of `root/rel` (`rel` confined) that is a symlink, as a path relative
    to `root`; None if none is, or on S3 (no symlinks there). Components that do not exist (yet)
    end the walk: nothing below them can be a link."""
    if root.is_s3:
        return None
    parts = rel.split("/")
    for end in range(1, len(parts) + 1):
        partial = "/".join(parts[:end])
        try:
            mode = os.lstat(root.join(partial)).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISLNK(mode):
            return partial
    return None


def refuse_linked_state(root: Location, sub: str = SEEDANCE_DIR) -> None:
    """IntegrityError if Seedance's own folder `root/sub` (default `_seedance`) or a folder above
    it below `root` is a symlink: trash, quarantine, journals and leases then stay inside `root`
    whoever can write the lake. Local disk only; a folder not there yet is fine."""
    refuse_symlinks(root, sub, what="Seedance's state folder")


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as stream:
        return stream.read()


def hidden_sibling(path: str, tag: str = "tmp") -> str:
    """A hidden name next to `path` for writing before publish: `dir/.name.<tag>-<random>`."""
    directory, name = posixpath.split(path)
    return posixpath.join(directory, f".{name}.{tag}-{secrets.token_hex(4)}")


def write_bytes_atomic(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old content or the new, never a part."""
    faults.point("storage.write_atomic.before")
    parent = posixpath.dirname(path)
    if parent:
        fs.create_dir(parent, recursive=True)
    if isinstance(fs, pafs.LocalFileSystem):
        temp = hidden_sibling(path)
        try:
            with open(temp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):  # a half-written temp file (ENOSPC...) is ours to remove
                os.unlink(temp)
            raise
    else:  # an S3 PUT is atomic: the object is visible whole or not at all
        with fs.open_output_stream(path) as stream:
            stream.write(data)
    faults.point("storage.write_atomic.after")


class WriteBack:
    """Starts the disk write-back of a local file while it is still being written (Linux:
    `posix_fadvise(DONTNEED)` on the bytes written so far, which queues their write-back without
    waiting and keeps the pages cached), so that the `make_durable` at its end waits only for the
    tail. Only a hint: no-op on S3 and where the call is missing; it never fails the write.

    With `drop`, each step also drops the pages already written back, and `durable()` (called
    once the file is fsynced) drops the rest: for bulk output read elsewhere later (shards), whose
    pages would otherwise push other files out of the cache, and whose freed pages the next
    writes reuse (on this 2-core VM a write into pages reused this way costs a third of the
    CPU of one into pages the guest has not touched yet: `bench/preprocess.py`)."""

    STEP = 8 * 1024**2

    def __init__(self, fs: pafs.FileSystem, path: str | None, *, drop: bool = False):
        self._descriptor = None
        self._started = 0
        self._drop = drop
        if path and isinstance(fs, pafs.LocalFileSystem) and hasattr(os, "posix_fadvise"):
            try:
                self._descriptor = os.open(path, os.O_RDONLY)
            except OSError:
                self._descriptor = None

    def written(self, size: int) -> None:
        """The file now holds `size` bytes: queue the write-back of every full step not queued yet."""
        if self._descriptor is None or size - self._started < self.STEP:
            return
        start = 0 if self._drop else self._started  # again from 0: pages written back since are clean now
        self._advise(start, size - start)
        self._started = size

    def durable(self) -> None:
        """The file is fsynced: with `drop`, its pages leave the cache (the data is on disk)."""
        if self._drop:
            self._advise(0, 0)

    def _advise(self, start: int, length: int) -> None:
        if self._descriptor is None:
            return
        try:
            os.posix_fadvise(self._descriptor, start, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass

    def close(self) -> None:
        """Stop hinting (the file's own stream is closed apart); safe to call twice."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


def make_durable(fs: pafs.FileSystem, paths: list[str]) -> None:
    """Flush the files at `paths` and their folders' entries to the disk (local: fsync), so that a
    journal committed after this call never points at files a power loss could empty; a path
    that is gone is skipped. On S3 an object is durable once its upload completed: nothing to do."""
    if not isinstance(fs, pafs.LocalFileSystem):
        return
    folders = set()
    for path in paths:
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # already published by an earlier attempt: nothing to flush
            continue
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        folders.add(posixpath.dirname(path) or ".")
    for folder in sorted(folders):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def write_json_atomic(fs: pafs.FileSystem, path: str, value: Any) -> None:
    write_bytes_atomic(fs, path, (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode())


def read_json(fs: pafs.FileSystem, path: str) -> Any:
    return json.loads(read_bytes(fs, path))


def move(fs: pafs.FileSystem, source: str, destination: str) -> None:
    """Move one file (local: rename, atomic; S3: copy then delete, so never absent in between)."""
    parent = posixpath.dirname(destination)
    if parent:
        fs.create_dir(parent, recursive=True)
    if isinstance(fs, pafs.LocalFileSystem):
        os.replace(source, destination)
    else:
        fs.copy_file(source, destination)
        fs.delete_file(source)


def same_file(fs: pafs.FileSystem, first: str, second: str) -> bool:
    """True if two paths hold the same bytes (local: one inode or equal bytes; S3: equal size and content)."""
    if isinstance(fs, pafs.LocalFileSystem):
        try:
            if os.path.samefile(first, second):
                return True
        except OSError:
            return False
    infos = fs.get_file_info([first, second])
    if any(info.type != pafs.FileType.File for info in infos) or infos[0].size != infos[1].size:
        return False
    with fs.open_input_stream(first) as one, fs.open_input_stream(second) as two:
        while True:
            left, right = one.read(1 << 22), two.read(1 << 22)
            if left != right:
                return False
            if not left:
                return True


def publish(fs: pafs.FileSystem, hidden_path: str, final_path: str, *, replace: bool = False) -> None:
    """Make a verified hidden file visible under `final_path`; safe to repeat after a crash.

    Never overwrites a different file unless `replace` (the caller has retired the old one or
    means to replace it). Raises IntegrityError if neither the hidden nor the final file exists,
    or if `final_path` already holds other bytes.
    """
    faults.point("storage.publish.before")
    hidden, final = fs.get_file_info([hidden_path, final_path])
    if hidden.type == pafs.FileType.File:
        if final.type == pafs.FileType.File and not replace:
            if not same_file(fs, hidden_path, final_path):
                raise IntegrityError(
                    f"cannot publish {final_path}: a different file of that name is already there",
                    hint="another writer published it; nothing was overwritten. Check the dataset's leases",
                )
            fs.delete_file(hidden_path)  # an earlier attempt published it, then died before this
        elif isinstance(fs, pafs.LocalFileSystem) and not replace:
            parent = posixpath.dirname(final_path)
            if parent:
                fs.create_dir(parent, recursive=True)
            os.link(hidden_path, final_path)  # fails rather than overwrite a file that appeared since
            os.unlink(hidden_path)
        else:
            move(fs, hidden_path, final_path)
    elif final.type != pafs.FileType.File:
        raise IntegrityError(f"cannot publish {final_path}: its staged file {hidden_path} is gone")
    faults.point("storage.publish.after")


def new_run_id(now: datetime | None = None) -> str:
    """A sortable, unique run id that carries its UTC start time: `20261129T091500Z-1a2b3c`."""
    now = now or datetime.now(UTC)
    return f"{now.strftime(RUN_ID_TIME_FORMAT)}-{secrets.token_hex(3)}"


def run_id_time(run_id: str) -> datetime | None:
    """The UTC time a run id carries, or None for a name that is not a run id."""
    try:
        return datetime.strptime(run_id.split("-", 1)[0], RUN_ID_TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def move_to_trash(root: Location, relative_path: str, run_id: str) -> str:
    """Move `root/relative_path` to `root/_seedance/trash/<run_id>/relative_path`; repeatable.

    Returns the trash path. A file already in the trash (an earlier attempt) counts as done.
    """
    source = root.join(relative_path)
    target = root.join(TRASH_DIR, run_id, relative_path)
    refuse_linked_state(root, f"{TRASH_DIR}/{run_id}/{relative_path}")
    faults.point("storage.retire.before")
    if is_file(root.fs, source):
        move(root.fs, source, target)
    elif not is_file(root.fs, target):
        raise IntegrityError(f"cannot retire {source}: it is neither in place nor in the trash")
    faults.point("storage.retire.after")
    return target


def quarantine(root: Location, relative_path: str, run_id: str, reason: str) -> str:
    """Move a bad file to `root/_seedance/quarantine/<run_id>/` with a `.reason.json` beside it.

    Returns the quarantine path. Nothing is deleted.
    """
    source = root.join(relative_path)
    target = root.join(QUARANTINE_DIR, run_id, relative_path)
    refuse_linked_state(root, f"{QUARANTINE_DIR}/{run_id}/{relative_path}")
    if is_file(root.fs, source):
        move(root.fs, source, target)
    write_json_atomic(
        root.fs,
        target + ".reason.json",
        {"file": relative_path, "reason": reason, "run_id": run_id, "at": datetime.now(UTC).isoformat()},
    )
    return target


def _directories(location: Location) -> Iterator[str]:
    selector = pafs.FileSelector(location.path, recursive=False, allow_not_found=True)
    for item in location.fs.get_file_info(selector):
        if item.type == pafs.FileType.Directory:
            yield posixpath.basename(item.path)


def purge_trash(root: Location, older_than_s: float, *, now: datetime | None = None, apply: bool = True,
                keep: frozenset[str] | set[str] = frozenset()) -> dict:
    """Delete trash runs of `root` older than `older_than_s` seconds (by the run id's time).

    Trash runs named in `keep` (those of unfinished journals: `journal.purge_trash` passes them)
    are never purged, nor is a folder whose name is not a run id or that is a symlink (not
    Seedance's: its age or its target is unknown). A trash folder that is itself reached through a
    symlink below `root` is refused (IntegrityError): nothing outside `root` is deleted.
    Returns {"purged": [run ids], "kept": [newer run ids], "in_use": [run ids in `keep`],
    "undated": [other folder names], "files": n, "bytes": n}. With apply=False, reports what it
    would purge and deletes nothing.
    """
    now = now or datetime.now(UTC)
    trash = root.child(TRASH_DIR)
    refuse_linked_state(root, TRASH_DIR)
    purged, kept, in_use, undated, files, total = [], [], [], [], 0, 0
    for run_id in sorted(_directories(trash)):
        started = run_id_time(run_id)
        if started is None or through_link(root, f"{TRASH_DIR}/{run_id}"):
            undated.append(run_id)
            continue
        if run_id in keep:
            in_use.append(run_id)
            continue
        if (now - started).total_seconds() < older_than_s:
            kept.append(run_id)
            continue
        contents = list_files(trash.child(run_id), include_hidden=True)
        files += len(contents)
        total += sum(item.size or 0 for item in contents)
        if apply:
            root.fs.delete_dir(trash.join(run_id))
        purged.append(run_id)
    return {"trash": trash.uri, "purged": purged, "kept": kept, "in_use": in_use, "undated": undated, "files": files,
            "bytes": total, "applied": apply}
