"""The inputs of the signals, read once per night and shared by the rules.

- billing: the cost pipeline's normalised FOCUS lines (`cost.ingest`), plus the few FOCUS columns
  the signals classify by (ChargeDescription, SkuId, ConsumedQuantity, ServiceCategory);
- metrics: Prometheus through `/api/v1/query_range`, or Parquet samples (timestamp, name, labels,
  value) that `import_openmetrics` writes from OpenMetrics/Prometheus text;
- lakes: a listing of each dataset root; checkpoints: the store's catalog (read-only);
- logs: torch/NCCL log files.
"""

from __future__ import annotations

import json
import posixpath
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seedance_tasks import storage
from seedance_tasks.errors import InputError, UnavailableError, UsageError
from seedance_tasks.signals.model import Skipped

EXTRA_COLUMNS = ["ChargeDescription", "SkuId", "ConsumedQuantity", "ServiceCategory", "x_UsageType"]
SAMPLES = pa.schema([("timestamp", pa.timestamp("ms", tz="UTC")), ("name", pa.string()),
                     ("labels", pa.string()), ("value", pa.float64())])
"""Metric samples on disk: `labels` is a JSON object with sorted keys (one string per series)."""


def day_start(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


# --------------------------------------------------------------------------- billing


def _kinds(descriptions: pa.Array, settings) -> pa.Array:
    """Each line's kind (egress, requests, piops, compute, other) from its description text."""
    table = [("egress", settings.egress_patterns), ("piops", settings.iops_patterns),
             ("requests", settings.request_patterns), ("compute", settings.compute_patterns)]

    def classify(values: pa.Array) -> pa.Array:
        out = []
        for text in values.to_pylist():
            kind = "other"
            for name, patterns in table:
                if text and any(re.search(pattern, text) for pattern in patterns):
                    kind = name
                    break
            out.append(kind)
        return pa.array(out, pa.string())

    from seedance_tasks.cost.ingest import as_dict, per_value

    return per_value(as_dict(descriptions), classify)


def _owners(tags: pa.Array, keys: list[str]) -> pa.Array:
    from seedance_tasks.cost.ingest import as_dict, per_value
    from seedance_tasks.cost.owners import norm_key, parse_tags, tag_owner

    wanted = [norm_key(key) for key in keys]

    def owner_of(values: pa.Array) -> pa.Array:
        out = []
        for text in values.to_pylist():
            try:
                parsed = parse_tags(text, wanted)
            except ValueError:  # malformed tags name no owner (`seedance cost recover` lists the rows)
                parsed = None
            out.append(tag_owner(parsed, wanted)[0])
        return pa.array(out, pa.string())

    return per_value(as_dict(tags), owner_of)


def _focus_lines(uri: str, basis: str, batch_rows: int, default_currency: str | None):
    """(source, normalised batch, the EXTRA_COLUMNS of its kept rows, its rejected rows) for every
    batch of FOCUS lines at `uri`.

    The one place the signals reach into the cost pipeline's private readers (`ingest._csv_batches`,
    `ingest._parquet_batches`) and `ingest.normalise`: the public `ingest.read_focus` drops the
    columns the signals classify by. Once the cost module offers them (e.g. `read_focus(uri, ...,
    passthrough=EXTRA_COLUMNS)` yielding them aligned with the kept lines), this becomes one call.
    InputError names a file that cannot be read.
    """
    from seedance_tasks.cost import ingest

    wanted = [*ingest.READ_COLUMNS, *EXTRA_COLUMNS]
    for location, path in ingest.billing_files(uri):
        source = posixpath.basename(path) if location.path == path else location.relative(path)
        raw = ingest._parquet_batches if ingest.is_parquet(path) else ingest._csv_batches
        first = 1
        try:
            for columns in raw(location.fs, path, source, batch_rows, wanted):
                batch, rejected = ingest.normalise(columns, first, source, default_currency=default_currency,
                                                   costs=(basis,))
                keep = pc.subtract(batch.column("x_Row"), first)
                first += len(next(iter(columns.values())))
                extras = {name: columns[name].take(keep) if name in columns else pa.nulls(len(keep), pa.string())
                          for name in EXTRA_COLUMNS}
                yield source, batch, extras, rejected
        except (pa.ArrowInvalid, OSError) as exc:
            raise ingest.unreadable_billing(source, exc) from None


@dataclass
class BillingProblems:
    """What the audit could not use of the billing lines, as `{"file", "row", "column", "reason"}`
    samples (the first `ingest.MAX_REJECTED` of each) and counts: rows rejected (left out of every
    rule) and rows whose ConsumedQuantity is not a number (kept, their quantity unknown).
    `lines_kept` counts the lines the rules can use: none with rows rejected means every row was."""

    rejected: list[dict[str, Any]] = field(default_factory=list)
    rejected_count: int = 0
    rejected_by_file: dict[str, int] = field(default_factory=dict)
    quantity_unknown: list[dict[str, Any]] = field(default_factory=list)
    quantity_unknown_count: int = 0
    lines_kept: int = 0

    def add(self, kind: str, items: list[dict[str, Any]]) -> None:
        from seedance_tasks.cost.ingest import MAX_REJECTED

        sample = getattr(self, kind)
        sample.extend({key: item[key] for key in ("file", "row", "column", "reason")}
                      for item in items[: max(0, MAX_REJECTED - len(sample))])
        setattr(self, f"{kind}_count", getattr(self, f"{kind}_count") + len(items))
        if kind == "rejected":
            for item in items:
                self.rejected_by_file[item["file"]] = self.rejected_by_file.get(item["file"], 0) + 1

    @property
    def all_rejected(self) -> bool:
        """True when the source had rows and every one of them was rejected (no line to audit)."""
        return bool(self.rejected_count) and not self.lines_kept

    @property
    def empty(self) -> bool:
        """True when the source holds no data row at all (a header only)."""
        return not self.rejected_count and not self.lines_kept

    def to_json(self) -> dict[str, Any]:
        """The problems, each sample with `*_truncated` saying whether it lists fewer rows than counted,
        `rejected_by_file` the count per file and `all_rejected` whether no line was left to audit."""
        return {"rejected_count": self.rejected_count, "rejected": self.rejected,
                "rejected_truncated": self.rejected_count > len(self.rejected),
                "rejected_by_file": dict(sorted(self.rejected_by_file.items())), "all_rejected": self.all_rejected,
                "quantity_unknown_count": self.quantity_unknown_count, "quantity_unknown": self.quantity_unknown,
                "quantity_unknown_truncated": self.quantity_unknown_count > len(self.quantity_unknown)}

    def _shown(self, sample: list[dict[str, Any]], count: int) -> str:
        shown = "; ".join(f"{item['file']}:{item['row']}: {item['reason']}" for item in sample[:3])
        return shown + (f" (and {count - 3:,} more, see --json)" if count > 3 else "")

    def skip_reason(self, uri: str) -> str | None:
        """Why the billing rules are skipped when the source at `uri` left no line (every row
        rejected, or no data row): a source present but unusable, unlike none configured. None
        when there are lines."""
        if self.all_rejected:
            return (f"billing source {uri} is present but unusable: all {self.rejected_count:,} rows rejected "
                    "(see the warnings)")
        if self.empty:
            return f"billing source {uri} is present but has no data rows"
        return None

    def warnings(self, uri: str | None = None) -> list[str]:
        """One line per kind of problem: the count and the first rows (file:row: reason). When every
        row was rejected, that line says so, that the billing rules are skipped, and ends with a hint."""
        out = []
        if self.empty:
            out.append(f"billing source {uri or '?'} has no data rows (a header only): the billing rules are "
                       "skipped, the others ran\n  hint: check that the export finished, or point --billing / "
                       "signals.billing_uri at the right file")
        for kind, what in (("rejected", "billing row(s) rejected, left out of the audit"),
                           ("quantity_unknown", "billing row(s) with a ConsumedQuantity that is not a number, "
                            "their usage taken as unknown")):
            count, sample = getattr(self, f"{kind}_count"), getattr(self, kind)
            if not count:
                continue
            if kind == "rejected" and self.all_rejected:
                files = ", ".join(f"{name}: {number:,}" for name, number in sorted(self.rejected_by_file.items()))
                out.append(f"billing source {uri or '?'}: all {count:,} billing rows rejected ({files}), no line "
                           f"left to audit: {self._shown(sample, count)}; the billing rules are skipped, the others "
                           "ran\n  hint: fix those rows at the source or export the file again "
                           "(`seedance cost recover` lists every rejected row), or point --billing / "
                           "signals.billing_uri at the right file")
                continue
            out.append(f"{count:,} {what}: {self._shown(sample, count)}")
        return out


def _quantities(values: pa.Array, batch: pa.RecordBatch, source: str) -> tuple[pa.Array, list[dict[str, Any]]]:
    """ConsumedQuantity as float64 (thousands separators dropped, unknown as 0), and the rows
    whose value is not a number (NaN and ±Inf, or beyond a float, are none: they would poison the
    sums and the JSON)."""
    from seedance_tasks.cost import ingest

    text = pc.replace_substring(pc.cast(ingest._text(values), pa.string()), ",", "")
    quantity, bad = ingest._carried(text, "ConsumedQuantity")
    finite = pc.fill_null(pc.is_finite(quantity), True).to_numpy(zero_copy_only=False)
    if not finite.all():
        bad = {**bad, **{int(index): "not finite" for index in np.flatnonzero(~finite)}}
        quantity = pc.if_else(pa.array(finite), quantity, pa.scalar(None, pa.float64()))
    rows = batch.column("x_Row")
    problems = [{"file": source, "row": rows[index].as_py(), "column": "ConsumedQuantity",
                 "reason": f"ConsumedQuantity is not a number: {values[index].as_py()!r}"} for index in sorted(bad)]
    return pc.fill_null(quantity, 0.0), problems


def _no_lines() -> pa.Table:
    """An empty table of the billing lines the rules read (`load_billing` with no line left)."""
    from seedance_tasks.cost.money import MONEY

    return pa.schema([("day", pa.date32()), ("currency", pa.string()), ("cost", MONEY), ("quantity", pa.float64()),
                      ("kind", pa.string()), ("service", pa.string()), ("owner", pa.string()),
                      ("resource", pa.string())]).empty_table()


def load_billing(uri: str, settings, *, basis: str = "EffectiveCost", batch_rows: int = 500_000,
                 default_currency: str | None = None) -> tuple[pa.Table, BillingProblems]:
    """The billing lines at `uri` as one table: day, currency, cost (decimal), quantity, kind,
    service, owner, resource; and the problems found (rows the cost pipeline rejects are left
    out, named there). With no line left (every row rejected, or no data row at all) the table is
    empty and `problems` says which (`all_rejected`, `empty`); the caller skips the billing rules.
    InputError names a file that cannot be read."""
    parts = []
    problems = BillingProblems()
    for source, batch, extra, rejected in _focus_lines(uri, basis, batch_rows, default_currency):
        problems.add("rejected", rejected)
        text = pc.coalesce(extra["ChargeDescription"], extra["x_UsageType"], extra["SkuId"], pa.scalar(""))
        quantity, unknown = _quantities(extra["ConsumedQuantity"], batch, source)
        problems.add("quantity_unknown", unknown)
        parts.append(pa.table({
            "day": pc.cast(batch.column("ChargePeriodStart"), pa.date32()),
            "currency": pc.cast(batch.column("BillingCurrency"), pa.string()),
            "cost": batch.column(basis),
            "quantity": quantity,
            "kind": _kinds(text, settings),
            "service": pc.cast(batch.column("ServiceName"), pa.string()),
            "owner": _owners(batch.column("Tags"), settings.owner_tags),
            "resource": batch.column("ResourceId"),
        }))
    problems.lines_kept = sum(part.num_rows for part in parts)
    return (pa.concat_tables(parts) if parts else _no_lines()), problems


def in_days(table: pa.Table, start: date, end: date, columns: list[str] | None = None) -> pa.Table:
    """The lines of `table` whose day is in [start, end), only `columns` (and day) when given."""
    if columns is not None:
        table = table.select(list(dict.fromkeys([*columns, "day"])))
    return table.filter(pc.and_(pc.greater_equal(table["day"], pa.scalar(start, pa.date32())),
                                pc.less(table["day"], pa.scalar(end, pa.date32()))))


def daily(table: pa.Table, keys: list[str], start: date, end: date, value: str = "cost") -> dict[tuple, dict[date, Any]]:
    """Sum of `value` per `keys` per day, for days in [start, end): {keys: {day: sum}}."""
    window = in_days(table, start, end, [*keys, value])
    grouped = window.group_by([*keys, "day"]).aggregate([(value, "sum")]).to_pylist()
    out: dict[tuple, dict[date, Any]] = {}
    for row in grouped:
        out.setdefault(tuple(row[key] for key in keys), {})[row["day"]] = row[f"{value}_sum"]
    return out


# --------------------------------------------------------------------------- metrics


@dataclass
class Series:
    labels: dict[str, str]
    ts: np.ndarray  # seconds since the epoch, float64, ascending
    values: np.ndarray


def make_series(labels: dict[str, str], ts: np.ndarray, values: np.ndarray) -> Series | None:
    """The series of the finite samples, in time order, one per timestamp: NaN (a stale marker, a
    failed read), ±Inf and nulls are no measurement and are dropped, so one of them never poisons a
    sum or a median; of samples sharing a timestamp (files that overlap) the first is kept, as
    Prometheus keeps one. None when no sample is left."""
    ts, values = np.asarray(ts, np.float64), np.asarray(values, np.float64)
    keep = np.isfinite(ts) & np.isfinite(values)
    if not keep.all():
        ts, values = ts[keep], values[keep]
    if not len(ts):
        return None
    order = np.argsort(ts, kind="stable")
    ts, values = ts[order], values[order]
    first = np.r_[True, np.diff(ts) > 0]
    return Series(labels, ts[first], values[first])


def increase(series: Series) -> float:
    """The increase of a counter over the series (resets count from zero, as Prometheus does)."""
    if len(series.values) < 2:
        return 0.0
    steps = np.diff(series.values)
    return float(np.where(steps >= 0, steps, series.values[1:]).sum())


def parse_labels(text: str | None, where: str) -> dict[str, str]:
    """The label set a samples file stores as JSON text, every value a string (as Prometheus has
    them; a null value, like an empty one, is no label); null text is no label. InputError names
    `where` and the text when it is not a JSON object."""
    if text is None:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise InputError(f"{where}: labels {text[:80]!r} are not a JSON object",
                         hint='labels are one JSON object per sample, e.g. {"gpu": "0", "job": "a"} '
                         "(`seedance signals import-metrics` writes them)")
    return {str(key): value if isinstance(value, str) else json.dumps(value)
            for key, value in parsed.items() if value not in (None, "")}


_COLUMN_TYPES = {"timestamp": (pa.types.is_timestamp, "a timestamp"),
                 "name": (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "text"),
                 "labels": (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t),
                            "JSON text"),
                 "value": (lambda t: pa.types.is_integer(t) or pa.types.is_floating(t), "a number")}


