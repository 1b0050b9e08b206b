"""The one place where any exception becomes an error a person can act on.

Both faces use it: the CLI (`cli_support.handle_errors`: an `error:` line, a `hint:` line, an exit
code) and the DAG tasks (`dag_support.fail_fast`: fail at once, or let Airflow retry). A
`SeedanceError` is kept as it is; the usual library and operating-system errors (disk full, name
too long, permission denied, an S3 endpoint down or frozen, Arrow data errors, a missing key...)
get a classified message naming the file/key/endpoint and a hint; anything else is a bug
(`InternalError`, exit code 70). Cheap to import: DAG files and `seedance --help` load it.
"""

from __future__ import annotations

import errno
import os
import re

from seedance_tasks.errors import (
    YAML_HINT,
    ConfigError,
    InputError,
    InternalError,
    ResourceError,
    SeedanceError,
    UnavailableError,
    yaml_problem,
)

DEBUG_ENV = "SEEDANCE_DEBUG"
BUG_HINT = "rerun with --debug and report it"

# errno values a retry of the same task cannot fix (until a person acts)
_ERRNO_MESSAGES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on the device", "free space on that disk (or point the run elsewhere) and "
                   "rerun: the next run finishes or rolls back the interrupted one from its journal"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota, then rerun"),
    errno.ENAMETOOLONG: ("file name too long", "use a shorter root path or shorter partition names "
                         "(the filesystem limits a name to 255 bytes and a path to PATH_MAX)"),
    errno.EACCES: ("permission denied", "check the permissions of that path for the user running seedance"),
    errno.EPERM: ("operation not permitted", "check the permissions of that path for the user running seedance"),
    errno.EROFS: ("read-only filesystem", "write to a writable location"),
    errno.ENOENT: ("no such file or directory", "check the path; a file may have been moved by another run"),
    errno.ENOTDIR: ("not a directory", "check the path: a component of it is a file"),
    errno.EISDIR: ("is a directory", "give a file, not a directory"),
    errno.EMFILE: ("too many open files", "raise the open-files limit (ulimit -n) or lower the workers setting"),
    errno.ENOMEM: ("out of memory", "lower the workers / row_group_size / chunk_size settings"),
}
# pyarrow/AWS SDK messages: "AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, ..."
_AWS_ERROR_RE = re.compile(r"AWS Error (?P<code>[A-Z_]+|\[code \d+\])")
_AWS_UNREACHABLE = {"NETWORK_CONNECTION", "REQUEST_TIMEOUT", "SERVICE_UNAVAILABLE", "SLOW_DOWN", "THROTTLING",
                    "INTERNAL_FAILURE", "REQUEST_TIME_TOO_SKEWED"}
_AWS_PERMANENT = {
    "ACCESS_DENIED": "access denied by S3",
    "INVALID_ACCESS_KEY_ID": "S3 rejected the access key",
    "SIGNATURE_DOES_NOT_MATCH": "S3 rejected the secret key (signature does not match)",
    "NO_SUCH_BUCKET": "no such S3 bucket",
    "MISSING_AUTHENTICATION_TOKEN": "no S3 credentials were sent",
}
_CURL_RE = re.compile(r"curlCode: (?P<code>\d+), (?P<text>[^;]+)")
_BOTO_UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
                     "ProxyConnectionError", "SSLError", "HTTPClientError"}
_BOTO_RETRYABLE_CODES = {"Throttling", "ThrottlingException", "SlowDown", "RequestTimeout", "ServiceUnavailable",
                         "InternalError", "RequestLimitExceeded", "TooManyRequestsException"}


def debug_enabled() -> bool:
    """True when `SEEDANCE_DEBUG` asks for tracebacks (set by `seedance --debug` too)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def utf8(text: str) -> str:
    """`text` as UTF-8 can carry it: the bytes of a name that did not decode (Python's surrogate
    escapes, as `os.listdir` gives them) shown as `\\xNN`, any other lone surrogate as `\\udNNN`;
    a message or listing naming such a file is shown rather than failing."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def first_line(text: str, limit: int = 400) -> str:
    """The first non-empty line of `text`, cut to `limit` characters."""
    for line in str(text).splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def s3_endpoint() -> str:
    """The S3 endpoint the configured settings reach (for messages); never raises."""
    return _s3_target()[0]


def _s3_target() -> tuple[str, int | None]:
    try:
        from seedance_tasks.storage import _aws_options

        options = _aws_options()
        return options["endpoint_url"] or f"AWS S3 ({options['region']})", options.get("max_attempts")
    except Exception:  # noqa: BLE001 - a message helper must not fail the error path
        return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3", None


def _notes(exc: BaseException) -> str:
    notes = [note for note in getattr(exc, "__notes__", ()) or () if isinstance(note, str)]
    return "".join(f" ({first_line(note)})" for note in notes)


def _unreachable(detail: str) -> UnavailableError:
    endpoint, attempts = _s3_target()
    tries = f" ({attempts} tries)" if attempts else ""
    return UnavailableError(
        f"cannot reach the S3 endpoint {endpoint}: {detail}{tries}",
        hint=f"check that {endpoint} is up and reachable from here (storage.s3.endpoint_url, AWS_ENDPOINT_URL); "
        "storage.s3.connect_timeout / request_timeout / max_attempts bound how long each try waits",
    )


def _from_os_error(exc: OSError) -> SeedanceError | None:
    names = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name is not None)
    where = f": {names}" if names else ""
    if not names and exc.strerror and exc.errno and exc.strerror != os.strerror(exc.errno):
        where = ": " + first_line(exc.strerror.split(". Detail:")[0])  # pyarrow: "Failed to open local file '...'"
    if exc.errno in _ERRNO_MESSAGES:
        what, hint = _ERRNO_MESSAGES[exc.errno]
        return ResourceError(f"{what}{where}{_notes(exc)}", hint=hint)
    text = first_line(exc.strerror or str(exc))
    if match := _AWS_ERROR_RE.search(str(exc)):
        code = match["code"]
        if code in _AWS_UNREACHABLE:
            curl = _CURL_RE.search(str(exc))
            detail = f"{curl['text'].strip()} (curl code {curl['code']})" if curl else code.lower().replace("_", " ")
            return _unreachable(detail)
        if code in _AWS_PERMANENT:
            return ResourceError(
                f"{_AWS_PERMANENT[code]} ({s3_endpoint()}): {first_line(str(exc))}",
                hint="check the bucket name and the credentials (storage.s3.aws_conn_id, AWS_PROFILE, "
                "AWS_ACCESS_KEY_ID) and their permissions",
            )
        return UnavailableError(f"S3 error from {s3_endpoint()}: {first_line(str(exc))}",
                                hint="retry later; if it persists, check the endpoint and the bucket")
    # any other OSError is the storage failing under us (an I/O error, a lost mount, an injected fault):
    # transient until shown otherwise, so Airflow's retry gets its chance
    return UnavailableError(f"storage or network error{where}: {text}{_notes(exc)}",
                            hint="a transient failure: rerun (Airflow retries the task); the next attempt "
                            "finishes or rolls back this one from its journal")


def _from_botocore(exc: BaseException) -> SeedanceError | None:
    module = type(exc).__module__ or ""
    if not module.startswith(("botocore", "boto3")):
        return None
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _BOTO_UNREACHABLE:
        return _unreachable(first_line(str(exc)))
    if "NoCredentialsError" in names or "PartialCredentialsError" in names:
        return ConfigError(f"no AWS credentials found: {first_line(str(exc))}",
                           hint="set storage.s3.aws_conn_id, AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
    if "ClientError" in names:
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        if code in _BOTO_RETRYABLE_CODES:
            return UnavailableError(f"AWS is throttling or unavailable: {first_line(str(exc))}",
                                    hint="retry later (Airflow retries the task)")
        return ResourceError(f"AWS refused the call: {first_line(str(exc))}",
                             hint="check the resource name, the credentials and their permissions")
    return None


def _from_arrow(exc: BaseException) -> SeedanceError | None:
    if not (type(exc).__module__ or "").startswith("pyarrow"):
        return None
    kind = type(exc).__name__
    if kind == "ArrowMemoryError":
        return ResourceError(f"out of memory in Arrow: {first_line(str(exc))}",
                             hint="lower the workers / row_group_size settings")
    return InputError(
        f"data error ({kind}): {first_line(str(exc))}{_notes(exc)}",
        hint="the input may be corrupt or hold a type this step does not support; "
        "check the file named above, or rerun with --debug",
    )


def classify(exc: BaseException) -> SeedanceError:
    """The SeedanceError to report for `exc`: itself if it is one, else a classified one.

    Its `message` names what the exception names (file, key, endpoint), `hint` says what to do,
    `exit_code` is meaningful (2 config/usage, 6 resource, 7 unavailable, 70 a bug) and `retryable`
    tells Airflow whether another attempt can succeed.
    """
    if isinstance(exc, SeedanceError):
        return exc
    for convert in (_from_botocore, _from_arrow):
        if (found := convert(exc)) is not None:
            return found
    if isinstance(exc, OSError) and (found := _from_os_error(exc)) is not None:
        return found
    if isinstance(exc, MemoryError):
        return ResourceError("out of memory", hint="lower the workers / row_group_size / chunk_size settings, "
                             "or run on a machine with more memory")
    if isinstance(exc, KeyError):
        key = exc.args[0] if exc.args else "?"
        return InputError(f"missing key or column {key!r}{_notes(exc)}",
                          hint="the input lacks a field this step needs; check the file, or rerun with --debug "
                          "and report it if the input is right")
    if isinstance(exc, UnicodeEncodeError) and isinstance(exc.object, str):
        return InputError(f"a name or text that is not valid {exc.encoding}: {first_line(utf8(exc.object), 200)}"
                          f"{_notes(exc)}",
                          hint="rename the file or folder to UTF-8 (e.g. with convmv), or give a path without it")
    if isinstance(exc, UnicodeDecodeError):
        return InputError(f"cannot decode text as {exc.encoding} at byte {exc.start}{_notes(exc)}",
                          hint="the file is not text in that encoding (binary or another charset)")
    kind = type(exc).__name__
    if kind == "JSONDecodeError":
        return InputError(f"malformed JSON: {first_line(str(exc))}{_notes(exc)}", hint="fix or replace the file")
    if kind in {"YAMLError", "ScannerError", "ParserError", "ComposerError", "ConstructorError"}:
        return ConfigError(f"malformed YAML: {yaml_problem(exc)}{_notes(exc)}", hint=YAML_HINT)
    detail = first_line(str(exc))
    return InternalError(f"unexpected {kind}" + (f": {detail}" if detail else "") + _notes(exc), hint=BUG_HINT)
