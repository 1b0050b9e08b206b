"""Which environment variables NCCL, PyTorch and the network plugins really read.

Blog posts circulate names that NCCL never read (`NCCL_RING_ALGO`, `NCCL_COLL_TIMEOUT`), names
it stopped reading (`NCCL_LL_THRESHOLD`, `NCCL_IB_GDR_LEVEL`) and PyTorch settings under NCCL's
prefix (`NCCL_ASYNC_ERROR_HANDLING`). Setting them does nothing, or less than intended, so a
plan never emits them and `validate` refuses them, naming the variable to use instead.

Sources: NVIDIA's NCCL environment-variable documentation (user guide, 2.15 to 2.29) and the
NCCL source (`NCCL_PARAM(...)` declarations); PyTorch 2.13's
`torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp`, `FlightRecorder.hpp` and
`torch/distributed/elastic`; the network plugins' own documentation for their variables.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass

from seedance_tasks.errors import UsageError

_NCCL = "NCCL"
_TORCH = "PyTorch"
_TORCHRUN = "torchrun (torch.distributed.elastic)"
_OFI = "libfabric, through the aws-ofi-nccl NCCL net plugin"
_TCPX = "the GPUDirect-TCPX NCCL net plugin (GCP A3)"

# Documented in NCCL's user guide and declared in its source.
NCCL_VARIABLES = (
    "NCCL_ALGO NCCL_BUFFSIZE NCCL_CHECK_POINTERS NCCL_COLLNET_ENABLE NCCL_COLLNET_NODE_THRESHOLD "
    "NCCL_COMM_BLOCKING NCCL_CONF_FILE NCCL_CROSS_NIC NCCL_CUMEM_ENABLE NCCL_DEBUG NCCL_DEBUG_FILE "
    "NCCL_DEBUG_SUBSYS NCCL_DMABUF_ENABLE NCCL_GDRCOPY_ENABLE NCCL_GRAPH_MIXING_SUPPORT "
    "NCCL_GRAPH_REGISTER NCCL_HOSTID NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_ADDR_FAMILY NCCL_IB_ADDR_RANGE "
    "NCCL_IB_AR_THRESHOLD NCCL_IB_DISABLE NCCL_IB_ECE_ENABLE NCCL_IB_GID_INDEX NCCL_IB_HCA "
    "NCCL_IB_MERGE_NICS NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_QPS_PER_CONNECTION NCCL_IB_RETRY_CNT "
    "NCCL_IB_ROCE_VERSION_NUM NCCL_IB_SL NCCL_IB_SPLIT_DATA_ON_QPS NCCL_IB_TC NCCL_IB_TIMEOUT "
    "NCCL_IB_USE_INLINE NCCL_IGNORE_CPU_AFFINITY NCCL_IGNORE_DISABLED_P2P NCCL_LAUNCH_MODE "
    "NCCL_LOCAL_REGISTER NCCL_MAX_CTAS NCCL_MAX_NCHANNELS NCCL_MIN_CTAS NCCL_MIN_NCHANNELS "
    "NCCL_MNNVL_ENABLE NCCL_NCHANNELS_PER_NET_PEER NCCL_NET NCCL_NET_DISABLE_INTRA "
    "NCCL_NET_FORCE_FLUSH NCCL_NET_GDR_C2C NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_PLUGIN "
    "NCCL_NET_SHARED_BUFFERS NCCL_NET_SHARED_COMMS NCCL_NSOCKS_PERTHREAD NCCL_NTHREADS "
    "NCCL_NVB_DISABLE NCCL_NVLS_ENABLE NCCL_NVLS_CHUNKSIZE NCCL_P2P_DIRECT_DISABLE NCCL_P2P_DISABLE "
    "NCCL_P2P_LEVEL NCCL_P2P_LL_THRESHOLD NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE "
    "NCCL_P2P_PCI_CHUNKSIZE NCCL_P2P_PXN_LEVEL NCCL_PROFILER_PLUGIN NCCL_PROTO NCCL_PXN_DISABLE "
    "NCCL_RAS_ENABLE NCCL_RUNTIME_CONNECT NCCL_SET_STACK_SIZE NCCL_SET_THREAD_NAME NCCL_SHM_DISABLE "
    "NCCL_SOCKET_FAMILY NCCL_SOCKET_IFNAME NCCL_SOCKET_NTHREADS NCCL_TOPO_DUMP_FILE NCCL_TOPO_FILE "
    "NCCL_TUNER_PLUGIN NCCL_WORK_FIFO_DEPTH"
).split()

# Read by PyTorch 2.13 (ProcessGroupNCCL.hpp, FlightRecorder.hpp, distributed_c10d.py, elastic).
TORCH_VARIABLES = (
    "TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_BLOCKING_WAIT TORCH_NCCL_DESYNC_DEBUG "
    "TORCH_NCCL_DUMP_ON_TIMEOUT TORCH_NCCL_ENABLE_MONITORING TORCH_NCCL_ENABLE_TIMING "
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC TORCH_NCCL_HIGH_PRIORITY TORCH_NCCL_NAN_CHECK "
    "TORCH_NCCL_PROPAGATE_ERROR TORCH_NCCL_TRACE_BUFFER_SIZE TORCH_NCCL_TRACE_CPP_STACK "
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC TORCH_NCCL_AVOID_RECORD_STREAMS TORCH_NCCL_CUDA_EVENT_CACHE "
    "TORCH_NCCL_COORD_CHECK_MILSEC TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN "
    "TORCH_NCCL_RETHROW_CUDA_ERRORS TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK "
    "TORCH_FR_BUFFER_SIZE TORCH_FR_CPP_STACK TORCH_DISTRIBUTED_DEBUG TORCH_GLOO_LAZY_INIT "
    "GLOO_SOCKET_IFNAME OMP_NUM_THREADS CUDA_DEVICE_ORDER CUDA_VISIBLE_DEVICES"
).split()

TORCHRUN_VARIABLES = ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]

OFI_VARIABLES = ["FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "RDMAV_FORK_SAFE"]

TCPX_VARIABLES = [
    "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME", "NCCL_GPUDIRECTTCPX_CTRL_DEV", "NCCL_GPUDIRECTTCPX_FORCE_ACK",
    "NCCL_GPUDIRECTTCPX_TX_COMPLETION_NANOSLEEP", "NCCL_GPUDIRECTTCPX_TX_BINDINGS",
    "NCCL_GPUDIRECTTCPX_RX_BINDINGS", "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS",
    "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX",
]

READERS: dict[str, str] = {
    **{name: _NCCL for name in NCCL_VARIABLES},
    **{name: _TORCH for name in TORCH_VARIABLES},
    **{name: _TORCHRUN for name in TORCHRUN_VARIABLES},
    **{name: _OFI for name in OFI_VARIABLES},
    **{name: _TCPX for name in TCPX_VARIABLES},
}

# Names that circulate but are not read (or only as a deprecated alias): name -> (use instead, why).
REFUSED: dict[str, tuple[str | None, str]] = {
    "NCCL_RING_ALGO": ("NCCL_ALGO", "never an NCCL variable; algorithms are chosen with NCCL_ALGO"),
    "NCCL_COLL_TIMEOUT": (
        None,
        "NCCL has no collective timeout; it is the framework's: init_process_group(timeout=...), "
        "set by `training.collective_timeout`",
    ),
    "NCCL_TIMEOUT": (None, "not an NCCL variable; the collective timeout is `training.collective_timeout`"),
    "NCCL_MIN_NRINGS": ("NCCL_MIN_CTAS", "pre-2.4 alias of NCCL_MIN_NCHANNELS, itself superseded by NCCL_MIN_CTAS"),
    "NCCL_MAX_NRINGS": ("NCCL_MAX_CTAS", "pre-2.4 alias of NCCL_MAX_NCHANNELS, itself superseded by NCCL_MAX_CTAS"),
    "NCCL_ASYNC_ERROR_HANDLING": ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "a PyTorch setting; the NCCL_ name is a deprecated alias"),
    "NCCL_BLOCKING_WAIT": ("TORCH_NCCL_BLOCKING_WAIT", "a PyTorch setting; the NCCL_ name is a deprecated alias"),
    "NCCL_DESYNC_DEBUG": ("TORCH_NCCL_DESYNC_DEBUG", "a PyTorch setting; the NCCL_ name is a deprecated alias"),
    "NCCL_ENABLE_TIMING": ("TORCH_NCCL_ENABLE_TIMING", "a PyTorch setting; the NCCL_ name is a deprecated alias"),
    "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": (
        "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "a PyTorch setting; the NCCL_ name is a deprecated alias",
    ),
    "NCCL_IB_GDR_LEVEL": ("NCCL_NET_GDR_LEVEL", "renamed in NCCL 2.4.0"),
    "NCCL_IB_CUDA_SUPPORT": ("NCCL_NET_GDR_LEVEL", "removed in NCCL 2.4.0"),
    "NCCL_LL_THRESHOLD": ("NCCL_PROTO", "removed in NCCL 2.5, silently ignored since"),
    "NCCL_TREE_THRESHOLD": ("NCCL_ALGO", "removed in NCCL 2.5, silently ignored since"),
    "NCCL_SINGLE_RING_THRESHOLD": (None, "removed in NCCL 2.3"),
    "NCCL_CHECKS_DISABLE": (None, "deprecated in NCCL 2.2.12, no longer read"),
    "NCCL_RINGS": (None, "removed (2.3/2.4 era); NCCL builds its own rings from the topology"),
    "NCCL_DYNAMIC_CHUNK_SIZE": (
        "NCCL_P2P_NET_CHUNKSIZE", "appears in GCP TCPX scripts but is declared by neither NCCL nor PyTorch",
    ),
    "TORCH_NCCL_ASYNC_ERROR_HANDLING_TIMEOUT": (None, "not a PyTorch variable"),
}

_LEVELS = {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS", "NVB", "C2C", "P2C", "PXN"}
_ALGOS = {"ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"}
_PROTOS = {"ll", "ll128", "simple"}
_DEBUG = {"VERSION", "WARN", "INFO", "TRACE", "ABORT"}


@dataclass(frozen=True)
class Check:
    """The verdict on one variable: `ok`, or why not and what to use instead."""

    name: str
    ok: bool
    reader: str | None = None
    reason: str | None = None
    suggestion: str | None = None
    warning: str | None = None


def _token_list(value: str, allowed: set[str]) -> list[str]:
    """Tokens of an NCCL_ALGO/NCCL_PROTO value not in `allowed` (handles `^` and `func:list;...`)."""
    bad = []
    for clause in value.split(";"):
        clause = clause.split(":", 1)[-1] if ":" in clause else clause
        for token in clause.lstrip("^").split(","):
            token = token.strip()
            if token and token.lower() not in allowed:
                bad.append(token)
    return bad


def _value_problem(name: str, value: str) -> str | None:
    value = str(value).strip()
    if name in ("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL") and value.upper() not in _LEVELS and not value.isdigit():
        return f"{name}={value!r}: expected one of {sorted(_LEVELS)} (NCCL has no NODE level: use PHB)"
    if name == "NCCL_ALGO" and (bad := _token_list(value, _ALGOS)):
        return f"NCCL_ALGO={value!r}: unknown algorithm(s) {bad}; NCCL fails at init on them"
    if name == "NCCL_PROTO" and (bad := _token_list(value, _PROTOS)):
        return f"NCCL_PROTO={value!r}: unknown protocol(s) {bad}; expected LL, LL128, Simple"
    if name == "NCCL_DEBUG" and value.upper() not in _DEBUG:
        return f"NCCL_DEBUG={value!r}: expected one of {sorted(_DEBUG)}"
    return None


def _value_warning(name: str, value: str) -> str | None:
    value = str(value)
    if name == "NCCL_IB_HCA" and value and not value.lstrip("^").startswith("="):
        return (
            f"NCCL_IB_HCA={value!r} is a prefix match (mlx5_1 also selects mlx5_10..19); "
            "start it with '=' for exact names"
        )
    if name in ("NCCL_ALGO", "NCCL_PROTO", "NCCL_BUFFSIZE", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"):
        return f"{name} is a debugging knob in NCCL's documentation; keep it only where the vendor prescribes it"
    return None


def check(name: str, value: str | None = None) -> Check:
    """Is `name` read by NCCL, PyTorch, torchrun or a network plugin (and is `value` one it accepts)?"""
    if name in REFUSED:
        instead, why = REFUSED[name]
        return Check(name, False, reason=why, suggestion=instead)
    reader = READERS.get(name)
    if reader is None:
        close = difflib.get_close_matches(name, list(READERS), n=1, cutoff=0.75)
        return Check(
            name, False,
            reason="not read by NCCL, PyTorch, torchrun or a known NCCL network plugin",
            suggestion=close[0] if close else None,
        )
    if value is not None and (problem := _value_problem(name, value)):
        return Check(name, False, reader=reader, reason=problem)
    warning = _value_warning(name, value) if value is not None else None
    return Check(name, True, reader=reader, warning=warning)


_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _as_value(name: str, value: object) -> tuple[str | None, str | None]:
    """(the value as the environment holds it, None) or (None, the problem): a boolean is 1 or 0 (as
    NCCL and PyTorch parse flags: `True` would read as 0), a number as written; a list, a mapping or
    a string with a control character (a NUL cannot be in an environment; a newline splits it) is
    refused, and so is a number that is not finite."""
    if isinstance(value, bool):
        return ("1" if value else "0"), None
    if isinstance(value, float):
        if not math.isfinite(value):  # `inf`/`nan` would reach NCCL, whose strtoll reads them as 0
            return None, f"{name}={value!r}: not a finite number"
        if value.is_integer():  # 4.0 from a JSON form is 4; 1e20 is all its digits, not `1e+20` (read as 1)
            return str(int(value)), None
        return repr(value), None
    if isinstance(value, int):
        return str(value), None
    if not isinstance(value, str):
        return None, f"{name}: a {type(value).__name__} is not a value (give a string or a number)"
    if _CONTROL_RE.search(value):
        return None, f"{name}={value[:40]!r}: control characters (a NUL, a newline) cannot be in its value"
    return value, None


def validate(overrides: dict[str, object], *, source: str = "overrides") -> dict[str, str]:
    """`overrides` as strings if every name is read by its library and every value is a string
    (without control characters), a number or a boolean (as 1/0); else UsageError naming each bad
    name with the one to use instead, or the bad value. Values of None are dropped."""
    bad_names, bad_values, clean = [], [], {}
    for name, value in overrides.items():
        if value is None:
            continue
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            bad_names.append(f"{name!r} is not an environment variable name")
            continue
        text, problem = _as_value(name, value)
        if problem:
            bad_values.append(problem)
            continue
        verdict = check(name, text)
        if verdict.ok:
            clean[name] = text
            continue
        if verdict.reader is not None:  # a variable its library reads, with a value it rejects
            bad_values.append(verdict.reason)
            continue
        text = f"{name}: {verdict.reason}"
        if verdict.suggestion:
            text += f" (use {verdict.suggestion})"
        bad_names.append(text)
    if bad_names or bad_values:
        hints = []
        if bad_names:
            hints.append("set only variables NCCL or PyTorch read")
        if bad_values:
            hints.append("give each variable a value its library accepts (a string or a number, one line, "
                         "from the choices named)")
        raise UsageError(
            f"refused {source}: " + "; ".join(bad_names + bad_values),
            hint="; ".join(hints) + "; see docs/training.md#environment",
        )
    return clean


# What the DAG form may not set, though its library reads it: the form is open to whoever may
# trigger a DAG, and these name code to load or files to write or read on the worker, as the
# worker's user. name -> (refused values: "path" = a value naming a path; "any" = every value, why).
FORM_REFUSED: dict[str, tuple[str, str]] = {
    "NCCL_NET_PLUGIN": ("path", "a shared library every rank loads: only a plugin's name (found in the library "
                                "path, as installed) is taken from the form"),
    "NCCL_TUNER_PLUGIN": ("path", "a shared library every rank loads: only a plugin's name is taken from the form"),
    "NCCL_PROFILER_PLUGIN": ("path", "a shared library every rank loads: only a plugin's name is taken from the form"),
    "NCCL_DEBUG_FILE": ("any", "a file every rank writes, wherever it points"),
    "NCCL_TOPO_DUMP_FILE": ("any", "a file every rank writes, wherever it points"),
    "NCCL_CONF_FILE": ("any", "a file of further NCCL settings (plugin libraries included) every rank reads"),
    "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX": ("any", "a folder of sockets the plugin connects to"),
}


def form_overrides(value: object) -> dict[str, str]:
    """The DAG form's `overrides` as `validate` returns them, for an untrusted face: also UsageError
    unless it is a JSON object, and for any variable of `FORM_REFUSED` (a library path NCCL would
    load, a file it would write or read); those belong in `training.profiles_file` or the CLI's
    `--set`, which only the machine's own users reach. Empty or None: no overrides."""
    if value is None or value == {}:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"overrides must be a JSON object of NAME: value, not a {type(value).__name__}",
                         hint='e.g. {"NCCL_SOCKET_IFNAME": "=eth0"}; empty for none')
    clean = validate(value)
    refused = []
    for name, text in clean.items():
        if name in FORM_REFUSED:
            kind, why = FORM_REFUSED[name]
            if kind == "any" or "/" in text or "\\" in text:
                refused.append(f"{name}={text[:80]!r}: {why}")
    if refused:
        raise UsageError("refused overrides from the form: " + "; ".join(refused),
                         hint="set these in a profile of training.profiles_file (or with `seedance train launch "
                              "--set` on the machine); see docs/training.md#environment")
    return clean


SET_HINT = "write each override as NAME=value, e.g. --set NCCL_DEBUG=INFO (repeat --set for more)"


def parse_assignments(items: list[str] | None) -> dict[str, str]:
    """`["NAME=value", ...]` (the CLI's --set) -> dict; UsageError on an item without `=`."""
    parsed: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"--set {item!r}: expected NAME=value", hint=SET_HINT)
        name, value = item.split("=", 1)
        parsed[name.strip()] = value
    return parsed