class ParquetMetrics:
    """Metric samples from Parquet files (one file, or every visible .parquet under a folder)."""

    def __init__(self, uri: str):
        self.uri = uri
        location = storage.resolve(uri)
        if storage.is_file(location.fs, location.path):
            paths = [location.path]
        else:
            paths = [info.path for info in storage.list_files(location) if info.path.endswith(".parquet")]
        if not paths:
            raise InputError(f"no metric samples (.parquet) at {uri}",
                             hint="write them with `seedance signals import-metrics FILE --out URI`")
        import pyarrow.dataset as ds

        try:
            self.dataset = ds.dataset(paths, filesystem=location.fs, format="parquet")
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"{uri}: unreadable metric samples ({str(exc).splitlines()[0][:300]})",
                             hint="write them with `seedance signals import-metrics FILE --out URI`") from None
        missing = {name for name in SAMPLES.names} - set(self.dataset.schema.names)
        if missing:
            raise InputError(f"{uri}: metric samples lack column(s) {', '.join(sorted(missing))}",
                             hint="samples have columns timestamp, name, labels, value")
        for column, (fits, what) in _COLUMN_TYPES.items():
            kind = self.dataset.schema.field(column).type
            if not fits(kind):
                raise InputError(f"{uri}: metric samples column {column} is {kind}, not {what}",
                                 hint="samples have columns timestamp (UTC), name, labels (JSON), value (float)")

    def names(self, start: datetime | None = None, end: datetime | None = None) -> set[str]:
        """The metric names with a sample in [start, end) (any time when not given)."""
        import pyarrow.dataset as ds

        window = None
        if start is not None and end is not None:
            stamp = self.dataset.schema.field("timestamp").type
            start, end = self._naive(start, end) if stamp.tz is None else (start, end)
            window = (ds.field("timestamp") >= pa.scalar(start, stamp)) & (ds.field("timestamp") < pa.scalar(end, stamp))
        table = self.dataset.to_table(columns=["name"], filter=window)
        return set(pc.unique(table.column("name")).to_pylist()) - {None}

    @staticmethod
    def _naive(start: datetime, end: datetime) -> tuple[datetime, datetime]:
        """[start, end) as naive UTC, to compare with a timestamp column without a zone (taken as UTC)."""
        return start.astimezone(UTC).replace(tzinfo=None), end.astimezone(UTC).replace(tzinfo=None)

    def series(self, name: str, start: datetime, end: datetime) -> list[Series]:
        """The series of `name` in [start, end): one per label set (however its JSON keys are
        ordered), finite samples only (`make_series`)."""
        import pyarrow.dataset as ds

        stamp = self.dataset.schema.field("timestamp").type
        if stamp.tz is None:
            start, end = self._naive(start, end)
        table = self.dataset.to_table(
            columns=["timestamp", "labels", "value"],
            filter=(ds.field("name") == name) & (ds.field("timestamp") >= pa.scalar(start, stamp))
            & (ds.field("timestamp") < pa.scalar(end, stamp)),
        )
        if not table.num_rows:
            return []
        per_second = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[stamp.unit]
        ts = pc.cast(table.column("timestamp"), pa.int64()).to_numpy() / per_second
        values = pc.fill_null(pc.cast(table.column("value"), pa.float64()), float("nan")).to_numpy()
        labels = pc.fill_null(pc.cast(table.column("labels"), pa.string()), "{}")  # null: no label
        encoded = labels.combine_chunks().dictionary_encode()
        keys: dict[str, int] = {}  # canonical JSON of a label set -> its number
        groups, label_sets = [], []
        for text in encoded.dictionary.to_pylist():
            parsed = parse_labels(text, f"{self.uri}: metric {name}")
            groups.append(keys.setdefault(json.dumps(parsed, sort_keys=True), len(keys)))
            if len(label_sets) < len(keys):
                label_sets.append(parsed)
        group = np.asarray(groups, np.int64)[encoded.indices.to_numpy()]
        order = np.lexsort((ts, group))
        group, ts, values = group[order], ts[order], values[order]
        cuts = np.flatnonzero(np.diff(group)) + 1
        out = []
        for first, last in zip(np.r_[0, cuts], np.r_[cuts, len(group)], strict=True):
            found = make_series(label_sets[group[first]], ts[first:last], values[first:last])
            if found is not None:
                out.append(found)
        return sorted(out, key=lambda item: json.dumps(item.labels, sort_keys=True))


def _shown_url(url: str) -> str:
    """`url` without its user, password and query (what may be printed of a metrics URL)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return urllib.parse.urlunsplit((parts.scheme, host + port, parts.path, "", "")).rstrip("/")


class PrometheusMetrics:
    """A Prometheus server through its HTTP API (`/api/v1/label/__name__/values`, `query_range`).

    A user and password in the URL (`https://user:pass@host`) are sent as HTTP basic auth and never
    printed: errors name the server as `_shown_url` writes it. A non-JSON or malformed answer is an
    InputError; an unreachable, overloaded or failing server (HTTP 429, 5xx) an UnavailableError."""

    def __init__(self, url: str, step: float = 300):
        import base64

        parts = urllib.parse.urlsplit(url.rstrip("/"))
        self.headers: dict[str, str] = {}
        if parts.username is not None:
            secret = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self.headers["Authorization"] = "Basic " + base64.b64encode(secret.encode()).decode()
            netloc = parts.netloc.rpartition("@")[2]
            parts = parts._replace(netloc=netloc)
        self.url = urllib.parse.urlunsplit(parts)
        self.shown = _shown_url(self.url)
        self.step = step

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        import http.client

        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        where = f"Prometheus {self.shown}{path}"
        request = urllib.request.Request(f"{self.url}{path}{query}", headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = _answer_error(exc.read()[:2000])
            if exc.code == 429 or exc.code >= 500:
                raise UnavailableError(f"{where}: HTTP {exc.code} {detail}",
                                       hint="the server is down, overloaded or timed out: a later run can succeed "
                                       "(a larger signals.metrics_step asks for fewer points)") from None
            raise InputError(f"{where}: HTTP {exc.code} {detail}", hint="check --metrics / signals.metrics_uri") from None
        except (OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise UnavailableError(f"Prometheus at {self.shown} unreachable: {type(reason).__name__}: "
                                   f"{_shown_text(str(reason), self.url)}",
                                   hint="is the server up? check --metrics / signals.metrics_uri") from None
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict) or "status" not in body:
            raise InputError(f"{where}: the answer is not a Prometheus API answer: {raw[:80]!r}",
                             hint="point --metrics / signals.metrics_uri at the server's base URL "
                             "(e.g. http://prometheus:9090), not a UI page or a proxy's login")
        if body.get("status") != "success":
            raise InputError(f"{where}: {body.get('errorType') or 'error'}: {str(body.get('error'))[:300]}",
                             hint="check the query")
        if "data" not in body:
            raise InputError(f"{where}: the answer has no data", hint="is it a Prometheus server?")
        return body["data"]

    def names(self, start: datetime | None = None, end: datetime | None = None) -> set[str]:
        """The metric names with series in [start, end) (as the server's label API keeps them: any
        time when not given)."""
        window = {"start": start.timestamp(), "end": end.timestamp()} if start is not None and end is not None else None
        data = self._get("/api/v1/label/__name__/values", window)
        if not isinstance(data, list):
            raise InputError(f"Prometheus {self.shown}: the metric names are not a list", hint="is it a Prometheus server?")
        return {str(name) for name in data}

    def series(self, name: str, start: datetime, end: datetime) -> list[Series]:
        """The series of `name` in [start, end) at `step`, one per label set, finite samples only."""
        # query_range returns at most 11,000 points per series: ask in chunks
        chunk = self.step * 10_000
        pieces: dict[str, list] = {}
        labels_of: dict[str, dict] = {}
        begin = start.timestamp()
        while begin < end.timestamp():
            stop = min(end.timestamp() - 1e-3, begin + chunk)
            data = self._get("/api/v1/query_range", {"query": name, "start": begin, "end": stop, "step": self.step})
            for labels, values in self._matrix(data, name):
                key = json.dumps(labels, sort_keys=True)
                labels_of[key] = labels
                pieces.setdefault(key, []).extend(values)
            begin = stop + self.step
        out = []
        for key in sorted(pieces):
            points = np.array(pieces[key], np.float64).reshape(-1, 2)
            found = make_series(labels_of[key], points[:, 0], points[:, 1])
            if found is not None:
                out.append(found)
        return out

    def _matrix(self, data: Any, name: str) -> Iterable[tuple[dict[str, str], list[tuple[float, float]]]]:
        """(labels, [(ts, value)]) of each series of a query_range answer (native histograms, which
        carry no float samples, have none). InputError on an answer of another shape."""
        where = f"Prometheus {self.shown} query_range {name}"
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or data.get("resultType", "matrix") != "matrix":
            raise InputError(f"{where}: the answer is not a range result (matrix)", hint="is it a Prometheus server?")
        for item in result:
            metric, values = (item.get("metric"), item.get("values", [])) if isinstance(item, dict) else (None, None)
            if not isinstance(metric, dict) or not isinstance(values, list):
                raise InputError(f"{where}: a series of the answer is malformed: {str(item)[:120]}",
                                 hint="is it a Prometheus server?")
            try:
                points = [(float(t), float(v)) for t, v in values]
            except (TypeError, ValueError):
                raise InputError(f"{where}: a sample of {json.dumps(metric, sort_keys=True)[:200]} is not "
                                 f"[time, \"number\"]: {str(values)[:120]}", hint="is it a Prometheus server?") from None
            yield {str(k): str(v) for k, v in metric.items() if k != "__name__"}, points


def _answer_error(body: bytes) -> str:
    """What an error answer of Prometheus says: its `errorType: error`, else the first bytes."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("error"):
        return f"{parsed.get('errorType') or 'error'}: {str(parsed['error'])[:300]}"
    return repr(body[:300])


