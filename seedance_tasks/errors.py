"""Errors a user can act on: each carries a message and, where there is one, what to do."""

from __future__ import annotations


class SeedanceError(Exception):
    """Base of every error Seedance raises on purpose; `hint` says what to do about it."""

    exit_code = 1
    retryable = False  # a retry of the same task cannot fix it (bad input, refused, misconfigured)

    def __init__(self, message: str, *, hint: str | None = None, airflow_hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.airflow_hint = airflow_hint  # the hint in an Airflow task, where it differs (no CLI flags there)

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class ConfigError(SeedanceError):
    """A setting is missing, unknown or malformed."""

    exit_code = 2


class UsageError(SeedanceError):
    """A command was called with arguments that cannot work (bad size, bad URI...)."""

    exit_code = 2


class InputError(SeedanceError):
    """Input data is unreadable or malformed; names the file/row and the reason."""


class RefusedError(SeedanceError):
    """Seedance will not act on this input, on purpose (table formats, hostile archives...)."""

    exit_code = 3


class IntegrityError(SeedanceError):
    """Stored data does not match what its manifest/journal/index says (checksums, counts)."""

    exit_code = 4
    retryable = True  # may be a half-finished write by another process; a later try can succeed


class MetadataError(IntegrityError):
    """A metadata file Seedance reads back (a stored plan) or a task's input fails
    validation: it was edited or damaged. A retry reads the same bytes and fails the same way,
    so a DAG task fails at once instead of being retried; a person moves the file away."""

    retryable = False


class ResourceError(SeedanceError):
    """The machine or a service refused for good: disk full, name too long, permission denied,
    access denied, out of memory. A retry of the same task cannot fix it until a person acts."""

    exit_code = 6


class UnavailableError(SeedanceError):
    """A storage endpoint or service is down, frozen, throttling or timing out; names the endpoint."""

    exit_code = 7
    retryable = True  # transient: a later attempt can succeed


class InternalError(SeedanceError):
    """An unexpected exception: a bug in Seedance (or bad data a retry cannot fix); report it."""

    exit_code = 70  # EX_SOFTWARE


YAML_HINT = "fix the YAML there (indent with spaces; quote values that hold ':', '#', '[' or '{')"


def yaml_problem(exc: Exception) -> str:
    """Where and what a YAML parse error is, on one line: 'line 3, column 7: mapping values are not allowed here'."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem
