"""Job health from logs: NCCL `NCCL_DEBUG=INFO` output, PyTorch watchdog/desync messages (and a
watchdog that got stuck itself), nccl-tests `all_reduce_perf` tables and their error checks, and
the line `seedance train launch` writes when it kills a hung job, summarised with a verdict
(likely cause and fix).

Every parser takes plain text and tolerates the usual prefixes (`host:pid:tid [dev] NCCL INFO`,
`[rank1]:[E626 ...]`, torchrun's `[default0]:`, `mpirun --tag-output`'s `[1,0]<stdout>:`, Slurm
`srun --label`'s `0: ` / ` 12: `); lines it does not know are skipped.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from seedance_tasks.errors import UsageError
from seedance_tasks.training.launch import HUNG_RE, describe_exit, parse_failures
from seedance_tasks.training.plan import Profile

# PyTorch's wording over the years: `[Rank 1] ` (or `[PG ID 0 PG GUID 0(default_pg) Rank 1] `, or no
# rank at all) before it; no SeqNum before 1.11, no NumelIn before 1.13. A match never runs on into
# the next WorkNCCL( of a line where two ranks' messages were written into each other.
_TIMEOUT_RE = re.compile(
    r"(?:\[(?:PG ID [^\]]*? )?Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: WorkNCCL\("
    r"(?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel>\d+))?(?:(?!WorkNCCL\().)*?"
    r"Timeout\(ms\)=(?P<timeout>\d+)\)"
    r" ran for (?P<ran>\d+) milliseconds"
)
_WORK_RE = re.compile(
    r"Rank (?P<rank>\d+)\] Exception .*? at work: (?P<work>\d+), last enqueued NCCL work: (?P<enq>\d+), "
    r"last completed NCCL work: (?P<done>\d+)"
)
_DESYNC_HEAD_RE = re.compile(r"\[(?P<rank>\d+)\] Timeout at collective: (?P<op>\w+), #(?P<seq>\d+)")
_DESYNC_RANK_RE = re.compile(
    r"\[(?P<rank>\d+)\] finished collective #(?P<done>\d+), but didn't join collective #(?P<missing>\d+)"
)
# one item of NCCL's channel summary, `NCCL INFO 24 coll channels, 24 collnet channels, 32 p2p channels per peer`
_CHANNEL_ITEM_RE = re.compile(r"(\d+) ([A-Za-z0-9 ]+?) channels( per peer)?")
_RING_HEADER_RE = re.compile(r"NCCL INFO Channel (\d+)/(\d+) :\s+\d")
_VIA_RE = re.compile(
    r"NCCL INFO (?:Channel|Ring) (?P<chan>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[[0-9a-f]+\])? -> (?P<dst>\d+)"
    r"(?:\[[0-9a-f]+\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$"
)
_ALGO_LINE_RE = re.compile(r"NCCL INFO (Ring|Tree|Trees) \[?\d+")
# NCCL 2.19+ names the call first: `NCCL INFO ncclCommInitRankConfig comm 0x... rank 0 nranks 8 ...`
_COMM_RE = re.compile(
    r"NCCL INFO (?:ncclComm\w+ )?comm 0x[0-9a-f]+ rank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+)"
    r"(?: nNodes (?P<nnodes>\d+))?(?: localRanks (?P<local>\d+))?"
)
_INIT_DONE_RE = re.compile(r"NCCL INFO (?:ncclComm\w+ )?comm 0x[0-9a-f]+ rank \d+ nranks \d+ .*Init COMPLETE")
_WARN_RE = re.compile(r"NCCL WARN (.*)$")
_NCCL_RE = re.compile(r"NCCL (INFO|WARN)")
# a timing or bandwidth cell: a number, or the nan/inf printf gives for a zero or failed timing
# (read, so that the row is reported rather than dropped)
_PERF_NUMBER = r"(?:\d+(?:\.\d*)?|[-+]?(?i:nan|inf))"
_PERF_RANK_RE = re.compile(r"^#\s+Rank\s+(\d+)\s+Group")
_AVG_BUSBW_RE = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+)")
_OUT_OF_BOUNDS_RE = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")
# the column header of an nccl-tests table: `# size count type redop root time algbw busbw #wrong ...`
# now; older releases had no root column (all_reduce), no redop (broadcast) and an `error` column
# (the largest difference seen, not a count) where #wrong is now
_PERF_HEADER_RE = re.compile(r"^#\s*size\s+count\s+type\b.*\btime\s+algbw\s+busbw\b")
_PERF_NUMBER_RE = re.compile(rf"^{_PERF_NUMBER}$")
_FORCED_RE = re.compile(r"\b(NCCL_ALGO|NCCL_PROTO)=(\S+)")
_LAUNCH_RE = re.compile(r"^\$ .*torch\.distributed\.run")  # the header `seedance train launch` writes
# what a launcher puts before each line of a rank's output: Slurm's `srun --label` (the task id,
# right-aligned: optional spaces, digits, a colon and one space; outermost, so only at the very
# start), then torchrun, PyTorch's rank tag, mpirun --tag-output
_LINE_PREFIX_RE = re.compile(r"^(?: *\d+: )?(?:\[default\d+\]:|\[rank\d+\]:|\[\d+,\d+\]<std(?:out|err)>:)*")
_PREFIX_RANK_RE = re.compile(r"\[rank(\d+)\]:")  # PyTorch's tag: the global rank that printed the line
_SATURATION_BYTES = 256 * 1024**2  # all_reduce busbw keeps rising below this on NVLink machines

# Every NCCL WARN line and NCCL error code lands in one of these classes, and each class reaches
# the verdict. (class, status, pattern, cause, fix); the first matching pattern wins, and a WARN
# no pattern knows is the class `other` (a warning quoting the line).
_WARN_CLASSES: tuple[tuple[str, str, re.Pattern[str], str, str], ...] = (
    ("ib_completion", "failed",
     re.compile(r"NET/IB\w* ?: Got completion from peer .*?(?:status=|error )(?P<status>\d+)"),
     "InfiniBand/RoCE work completion error from a peer (status {status}: 12 = transport retries exceeded, "
     "5 = flushed after an earlier error): the link dropped or flapped, or the peer process died",
     "check the links on both nodes (ibstat, ibv_devinfo, the switch port counters), the peer rank's own log, "
     "NCCL_IB_GID_INDEX for RoCE, and NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT"),
    ("ib_setup", "failed",
     re.compile(r"NET/IB\w* ?: .*(?:Unable to|failed|No device)|Call to ibv_\w+ failed|ibv_\w+ failed"),
     "InfiniBand setup failed (opening the device, registering memory or creating/modifying a queue pair)",
     "raise the locked-memory limit (ulimit -l unlimited, the container's memlock), load nvidia-peermem, "
     "check /dev/infiniband is visible in the container and NCCL_IB_HCA names existing devices"),
    ("interface", "failed",
     re.compile(r"(?:Bootstrap|NET/Socket) ?: no (?:socket )?interface found|no usable interface|"
                r"NCCL_SOCKET_IFNAME", re.IGNORECASE),
     "NCCL found no usable network interface for bootstrap/sockets",
     "set NCCL_SOCKET_IFNAME to the interface that reaches the other nodes (ip -br addr), e.g. eth0 or ^lo,docker"),
    ("socket", "failed",
     re.compile(r"NET/Socket|socket\w*|Connection (?:closed|refused|reset|timed out)|remote peer|"
                r"Broken pipe|bootstrap", re.IGNORECASE),
     "a TCP connection between ranks failed (closed, refused or reset): usually a peer process that died "
     "or was killed first, else a firewall or the wrong interface",
     "read the log of the rank that died first (its own error is the cause); check that the nodes reach "
     "each other on NCCL_SOCKET_IFNAME and that no firewall blocks the ports"),
    ("shm", "failed",
     re.compile(r"shared memory|/dev/shm|shm_open|\bshm\w*", re.IGNORECASE),
     "NCCL could not create a shared-memory segment under /dev/shm (too small in a container)",
     "give the container more /dev/shm (docker --shm-size=16g or --ipc=host; Kubernetes: an emptyDir of "
     "medium Memory on /dev/shm), or NCCL_SHM_DISABLE=1 at some speed cost"),
    ("cuda", "failed",
     re.compile(r"Cuda failure|CUDA error|cuda\w*Error|\bcu[A-Z]\w+ failed", re.IGNORECASE),
     "a CUDA call inside NCCL failed ({detail})",
     "out of memory: lower the batch size or NCCL_BUFFSIZE; an illegal address: rerun with "
     "CUDA_LAUNCH_BLOCKING=1 to find the kernel; check nvidia-smi and dmesg for Xid errors"),
    ("timeout", "failed",
     re.compile(r"[Tt]imeout|timed out"),
     "NCCL timed out waiting for a peer or an operation",
     "find the rank that never arrived (its own log); rerun with TORCH_NCCL_DESYNC_DEBUG=1"),
)
_NCCL_ERROR_RE = re.compile(
    r"\b(?P<code>ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|ncclInternalError|ncclInvalidUsage|"
    r"ncclInvalidArgument)\b|NCCL error[^,]*, (?P<text>unhandled (?:system|cuda) error|"
    r"remote process exited or there was a network error|internal error|invalid usage|invalid argument)"
)
_NCCL_ERROR_CLASSES = {  # code: (class, cause, fix)
    "ncclSystemError": ("nccl_system_error", "NCCL reported a system error (a socket, malloc, /dev/shm or "
                        "InfiniBand call failed)", "rerun with NCCL_DEBUG=INFO and read the NCCL WARN line before "
                        "it: it names the failing call"),
    "ncclUnhandledCudaError": ("nccl_cuda_error", "NCCL reported an unhandled CUDA error",
                               "check for out-of-memory and Xid errors (nvidia-smi, dmesg); rerun with "
                               "CUDA_LAUNCH_BLOCKING=1"),
    "ncclRemoteError": ("nccl_remote_error", "NCCL reported a remote error: a peer process exited early or the "
                        "network failed", "read the log of the rank that exited first; check the links"),
    "ncclInternalError": ("nccl_internal_error", "NCCL reported an internal error",
                          "check that every rank runs the same NCCL version; upgrade NCCL if it persists"),
    "ncclInvalidUsage": ("nccl_invalid_usage", "NCCL reported invalid usage (a mismatch between ranks: "
                         "different sizes, dtypes or collectives, or a communicator used after abort)",
                         "make every rank issue the same collectives with the same shapes and dtypes"),
    "ncclInvalidArgument": ("nccl_invalid_argument", "NCCL reported an invalid argument (a bad pointer, count "
                            "or device)", "check the tensors passed to the collective are on the rank's GPU"),
}
_NCCL_ERROR_TEXT = {"unhandled system error": "ncclSystemError", "unhandled cuda error": "ncclUnhandledCudaError",
                    "remote process exited or there was a network error": "ncclRemoteError",
                    "internal error": "ncclInternalError", "invalid usage": "ncclInvalidUsage",
                    "invalid argument": "ncclInvalidArgument"}
# nccl-tests' own checks (common.h): `host: Test NCCL failure common.cu:1005 'unhandled cuda error (...) / last
# error'`, `host: Test CUDA failure common.cu:733 'out of memory'`, then ` .. host pid 123: Test failure
# common.cu:891` for each caller it returns through
_TEST_FAILURE_RE = re.compile(
    r"Test (?:(?P<call>NCCL|CUDA) )?failure (?P<at>[\w./-]+:\d+)(?: '(?P<what>[^']*)'?)?")
# PyTorch's NCCL watchdog itself stuck (2.2+): `[PG ID 0 PG GUID 0(default_pg) Rank 0] ProcessGroupNCCL's
# watchdog got stuck for 480 seconds without making progress ...`, then `... Heartbeat monitor timed out!`
_STUCK_RE = re.compile(r"(?:Rank (?P<rank>\d+)\] )?ProcessGroupNCCL's watchdog got stuck for (?P<seconds>\d+) seconds")
_HEARTBEAT_RE = re.compile(r"(?:Rank (?P<rank>\d+)\] )?Heartbeat monitor timed out")
_CUDA_DETAIL_RE = re.compile(r"Cuda failure (?:\d+ )?'?(?P<what>[^']+)'?")


def classify_warning(text: str) -> dict[str, str]:
    """The class of one NCCL WARN message: {class, status, cause, fix}; `other` when none matches."""
    for name, status, pattern, cause, fix in _WARN_CLASSES:
        if match := pattern.search(text):
            detail = _CUDA_DETAIL_RE.search(text)
            return {"class": name, "status": status, "fix": fix,
                    "cause": cause.format(status=match.groupdict().get("status") or "?",
                                          detail=(detail["what"].strip() if detail else text.strip()))}
    return {"class": "other", "status": "warning", "cause": f"NCCL warning: {text.strip()}",
            "fix": "read the NCCL INFO lines around it (NCCL_DEBUG=INFO) for the call that failed"}


def _lines(text: str) -> list[str]:
    """The lines of `text` without the launcher prefixes (`srun --label`'s `0: `, then `[default0]:`,
    `[rank1]:`, `[1,0]<stdout>:`); every other character of a line is kept."""
    return [_LINE_PREFIX_RE.sub("", line) for line in text.splitlines()]


def _prefix_rank(line: str) -> int | None:
    """The global rank PyTorch's `[rankN]:` tag in the launcher prefix of `line` names (the innermost
    one), or None where the prefix has none."""
    tags = _PREFIX_RANK_RE.findall(_LINE_PREFIX_RE.match(line).group(0))
    return int(tags[-1]) if tags else None


def expected_busbw_of(profile: Profile, link: str | None) -> float | None:
    """`profile`'s expected all_reduce bus bandwidth (GB/s) for GPU `link` (default: its highest);
    None where it has no figures; UsageError naming the known links for a link it has none for."""
    figures = profile.expected_busbw_gbps
    if link is None:
        return max(figures.values()) if figures else None
    if link not in figures:
        raise UsageError(f"profile {profile.name!r} has no expected bus bandwidth for --link {link}",
                         hint=f"known links for it: {', '.join(figures)}" if figures
                         else "it has no expected_busbw_gbps figures: pass --expected-busbw GBPS")
    return figures[link]


_NIC_INDEX_RE = re.compile(r"\d+(?:\(\d+\))?")  # `0`, or `0(8)` where PXN proxies through rank 8


def _transport(via: str) -> str:
    """`NET/IB/0/GDRDMA` and `NET/IB/1(8)/GDRDMA` (PXN) -> `NET/IB/GDRDMA`, `P2P/direct pointer/read` as it is."""
    parts = via.split("/")
    if parts[0] == "NET":
        return "/".join(part for part in parts if not _NIC_INDEX_RE.fullmatch(part))
    return via


def _channel_summary(line: str) -> list[tuple[str, str, str]] | None:
    """The (count, kind, ` per peer`) items of NCCL's channel summary line; None for any other line.
    Each comma-separated item is matched on its own: one pattern over the whole line backtracks
    exponentially on a long line that almost is a summary (a log line can be anything)."""
    _, found, tail = line.partition("NCCL INFO ")
    if not found or "channels" not in tail:
        return None
    items = []
    for part in tail.split(","):
        if part.strip():
            match = _CHANNEL_ITEM_RE.fullmatch(part.strip())
            if match is None:
                return None
            items.append(match.groups(""))
    return items or None


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None else None


def parse_nccl_log(text: str) -> dict[str, Any]:
    """Timeouts, desync report, channel counts, transports, algorithms, init status, nccl-tests'
    own failures (`test_failures`) and hangs (`hangs`: launch's kill, PyTorch's stuck watchdog) from a log."""
    timeouts: list[dict[str, Any]] = []
    work: list[dict[str, int]] = []
    desync: list[dict[str, int]] = []
    desync_at: dict[str, Any] | None = None
    channels: dict[str, int] = {}
    ring_channels = 0
    transports: Counter[str] = Counter()
    links: list[dict[str, Any]] = []
    algorithms: Counter[str] = Counter()
    comms: dict[int, dict[str, int]] = {}
    warnings: list[str] = []
    nccl_errors: list[str] = []
    init_complete = 0
    forced: dict[str, str] = {}
    nccl_lines = 0
    test_failures: list[dict[str, Any]] = []
    hangs: list[dict[str, Any]] = []
    lines = _lines(text)
    for raw, line in zip(text.splitlines(), lines, strict=True):
        if _NCCL_RE.search(line):
            nccl_lines += 1
        if found := list(_TIMEOUT_RE.finditer(line)):  # two ranks' messages can share a line
            tagged = _prefix_rank(raw)  # for a message that names no rank itself
            timeouts.extend({
                "rank": int(match["rank"]) if match["rank"] is not None else tagged, "op": match["op"], "seq": _int_or_none(match["seq"]),
                "timeout_ms": int(match["timeout"]), "ran_ms": int(match["ran"]),
                "numel": int(match["numel"]) if match["numel"] else None,
            } for match in found)
            continue
        if match := _WORK_RE.search(line):
            work.append({"rank": int(match["rank"]), "work": int(match["work"]),
                         "last_enqueued": int(match["enq"]), "last_completed": int(match["done"])})
            continue
        if match := _DESYNC_HEAD_RE.search(line):
            desync_at = {"rank": int(match["rank"]), "op": match["op"], "collective": int(match["seq"])}
            continue
        if match := _DESYNC_RANK_RE.search(line):
            desync.append({"rank": int(match["rank"]), "finished": int(match["done"]), "missing": int(match["missing"])})
            continue
        if items := _channel_summary(line):
            for count, kind, per_peer in items:
                key = kind.strip().replace(" ", "_") + ("_per_peer" if per_peer else "")
                channels[key] = max(channels.get(key, 0), int(count))
            continue
        if match := _VIA_RE.search(line):
            kind = _transport(match["via"])
            transports[kind] += 1
            links.append({"channel": int(match["chan"]), "from": int(match["src"]), "to": int(match["dst"]),
                          "via": kind})
            continue
        if match := _RING_HEADER_RE.search(line):
            ring_channels = max(ring_channels, int(match.group(2)))
            continue
        if match := _ALGO_LINE_RE.search(line):
            algorithms["tree" if match.group(1).startswith("Tree") else "ring"] += 1
        if match := _COMM_RE.search(line):
            comms[int(match["rank"])] = {
                "nranks": int(match["nranks"]),
                **({"nnodes": int(match["nnodes"])} if match["nnodes"] else {}),
            }
        if _INIT_DONE_RE.search(line):
            init_complete += 1
        if match := _WARN_RE.search(line):
            warnings.append(match.group(1).strip())
        for match in _NCCL_ERROR_RE.finditer(line):
            code = match["code"] or _NCCL_ERROR_TEXT[match["text"].lower()]
            if code not in nccl_errors:
                nccl_errors.append(code)
        for name, value in _FORCED_RE.findall(line):
            forced[name] = value
        if match := HUNG_RE.search(line):
            hangs.append({"kind": "no_output", "rank": None, "seconds": float(match["seconds"])})
        for kind, pattern in (("watchdog_stuck", _STUCK_RE), ("heartbeat", _HEARTBEAT_RE)):
            if match := pattern.search(line):
                rank = int(match["rank"]) if match["rank"] is not None else _prefix_rank(raw)
                seconds = float(match["seconds"]) if "seconds" in match.groupdict() else None
                hangs.append({"kind": kind, "rank": rank, "seconds": seconds})
        if match := _TEST_FAILURE_RE.search(line):
            what = " ".join((match["what"] or "").split()).strip(" /")
            test_failures.append({"call": match["call"], "at": match["at"], "error": what or None})
            code = next((code for text, code in _NCCL_ERROR_TEXT.items() if what.lower().startswith(text)), None)
            if match["call"] == "NCCL" and code and code not in nccl_errors:
                nccl_errors.append(code)
    failures = parse_failures(lines)
    if ring_channels and "coll" not in channels:
        channels["coll"] = ring_channels
    return {
        "nccl_lines": nccl_lines,
        "timeouts": timeouts,
        "watchdog_work": work,
        "desync": {"at": desync_at, "ranks": desync} if desync_at or desync else None,
        "channels": channels,
        "transports": dict(transports),
        "links": links,
        "algorithms": sorted(algorithms),
        "forced": forced,
        "comms": {str(rank): info for rank, info in sorted(comms.items())},
        "init_complete": init_complete,
        "nccl_warnings": warnings,
        "nccl_errors": nccl_errors,
        "failures": failures,
        "test_failures": test_failures,
        "hangs": hangs,
    }


def _perf_columns(line: str) -> list[str]:
    return line.lstrip("#").split()


# today's nccl-tests header: rows of a log that does not show its header are read by these names
_TODAY_COLUMNS = _perf_columns("#  size  count  type  redop  root  time  algbw  busbw #wrong  time  algbw  busbw #wrong")


def _perf_row_by_header(columns: list[str], line: str) -> dict[str, Any] | None:
    """A data row read by the names of its table's header (the out-of-place part alone, or both
    parts); None for a line that is not one."""
    cells = line.split()
    starts = [index for index, name in enumerate(columns) if name == "time"]
    if not starts or not cells or not cells[0].isdigit():
        return None
    if len(cells) != len(columns):
        if len(starts) < 2 or len(cells) != starts[1]:
            return None
        columns = columns[: starts[1]]
        starts = starts[:1]
    named = dict(zip(columns[: starts[0]], cells, strict=False))
    if not {"size", "count", "type"} <= set(named) or not named["count"].isdigit() or (
            "root" in named and not re.fullmatch(r"-?\d+", named["root"])):
        return None
    row: dict[str, Any] = {"size": int(named["size"]), "count": int(named["count"]), "type": named["type"],
                           "redop": named.get("redop", "none"), "root": int(named.get("root", -1))}
    for part, start, end in zip(("out_of_place", "in_place"), starts, [*starts[1:], len(columns)], strict=False):
        values = dict(zip(columns[start:end], cells[start:end], strict=True))
        if not all(_PERF_NUMBER_RE.match(values.get(key, "")) for key in ("time", "algbw", "busbw")):
            return None
        row[part] = {"time_us": float(values["time"]), "algbw": float(values["algbw"]),
                     "busbw": float(values["busbw"]), "wrong": values.get("#wrong", "N/A")}
        if "error" in values:
            row[part]["max_error"] = values["error"]
    return row


def parse_nccl_tests(text: str) -> dict[str, Any]:
    """Rows of an nccl-tests table (`all_reduce_perf` and friends): size, count, and per out-of-place
    / in-place time (us), algbw and busbw (GB/s), #wrong; plus ranks, forced algorithm, average and
    the `Out of bounds values` count. Rows are read by the names of the table's header where it
    is in the log (older releases: no root column, an `error` column instead of #wrong), else as
    today's layout. A row whose time or bandwidth is nan/inf is left out of `rows` (and of the peak)
    and listed in `unreadable_rows` with its size and those values."""
    rows: list[dict[str, Any]] = []
    unreadable: list[dict[str, Any]] = []
    ranks: set[int] = set()
    average = out_of_bounds = None
    columns: list[str] | None = None
    for line in _lines(text):
        if match := _PERF_RANK_RE.match(line):
            ranks.add(int(match.group(1)))
            continue
        if match := _AVG_BUSBW_RE.search(line):
            average = float(match.group(1))
            continue
        if match := _OUT_OF_BOUNDS_RE.search(line):
            out_of_bounds = (out_of_bounds or 0) + int(match.group(1))
            continue
        if _PERF_HEADER_RE.match(line.strip()):
            columns = _perf_columns(line)
            continue
        row = ((_perf_row_by_header(columns, line) if columns else None)
               or _perf_row_by_header(_TODAY_COLUMNS, line))
        if row is None:
            continue
        bad = {f"{part} {key}": row[part][key] for part in ("out_of_place", "in_place") if part in row
               for key in ("time_us", "algbw", "busbw") if not math.isfinite(row[part][key])}
        if bad:
            unreadable.append({"size": row["size"], "values": {key: str(value) for key, value in bad.items()},
                               "line": line.strip()})
        else:
            rows.append(row)
    inferred = None
    for row in rows:  # all_reduce: busbw = algbw * 2(n-1)/n  =>  n = 2 / (2 - ratio)
        part = row["out_of_place"]
        if part["algbw"] >= 1 and row["redop"] != "none" and row["root"] == -1:  # reduce/broadcast: busbw = algbw
            ratio = part["busbw"] / part["algbw"]
            if 1 <= ratio < 2:
                inferred = round(2 / (2 - ratio))
    return {
        "rows": rows,
        "unreadable_rows": unreadable,
        "ranks": len(ranks) or None,
        "ranks_inferred": inferred,
        "average_busbw": average,
        "peak_busbw": max((max(r["out_of_place"]["busbw"], r.get("in_place", {}).get("busbw", 0)) for r in rows),
                          default=None),
        "largest_size": max((r["size"] for r in rows), default=None),
        "wrong": sum(1 for r in rows for part in ("out_of_place", "in_place")
                     if part in r and r[part]["wrong"] not in ("0", "N/A")),
        "out_of_bounds": out_of_bounds,
    }


def _verdict(log: dict[str, Any], perf: dict[str, Any], expected_busbw: float | None,
             no_expectation: str | None) -> dict[str, Any]:
    findings: list[dict[str, str]] = []

    def add(status: str, cause: str, fix: str, kind: str | None = None) -> None:
        findings.append({"status": status, "cause": cause, "fix": fix, **({"class": kind} if kind else {})})

    for failure in log["failures"][:1]:
        where = f"rank {failure['rank']} (local rank {failure['local_rank']}" + (
            f" on {failure['host']})" if failure.get("host") else ")")
        how = describe_exit(failure.get("exitcode"))
        detail = (failure.get("error") or "").strip().splitlines()
        if failure.get("signal") == "SIGKILL":
            fix = ("the process was killed from outside: check the kernel's OOM killer (dmesg, cgroup memory "
                   "limits), preemption by the scheduler, or an operator; a restart resumes from the checkpoint")
        elif failure.get("signal") in ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE"):
            fix = (f"{failure['signal']} is a crash in native code (CUDA, NCCL, a C extension), which leaves no "
                   "Python traceback: check dmesg and nvidia-smi for Xid errors, and rerun that rank with "
                   "PYTHONFAULTHANDLER=1 to get the stack")
        elif failure.get("signal") in ("SIGTERM", "SIGINT", "SIGHUP"):
            fix = (f"{failure['signal']} stopped the process from outside (the scheduler, a preemption or an "
                   "operator), not a bug of the job; a restart resumes from the checkpoint")
        else:
            fix = f"read rank {failure['rank']}'s traceback in the log; the other ranks only lost their peer"
        add("failed", f"{where} failed: {how}" + (f": {detail[-1].strip()}" if detail else ""), fix)
    failed_test = next((item for item in log["test_failures"] if item["call"]), None) or next(
        iter(log["test_failures"]), None)
    if failed_test:
        call = f"a {failed_test['call']} call" if failed_test["call"] else "the test"
        said = f": {failed_test['error']!r}" if failed_test["error"] else ""
        add("failed", f"nccl-tests failed: {call} at {failed_test['at']} returned an error{said}; the run stopped "
            "there, so any bandwidth rows before it are not a whole sweep",
            "read the NCCL WARN lines before it (rerun with NCCL_DEBUG=INFO): they name the call that failed; "
            "an out-of-memory error: lower -e (the largest size) or run fewer GPUs per process")
    if log["hangs"]:
        killed = next((item for item in log["hangs"] if item["kind"] == "no_output"), None)
        stuck = sorted({item["rank"] for item in log["hangs"] if item["kind"] != "no_output" and item["rank"] is not None})
        watchdog = [item for item in log["hangs"] if item["kind"] != "no_output"]
        parts = []
        if killed:
            parts.append(f"the job printed nothing for {killed['seconds']:g} s and was killed as hung (training.hang_timeout)")
        if watchdog:
            parts.append("PyTorch's NCCL watchdog got stuck (heartbeat monitor timed out)"
                         + (f" on rank(s) {', '.join(map(str, stuck))}" if stuck else "")
                         + ": a NCCL or CUDA call never returned")
        add("failed", "; ".join(parts),
            "find the rank that stopped first (py-spy dump --pid PID on it, or the flight recorder dump: "
            "TORCH_NCCL_DUMP_ON_TIMEOUT=1 with TORCH_FR_BUFFER_SIZE) and rerun with NCCL_DEBUG=INFO; a shorter "
            "training.collective_timeout turns a hang into a timeout that names the collective")
    timeouts = log["timeouts"]
    if log["desync"] and log["desync"]["ranks"]:
        lagging = ", ".join(
            f"rank {item['rank']} (finished #{item['finished']}, never joined #{item['missing']})"
            for item in log["desync"]["ranks"]
        )
        add("failed", f"collective desync: {lagging}; the other ranks waited in the next collective until the "
            "timeout. A code path that skips or reorders a collective on some ranks, or a rank that died/hung, "
            "not the network",
            "read the desync report's stack trace for where the lagging rank diverged; make every rank issue "
            "the same collectives in the same order")
    elif timeouts:
        seqs = sorted({item["seq"] for item in timeouts if item["seq"] is not None})
        ops = sorted({item["op"] for item in timeouts})
        reporting = sorted({item["rank"] for item in timeouts if item["rank"] is not None})
        budget = max(item["timeout_ms"] for item in timeouts)
        cause = (f"watchdog timeout in {'/'.join(ops)}" + (f" seq {', '.join(map(str, seqs))}" if seqs else "")
                 + (f" on rank(s) {', '.join(map(str, reporting))}" if reporting else "")
                 + f" after {budget / 1000:g} s")
        if len(seqs) == 1 and all(item["seq"] is not None for item in timeouts):
            cause += ": every reporting rank is stuck in the same collective, so a rank that never arrived " \
                     "(stuck in data loading or I/O, crashed, out of memory) held them up"
        fix = ("find the rank missing from this list in its own log; rerun with TORCH_NCCL_DESYNC_DEBUG=1 and "
               "the flight recorder (TORCH_FR_BUFFER_SIZE) to name it")
        if budget >= 600_000:
            fix += "; the timeout is PyTorch's default 10 min: a shorter `training.collective_timeout` " \
                   "frees the GPUs sooner"
        add("failed", cause, fix)
    transports = log["transports"]
    if any(kind.startswith("NET/Socket") for kind in transports):
        add("warning", "inter-node traffic goes over TCP sockets (NET/Socket), not RDMA",
            "check that the IB/EFA devices are visible (ibv_devinfo), NCCL_IB_HCA names them, and the "
            "network plugin (aws-ofi-nccl, TCPX) is loaded")
    net_ib = [kind for kind in transports if kind.startswith("NET/IB")]
    if net_ib and not any("GDRDMA" in kind for kind in net_ib):
        add("warning", "InfiniBand without GPUDirect RDMA: data is staged through host memory",
            "load nvidia-peermem (or use dma-buf) and check NCCL_NET_GDR_LEVEL is not below the GPU-NIC distance")
    if any(kind.startswith("SHM") for kind in transports):
        pairs = sorted({f"{link['from']}->{link['to']}" for link in log["links"] if link["via"].startswith("SHM")})
        add("info", f"ranks {', '.join(pairs)} exchange through host shared memory (SHM): no P2P path between "
            "those GPUs (different CPU sockets / PCIe root complexes)",
            "expected on PCIe machines across NUMA nodes; keep each rank bound to its GPU's NUMA node "
            "(the plan does) and prefer NVLink machines for large all-reduces")
    classes: dict[str, dict[str, Any]] = {}  # one finding per class, counting its lines
    for text in log["nccl_warnings"]:
        found = classify_warning(text)
        entry = classes.setdefault(found["class"] if found["class"] != "other" else f"other:{text}",
                                   {**found, "lines": 0, "example": text})
        entry["lines"] += 1
    for entry in classes.values():
        count = f" ({entry['lines']} NCCL WARN lines, e.g. {entry['example'][:160]!r})" if entry["lines"] > 1 else (
            f" (NCCL WARN {entry['example'][:160]!r})" if entry["class"] != "other" else "")
        add(entry["status"], entry["cause"] + count, entry["fix"], kind=entry["class"])
    for code in log["nccl_errors"]:
        name, cause, fix = _NCCL_ERROR_CLASSES[code]
        add("failed", f"{cause} ({code})", fix, kind=name)
    for name, value in log["forced"].items():
        add("warning", f"{name}={value} is forced: a debugging knob that overrides NCCL's tuning",
            f"remove {name} unless the platform's vendor prescribes it")
    if perf["unreadable_rows"]:
        sizes = ", ".join(f"{row['size']} B ({', '.join(f'{key} {value}' for key, value in row['values'].items())})"
                          for row in perf["unreadable_rows"][:5])
        more = len(perf["unreadable_rows"]) - 5
        add("warning", f"nccl-tests row(s) of size {sizes}{f' and {more} more' if more > 0 else ''}: not a number, "
            "so left out of the peak bandwidth",
            "rerun those sizes with more iterations (-n, -w); a nan time or bandwidth is a zero or failed timing")
    if perf["rows"]:
        peak, largest = perf["peak_busbw"], perf["largest_size"]
        if perf["wrong"] or perf["out_of_bounds"]:
            found = (f"{perf['wrong']} result(s) with #wrong > 0" if perf["wrong"]
                     else f"{perf['out_of_bounds']} out-of-bounds value(s)")
            add("failed", f"nccl-tests reported {found}: data corruption",
                "check NCCL_PROTO (LL128 on unsupported platforms corrupts data), drivers and hardware")
        if largest is not None and largest < _SATURATION_BYTES:
            add("info", f"largest message tested is {largest / 1024**2:g} MiB: bus bandwidth is not saturated yet "
                f"(peak {peak:g} GB/s)", "sweep up to at least 1 GiB (all_reduce_perf -b 8 -e 8G -f 2) to compare "
                "with the expected figure")
        elif expected_busbw and peak is not None:
            ratio = peak / expected_busbw
            if ratio < 0.8:
                add("warning", f"peak bus bandwidth {peak:g} GB/s is {ratio:.0%} of the {expected_busbw:g} GB/s "
                    "this profile expects", "check the transports in an NCCL_DEBUG=INFO run (P2P/NVLink, "
                    "GDRDMA), NUMA binding, and that no NCCL_ALGO/PROTO is forced")
            else:
                add("ok", f"peak bus bandwidth {peak:g} GB/s is {ratio:.0%} of the {expected_busbw:g} GB/s expected",
                    "nothing to do")
        elif peak is not None:
            add("info", f"peak bus bandwidth {peak:g} GB/s up to {largest / 1024**2:g} MiB messages, not compared: "
                f"{no_expectation or 'no expected figure given'}",
                "pass --profile NAME --link TYPE (e.g. NV18) or --expected-busbw GBPS to compare")
    if not findings:
        if log["nccl_lines"]:
            via = ", ".join(sorted(transports)) or "no transport lines"
            add("ok", f"NCCL initialised without timeouts or warnings ({via})", "nothing to do")
        else:
            add("unknown", "no NCCL activity or watchdog message in this log",
                "the job may use gloo, or NCCL_DEBUG was not INFO; launch sets NCCL_DEBUG=INFO for nccl jobs")
    order = {"failed": 0, "warning": 1, "info": 2, "ok": 3, "unknown": 4}
    findings.sort(key=lambda item: order[item["status"]])
    worst = findings[0]["status"]
    return {"status": "ok" if worst == "info" else worst, "cause": findings[0]["cause"],
            "fix": findings[0]["fix"], "findings": findings}


def report(text: str, *, expected_busbw: float | None = None, no_expectation: str | None = None) -> dict[str, Any]:
    """The health report of one log: `timeouts`, `channels`, `transports`, `algorithms`, `bandwidth`
    (nccl-tests rows, when present) and a `verdict` {status, cause, fix, findings}; `no_expectation`
    says why there is no expected bandwidth, when there is none."""
    lines = text.splitlines()
    launches = [i for i, line in enumerate(lines) if _LAUNCH_RE.match(_LINE_PREFIX_RE.sub("", line))]
    if len(launches) > 1:  # a relaunch appends to the run's log: judge its last launch
        text = "\n".join(lines[launches[-1]:])
    log = parse_nccl_log(text)
    perf = parse_nccl_tests(text)
    return {
        "launches": len(launches) or None,
        "timeouts": log["timeouts"],
        "watchdog_work": log["watchdog_work"],
        "desync": log["desync"],
        "channels": log["channels"],
        "transports": log["transports"],
        "algorithms": log["algorithms"],
        "forced": log["forced"],
        "comms": log["comms"],
        "init_complete": log["init_complete"],
        "nccl_warnings": log["nccl_warnings"],
        "nccl_errors": log["nccl_errors"],
        "failures": log["failures"],
        "test_failures": log["test_failures"],
        "hangs": log["hangs"],
        "bandwidth": {
            "rows": [
                {"size": row["size"], "algbw": row["out_of_place"]["algbw"], "busbw": row["out_of_place"]["busbw"],
                 **({"busbw_in_place": row["in_place"]["busbw"]} if "in_place" in row else {})}
                for row in perf["rows"]
            ],
            "peak_busbw": perf["peak_busbw"],
            "largest_size": perf["largest_size"],
            "ranks": perf["ranks"] or perf["ranks_inferred"],
            "expected_busbw": expected_busbw,
            "unreadable_rows": perf["unreadable_rows"],
        } if perf["rows"] else None,
        "verdict": _verdict(log, perf, expected_busbw, no_expectation),
    }