def _shown_text(text: str, url: str) -> str:
    """`text` with `url` (which may carry a query with a token) written as `_shown_url` does."""
    return text.replace(url, _shown_url(url))


def open_metrics(uri: str, step: float = 300):
    """A metrics source for `uri`: Prometheus for http(s):// URLs, else Parquet samples."""
    if uri.startswith(("http://", "https://")):
        return PrometheusMetrics(uri, step)
    return ParquetMetrics(uri)


def _parser(text: str):
    if "# EOF" in text:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    return text_string_to_metric_families


_FIRST_TIME, _LAST_TIME = -62135596800, 253402300799  # 0001-01-01 .. 9999-12-31T23:59:59 UTC, in seconds


def _exposed_counters(text: str) -> set[str]:
    """Counters a Prometheus text declares without `_total`: prometheus_client's parser renames
    their samples `NAME_total` (its OpenMetrics view); a Prometheus server stores them as exposed."""
    if "# EOF" in text:
        return set()
    return {name for name in re.findall(r"^#\s*TYPE\s+(\S+)\s+counter\s*$", text, re.M) if not name.endswith("_total")}


def _parse_text(text: str):
    """Samples (name, labels, value, timestamp-or-None) of OpenMetrics or Prometheus text, each
    under the name it is exposed as. Raises ValueError on a timestamp outside years 1..9999."""
    renamed = _exposed_counters(text)
    for family in _parser(text)(text):
        for sample in family.samples:
            name = sample.name
            if family.name in renamed and name == family.name + "_total":
                name = family.name
            stamp = None if sample.timestamp is None else float(sample.timestamp)
            if stamp is not None and not _FIRST_TIME <= stamp <= _LAST_TIME:
                raise ValueError(f"timestamp {sample.timestamp} is outside years 1..9999")
            yield name, sample.labels, sample.value, stamp


def _first_bad_line(text: str) -> tuple[int, str] | None:
    """(number, text) of the first sample line the parser refuses on its own, or None if each parses
    alone (the problem is then between lines: a TYPE or the # EOF)."""
    ending = "# EOF\n" if "# EOF" in text else ""
    ended = False
    for number, line in enumerate(text.splitlines(), start=1):
        if ended and line.strip():
            return number, line  # nothing may follow OpenMetrics' # EOF
        ended = ended or line == "# EOF"
        if not line.strip() or line.startswith("#"):
            continue
        try:
            list(_parse_text(line + "\n" + ending))
        except ValueError:
            return number, line
    return None


def import_openmetrics(source: str, out: str, *, at: datetime | None = None) -> dict[str, Any]:
    """OpenMetrics (or Prometheus text exposition) at `source` as Parquet samples at `out` (a file).

    Samples without a timestamp get `at` (default now). InputError names the file and the line
    prometheus_client's parser refused."""
    location = storage.resolve(source)
    try:
        text = storage.read_bytes(location.fs, location.path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{source}: unreadable metrics text ({exc})", hint="pass an OpenMetrics text file") from None
    default = (at or datetime.now(UTC)).timestamp()
    rows: dict[str, list] = {"timestamp": [], "name": [], "labels": [], "value": []}
    try:
        for name, labels, value, stamp in _parse_text(text):
            rows["timestamp"].append(int(round((default if stamp is None else stamp) * 1000)))
            rows["name"].append(name)
            rows["labels"].append(json.dumps(labels, sort_keys=True))
            rows["value"].append(float(value))
    except ValueError as exc:
        bad = _first_bad_line(text)
        where = f"{source}:{bad[0]}" if bad else source
        shown = f": {bad[1][:80]!r}" if bad else ""
        raise InputError(f"{where}: not OpenMetrics/Prometheus text ({exc}){shown}",
                         hint="each sample is `name{label=\"v\"} value [timestamp]` (Prometheus text: milliseconds; "
                         "OpenMetrics: seconds); OpenMetrics ends with # EOF") from None
    table = pa.table({"timestamp": pa.array(rows["timestamp"], pa.int64()).cast(SAMPLES.field(0).type),
                      "name": rows["name"], "labels": rows["labels"], "value": rows["value"]}, schema=SAMPLES)
    write_samples(table, out)
    return {"source": source, "out": out, "samples": table.num_rows,
            "series": len(set(zip(rows["name"], rows["labels"], strict=True))), "metrics": sorted(set(rows["name"]))}


def write_samples(table: pa.Table, out: str) -> None:
    """Write a SAMPLES table as one Parquet file at `out` (atomically)."""
    import pyarrow.parquet as pq

    location = storage.resolve(out)
    sink = pa.BufferOutputStream()
    pq.write_table(table.sort_by([("name", "ascending"), ("timestamp", "ascending")]), sink, compression="zstd")
    parent = posixpath.dirname(location.path)
    if parent:
        location.fs.create_dir(parent, recursive=True)
    storage.write_bytes_atomic(location.fs, location.path, sink.getvalue().to_pybytes())


# --------------------------------------------------------------------------- all inputs of a night


NO_BILLING = "no billing source (--billing or signals.billing_uri)"
"""Why the billing rules are skipped when no billing source is configured."""


@dataclass
class Inputs:
    """The configured sources of one night; each is read on first use and cached."""

    settings: Any
    billing_uri: str | None = None
    lakes: list[str] = field(default_factory=list)
    checkpoints_uri: str | None = None
    metrics_uri: str | None = None
    logs: list[str] = field(default_factory=list)
    basis: str = "EffectiveCost"
    billing_problems: BillingProblems | None = field(default=None, init=False)
    """What the billing lines had wrong, once they are read."""
    billing_skipped: str | None = field(default=None, init=False)
    """Why the billing rules are skipped, once the billing is asked for: no source configured
    (`NO_BILLING`), or a source whose every row is rejected; None when they have lines."""
    missing: dict[str, list[str]] = field(default_factory=dict, init=False)
    """The configured paths that do not exist, per input (`lakes`, `logs`), once read."""
    checkpoints_damaged: list[dict] = field(default_factory=list, init=False)
    """The store's manifests that could not be read (`catalog.damaged_entry`), left out of the listing."""
    _billing: pa.Table | None = field(default=None, init=False, repr=False)
    _names_on: dict[date, set[str]] = field(default_factory=dict, init=False, repr=False)

    @property
    def billing(self) -> pa.Table:
        """The night's billing lines, read once. Skipped, with the same reason for every billing
        rule, when no source is configured, or when the source leaves no line (every row rejected,
        or no data row: `billing_problems` says which rows and why); the other rules still run."""
        if self._billing is None and self.billing_skipped is None:
            if not self.billing_uri:
                self.billing_skipped = NO_BILLING
            else:
                table, self.billing_problems = load_billing(self.billing_uri, self.settings, basis=self.basis)
                self.billing_skipped = self.billing_problems.skip_reason(self.billing_uri)
                if self.billing_skipped is None:
                    self._billing = table
        if self._billing is None:
            raise Skipped(self.billing_skipped)
        return self._billing

    @cached_property
    def metrics(self):
        if not self.metrics_uri:
            raise Skipped("no metrics source (--metrics or signals.metrics_uri)")
        return open_metrics(self.metrics_uri, self.settings.metrics_step)

    def metric_names(self, day: date) -> set[str]:
        """The names of the metrics with a sample on `day` (asked once per day)."""
        if day not in self._names_on:
            start = day_start(day)
            self._names_on[day] = self.metrics.names(start, start + timedelta(days=1))
        return self._names_on[day]

    def metric_series(self, name: str, day: date, days_before: int = 0) -> list[Series]:
        """Series of `name` over `day` and the `days_before` days before it."""
        end = day_start(day) + timedelta(days=1)
        return self.metrics.series(name, end - timedelta(days=1 + days_before), end)

    def _found(self, need: str, uri: str):
        """(location, its FileType) of configured path `uri`; None, listed in `missing[need]`, if absent."""
        import pyarrow.fs as pafs

        location = storage.resolve(uri)
        kind = location.fs.get_file_info(location.path).type
        if kind == pafs.FileType.NotFound:
            if uri not in self.missing.setdefault(need, []):
                self.missing[need].append(uri)
            return None
        return location, kind

    def lake_files(self) -> dict[str, list]:
        """The files under each configured dataset root that exists (the others are listed in
        `missing`); Skipped when none does (a typo never reads as "no small files")."""
        if not self.lakes:
            raise Skipped("no dataset roots (--lake or signals.lakes)")
        found = {uri: self._found("lakes", uri) for uri in self.lakes}
        if not any(found.values()):
            raise Skipped(f"no dataset root found at {', '.join(self.lakes)} (--lake or signals.lakes)")
        return {uri: storage.list_files(where[0]) for uri, where in found.items() if where}

    @cached_property
    def checkpoints(self) -> list[dict]:
        if not self.checkpoints_uri:
            raise Skipped("no checkpoint store (--checkpoints or signals.checkpoints_uri)")
        from seedance_tasks.checkpoint.store import list_checkpoints

        return list_checkpoints(self.checkpoints_uri, damaged=self.checkpoints_damaged)

    def notes(self, rule) -> list[str]:
        """What `rule`'s inputs left out tonight, one line each (damaged checkpoint manifests,
        configured dataset roots or log paths that do not exist)."""
        out = []
        if "checkpoints" in rule.needs and self.checkpoints_damaged:
            from seedance_tasks.checkpoint.catalog import damaged_error

            out.append(str(damaged_error(self.checkpoints_damaged,
                                         "left out of the audit, the rest of the store was audited")))
        for need, what, where in (("lakes", "dataset root(s)", "--lake / signals.lakes"),
                                  ("logs", "training log(s)", "signals.training_logs")):
            if need in rule.needs and self.missing.get(need):
                out.append(f"{what} not found, not read: {', '.join(self.missing[need])}\n  hint: check {where}")
        return out

    def log_texts(self) -> Iterable[tuple[str, str]]:
        """(uri, text) of every configured log file (a folder: each file in it). A configured path
        that does not exist is listed in `missing`; Skipped, after the rest, when no log file
        was found at all (a typo in signals.training_logs never reads as "no collective waited")."""
        import pyarrow.fs as pafs

        if not self.logs:
            raise Skipped("no training logs (signals.training_logs)")
        read = 0
        for uri in self.logs:
            if (found := self._found("logs", uri)) is None:
                continue
            location, kind = found
            paths = [location.path] if kind == pafs.FileType.File else [info.path for info in storage.list_files(location)]
            for path in paths:
                read += 1
                yield location.uri_of(path), storage.read_bytes(location.fs, path).decode("utf-8", errors="replace")
        if not read:
            raise Skipped(f"no training log file at {', '.join(self.logs)} (signals.training_logs)")


FIRST_DAY, LAST_DAY = date(2, 1, 1), date(9998, 12, 31)
"""The nights the audit takes: its windows reach weeks before and a day after the night."""


def parse_day(text: str) -> date:
    """A YYYY-MM-DD date between FIRST_DAY and LAST_DAY, or UsageError."""
    try:
        day = date.fromisoformat(text)
    except (TypeError, ValueError):
        raise UsageError(f"--date {text!r} is not a date", hint="write it as YYYY-MM-DD") from None
    if not FIRST_DAY <= day <= LAST_DAY:
        raise UsageError(f"--date {text} is out of range", hint=f"a night from {FIRST_DAY} to {LAST_DAY}")
    return day
