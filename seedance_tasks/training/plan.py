"""A launch plan: topology -> NCCL profile -> environment, per-rank NIC and CPU binding, torchrun command.

Every variable a plan carries is one NCCL, PyTorch, torchrun or the profile's network plugin
reads (`envvars.check`); a profile file or an override that names another is refused.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from seedance_tasks.errors import ConfigError, UsageError
from seedance_tasks.training import envvars
from seedance_tasks.training.topology import Topology, format_cpu_list, link_rank

DEFAULT_PROFILES = Path(__file__).resolve().parents[2] / "config" / "nccl_profiles.yaml"
TRAINER_MODULE = "seedance_tasks.training.trainer"
RANKS_ENV = "SEEDANCE_TRAIN_RANKS"  # per-local-rank env + CPU binding, applied by the trainer at start
# How the NICs carry NCCL's inter-node traffic (`--nic-transport`, `training.nic_transport`):
# auto = from the NIC names (`mlx5_*` etc.: ib; `rdmap*`/`efa*`: efa; none shown: none).
NIC_TRANSPORTS = ("auto", "ib", "efa", "none")
NIC_TRANSPORT_HINT = ("pass the whole output of `nvidia-smi topo -m`, including its NIC Legend, or set the "
                      "transport with --nic-transport ib|efa|none (setting training.nic_transport)")


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    env: dict[str, str]
    match: dict[str, str] | None
    backend: str | None
    nic_per_rank: bool
    expected_busbw_gbps: dict[str, float]
    notes: list[str]
    source: list[str]


PROFILES_HINT = "see the layout in config/nccl_profiles.yaml: `profiles: {NAME: {env: {VARIABLE: value}}}`"


def _mapping(value: object, path: str, where: str) -> dict:
    """`value` as a dict ({} for an empty one); ConfigError naming `path` and `where` (the profile and
    key) when the file holds a list, a string or a number there instead of a mapping."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"NCCL profiles file {path}: {where} must be a mapping (NAME: value), "
                          f"not a {type(value).__name__}", hint=PROFILES_HINT)
    return value


def _list(value: object, path: str, where: str) -> list:
    """`value` as a list (a lone string is a one-item list); ConfigError naming `path` and `where`
    for a mapping or a number."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ConfigError(f"NCCL profiles file {path}: {where} must be a list, not a {type(value).__name__}",
                          hint=PROFILES_HINT)
    return value


def _busbw(value: object, path: str, where: str) -> dict[str, float]:
    """`expected_busbw_gbps` as {link type: GB/s}; ConfigError naming the link type on a value that
    is not a positive finite number."""
    table = {}
    for kind, gbps in _mapping(value, path, where).items():
        number = gbps if isinstance(gbps, int | float) and not isinstance(gbps, bool) else None
        if number is None or not math.isfinite(number) or number <= 0:
            raise ConfigError(f"NCCL profiles file {path}: {where}.{kind}={gbps!r} is not a positive number "
                              "of GB/s", hint=PROFILES_HINT)
        table[str(kind)] = float(number)
    return table


PROFILES_FILE_HINT = "training.profiles_file names the NCCL profiles file (null: config/nccl_profiles.yaml)"


def _read_profiles(path: str) -> Any:
    """The YAML value of the profiles file `path`, read as the settings are (`config.read_yaml_file`:
    bounded, UTF-8, a key given twice or an alias bomb refused naming its line); ConfigError naming
    the file, with a hint, for any failure."""
    from seedance_tasks.config import read_yaml_file

    return read_yaml_file(path, "NCCL profiles file", PROFILES_FILE_HINT, PROFILES_HINT) or {}


@lru_cache(maxsize=8)
def _load(path: str) -> tuple[dict[str, Profile], dict[str, dict[str, str]]]:
    data = _read_profiles(path)
    data = _mapping(data, path, "the file")
    unknown = set(data) - {"common", "profiles"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {sorted(unknown)}", hint=PROFILES_HINT)
    # validate gives the values as the environment holds them (YAML's true/yes: 1, never "True")
    common = {key: envvars.validate(_mapping(value, path, f"common.{key}"), source=f"{path}: common.{key}")
              for key, value in _mapping(data.get("common"), path, "common").items()}
    profiles: dict[str, Profile] = {}
    allowed = {"description", "match", "backend", "env", "nic_per_rank", "expected_busbw_gbps", "notes", "source"}
    for name, body in _mapping(data.get("profiles"), path, "profiles").items():
        body = _mapping(body, path, f"profile {name!r}")
        extra = set(body) - allowed
        if extra:
            raise ConfigError(f"{path}: profile {name!r} has unknown key(s) {sorted(extra)}", hint=PROFILES_HINT)
        env = envvars.validate(_mapping(body.get("env"), path, f"profile {name!r} key env"),
                               source=f"{path}: profile {name}")
        # placeholders are checked with a representative value
        envvars.validate({k: v.replace("{ib_hca}", "=mlx5_0") for k, v in env.items()}, source=f"{path}: profile {name}")
        match = body.get("match")
        profiles[name] = Profile(
            name=name,
            description=str(body.get("description", "")),
            env=env,
            match=_mapping(match, path, f"profile {name!r} key match") if match is not None else None,
            backend=body.get("backend"),
            nic_per_rank=bool(body.get("nic_per_rank", False)),
            expected_busbw_gbps=_busbw(body.get("expected_busbw_gbps"), path,
                                       f"profile {name!r} key expected_busbw_gbps"),
            notes=_list(body.get("notes"), path, f"profile {name!r} key notes"),
            source=_list(body.get("source"), path, f"profile {name!r} key source"),
        )
    if not profiles:
        raise ConfigError(f"{path}: no profiles", hint=PROFILES_HINT)
    return profiles, common


def load_profiles(path: str | Path | None = None) -> dict[str, Profile]:
    """The profiles of `path` (default config/nccl_profiles.yaml), each validated."""
    return _load(str(path or DEFAULT_PROFILES))[0]


def nic_transport_of(topology: Topology | None, override: str | None = "auto") -> str:
    """How the topology's NICs carry inter-node traffic: `ib` (InfiniBand/RoCE verbs HCAs), `efa`
    (AWS EFA: `rdmap*`/`efa*` devices), `none` (no NIC), or `unknown`: NIC columns named only
    `NICn` (no NIC Legend), which InfiniBand and EFA machines both print, so the transport is not
    guessed. A given `override` (ib, efa, none) wins; UsageError for any other value."""
    override = override or "auto"
    if override not in NIC_TRANSPORTS:
        raise UsageError(f"unknown NIC transport {override!r}", hint=f"choose one of: {', '.join(NIC_TRANSPORTS)}")
    if override != "auto":
        return override
    nics = topology.nics if topology else []
    unnamed = set(topology.unnamed_nics) if topology else set()
    if any(nic.startswith(("rdmap", "efa")) for nic in nics if nic not in unnamed):
        return "efa"
    if unnamed:
        return "unknown"
    return "ib" if nics else "none"


def _facts(topology: Topology | None, nodes: int, transport: str = "auto") -> dict[str, str]:
    gpus = topology.gpus if topology else []
    return {
        "gpus": "some" if gpus else "none",
        "nodes": "multi" if nodes > 1 else "single",
        "gpu_links": "nvlink" if topology and topology.nvlink_all_pairs else "pcie",
        "nics": nic_transport_of(topology, transport),
    }


# Several nodes whose NIC transport is unknown: nothing transport-specific (no NCCL_IB_HCA, no
# FI_PROVIDER, no per-rank HCA), so NCCL chooses its network itself, as it does with no settings.
UNKNOWN_TRANSPORT_PROFILE = Profile(
    name="nccl-defaults",
    description="Several nodes, NIC transport unknown: NCCL's own defaults, nothing transport-specific",
    env={},
    match=None,
    backend=None,
    nic_per_rank=False,
    expected_busbw_gbps={},
    notes=["NCCL picks its network itself (IB verbs if it finds HCAs, the OFI plugin if installed, else "
           "sockets); name the transport with --nic-transport to get its profile"],
    source=["https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"],
)


def select_profile(
    topology: Topology | None, nodes: int, name: str = "auto", profiles_file: str | Path | None = None,
    nic_transport: str | None = "auto",
) -> tuple[Profile, str]:
    """The profile named `name`, or with `auto` the first whose `match` fits; returns (profile, why).

    With several nodes and an unknown NIC transport (see `nic_transport_of`) and no profile of the
    file matching, `auto` gives UNKNOWN_TRANSPORT_PROFILE (NCCL defaults), never an IB or EFA one."""
    profiles = load_profiles(profiles_file)
    facts = _facts(topology, nodes, nic_transport)
    builtin = {UNKNOWN_TRANSPORT_PROFILE.name: UNKNOWN_TRANSPORT_PROFILE}
    if name and name != "auto":
        chosen = profiles.get(name) or builtin.get(name)
        if chosen is None:
            raise UsageError(f"unknown NCCL profile {name!r}",
                             hint=f"choose one of: auto, {', '.join([*profiles, *builtin])}")
        return chosen, f"chosen by name; machine: {facts}"
    for profile in profiles.values():
        if profile.match and all(facts.get(key) == str(value) for key, value in profile.match.items()):
            return profile, "auto: " + ", ".join(f"{key}={facts[key]}" for key in profile.match)
    if facts["nics"] == "unknown" and facts["gpus"] == "some":
        return UNKNOWN_TRANSPORT_PROFILE, "auto: " + ", ".join(f"{key}={value}" for key, value in facts.items())
    raise UsageError(f"no NCCL profile matches this machine ({facts})", hint="pick one with --profile")


def _span(names: list[str]) -> str:
    """`NIC0..NIC5` for a run of names, the name alone for one."""
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


def _exact_list(nics: list[str]) -> str:
    return "=" + ",".join(nics) if nics else ""


def _rank_layout(topology: Topology | None, nproc: int, nic_per_rank: bool) -> list[dict[str, Any]]:
    ranks: list[dict[str, Any]] = []
    gpus = topology.gpus if topology else []
    sharing: dict[str, int] = {}
    cpu_sets: list[list[int] | None] = []
    for local_rank in range(nproc):
        gpu = gpus[local_rank] if local_rank < len(gpus) else None
        cpus = topology.cpus_of(gpu) if topology and gpu else None
        cpu_sets.append(cpus)
        key = format_cpu_list(cpus)
        sharing[key] = sharing.get(key, 0) + 1
    for local_rank, cpus in enumerate(cpu_sets):
        gpu = gpus[local_rank] if local_rank < len(gpus) else None
        entry: dict[str, Any] = {
            "local_rank": local_rank,
            "gpu": gpu,
            "numa": topology.numa.get(gpu) if topology and gpu else None,
            "cpus": format_cpu_list(cpus) or None,
            "nics": topology.nearest_nics(gpu) if topology and gpu else [],
            "env": {},
        }
        if cpus:
            entry["env"]["OMP_NUM_THREADS"] = str(max(1, len(cpus) // sharing[format_cpu_list(cpus)]))
        if nic_per_rank and entry["nics"] and topology:
            near = entry["nics"]
            if topology.nic_distance(gpu, near[0]) < link_rank("SYS"):
                entry["env"]["NCCL_IB_HCA"] = _exact_list(near)
        ranks.append(entry)
    return ranks


_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?"
_RDZV_RE = re.compile(rf"(?:{_HOST_LABEL}(?:\.{_HOST_LABEL})*|\[[0-9A-Fa-f:.]+(?:%[\w.-]+)?\])(?::(?P<port>\d{{1,5}}))?")


def check_rdzv_endpoint(endpoint: str) -> str:
    """`endpoint` if it is HOST[:PORT] (a host name, an IPv4 address or a bracketed IPv6 one, a port
    1-65535); else UsageError. Nothing else gets into the torchrun command, so the command a plan
    prints can be pasted into a shell as it is."""
    match = _RDZV_RE.fullmatch(endpoint)
    if not match or not 0 < int(match["port"] or 1) <= 65535:
        raise UsageError(f"--rdzv-endpoint {endpoint!r} is not HOST:PORT",
                         hint="a host name or IP address every node reaches, and a free port, e.g. "
                              "node-0.cluster:29500 or [fd00::1]:29500")
    return endpoint


def torchrun_command(
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    max_restarts: int = 0,
    trainer_args: list[str] | None = None,
) -> list[str]:
    """The torchrun command line for the reference trainer, as arguments (print it with shlex.join);
    UsageError for a rendezvous endpoint that is not HOST[:PORT]."""
    if nnodes > 1 and not rdzv_endpoint:
        raise UsageError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the rendezvous every node joins)")
    if rdzv_endpoint:
        check_rdzv_endpoint(rdzv_endpoint)
    command = ["torchrun", f"--nproc-per-node={nproc_per_node}", f"--nnodes={nnodes}"]
    if nnodes > 1:
        command += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"]
    else:
        command += ["--standalone"]
    command += [f"--max-restarts={max_restarts}", "-m", TRAINER_MODULE, *(trainer_args or [])]
    return command


def make_plan(
    topology: Topology | None,
    *,
    nodes: int = 1,
    nproc_per_node: int = 0,
    profile: str = "auto",
    overrides: dict[str, object] | None = None,
    backend: str = "auto",
    nccl_debug: str | None = "INFO",
    max_restarts: int = 0,
    rdzv_endpoint: str | None = None,
    profiles_file: str | Path | None = None,
    trainer_args: list[str] | None = None,
    nic_transport: str | None = "auto",
) -> dict[str, Any]:
    """Everything a launch needs, as a JSON-able dict: `gpus`, `links`, `numa`, `nics`,
    `nic_transport`, `profile`, `env` (node-wide), `ranks` (per local rank: GPU, NUMA node, CPUs,
    nearest NICs, extra env), `command` (torchrun) and `warnings` (each naming the topology file,
    with a `hint:` where there is something to do). Overrides are validated like the profile's own
    variables. An unknown NIC transport never yields IB or EFA settings."""
    transport = nic_transport_of(topology, nic_transport)
    chosen, why = select_profile(topology, nodes, profile, profiles_file, nic_transport)
    clean_overrides = envvars.validate(dict(overrides or {}))
    gpus = topology.gpus if topology else []
    if backend == "auto":
        backend = chosen.backend or ("nccl" if gpus else "gloo")
    if backend == "nccl" and not gpus:
        raise UsageError("the nccl backend needs GPUs, and this topology has none", hint="use --backend gloo")
    nproc = nproc_per_node or (len(gpus) if gpus else 2)
    warnings: list[str] = []
    if nproc < 0:
        raise UsageError(f"--nproc-per-node {nproc} is negative", hint="pass 0 (one per GPU) or a process count")
    if gpus and nproc > len(gpus):
        raise UsageError(f"--nproc-per-node {nproc} but the machine has {len(gpus)} GPUs",
                         hint=f"pass at most {len(gpus)}, or 0 for one process per GPU")
    if not gpus and nproc > (cores := max(2, os.cpu_count() or 1)):
        # a CPU job runs on this machine: more processes than cores only thrash it (and a typo such
        # as 100000 would fork that many Python processes, and stall laying out their ranks)
        raise UsageError(f"--nproc-per-node {nproc} CPU processes but this machine has {cores} cores",
                         hint=f"pass at most {cores} without GPUs (or a topology with GPUs)")
    if topology and topology.pcie_only_view:
        warnings.append("this is a PCIe-only view (`nvidia-smi topo -mp`): NVLinks are not shown; "
                        "plan from `nvidia-smi topo -m` to see them")
    where = f"{topology.source}: " if topology and topology.source else ""
    if topology and gpus and not topology.numa_nodes:
        warnings.append("no NUMA affinity reported (N/A): ranks are not bound to a NUMA node")
    spanning = topology.multi_numa_gpus() if topology else []
    if spanning:
        cells = sorted({format_cpu_list(topology.numa_affinity[gpu]) for gpu in spanning})
        warnings.append(f"{where}{', '.join(spanning)}: NUMA Affinity {', '.join(cells)} spans several NUMA nodes: "
                        "no single node is reported for their ranks (they are bound to their CPU Affinity only)")
    unbound = [gpu for gpu in gpus[:nproc] if topology and not topology.cpus_of(gpu)]
    if unbound:
        warnings.append(f"no CPU affinity reported for {', '.join(unbound)}: those ranks are not bound to CPUs")

    env: dict[str, str] = {}
    if backend == "nccl":
        env.update(_load(str(profiles_file or DEFAULT_PROFILES))[1].get("nccl", {}))
        if nccl_debug:
            env["NCCL_DEBUG"] = nccl_debug
    unnamed = topology.unnamed_nics if topology else []
    if unnamed and transport == "unknown":
        settings = (f"profile {chosen.name}: NCCL's defaults, nothing transport-specific (no NCCL_IB_HCA, no "
                    "FI_PROVIDER); NCCL picks its network itself" if chosen is UNKNOWN_TRANSPORT_PROFILE
                    else f"profile {chosen.name} is used as it is, with NCCL_IB_HCA left unset (NCCL cannot "
                    "match NICn names)")
        warnings.append(f"{where}{_span(unnamed)} {'has' if len(unnamed) == 1 else 'have'} no NIC Legend, so the "
                        f"NIC transport is unknown (InfiniBand and AWS EFA machines both print NICn): {settings}; "
                        f"hint: {NIC_TRANSPORT_HINT}")
    elif unnamed and transport == "ib":
        warnings.append(f"{where}{_span(unnamed)} {'has' if len(unnamed) == 1 else 'have'} no NIC Legend: "
                        "NCCL_IB_HCA is left unset (NCCL cannot match NICn names); hint: pass the whole "
                        "`nvidia-smi topo -m` output, including its NIC Legend")
    hca = _exact_list(topology.compute_nics()) if topology and not unnamed else ""
    for key, value in chosen.env.items():
        if "{ib_hca}" in value:
            if not hca:
                if not unnamed:
                    warnings.append(f"{key} left unset: the topology shows no NICs")
                continue
            value = value.replace("{ib_hca}", hca)
        env[key] = value
    if max_restarts > 0:
        # torchrun's restarts are unreliable when workers share the rendezvous TCP store
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update(clean_overrides)
    for key, value in env.items():  # a last guard: never emit a name nothing reads
        verdict = envvars.check(key, value)
        if not verdict.ok:
            raise ConfigError(f"plan would emit {key}: {verdict.reason}")
        if verdict.warning and key in clean_overrides:
            warnings.append(verdict.warning)

    ranks = _rank_layout(topology, nproc, chosen.nic_per_rank and nodes > 1 and not unnamed)
    for rank in ranks:
        for key in clean_overrides:  # a user's override wins over per-rank derivation
            rank["env"].pop(key, None)
    link_types = topology.gpu_link_types() if topology else []
    expected = next((chosen.expected_busbw_gbps[kind] for kind in link_types if kind in chosen.expected_busbw_gbps), None)
    return {
        "gpus": list(gpus),
        "links": {a: dict(row) for a, row in topology.links.items()} if topology else {},
        "numa": {gpu: topology.numa.get(gpu) for gpu in gpus} if topology else {},
        "nics": list(topology.nics) if topology else [],
        "nic_transport": transport,
        "cpu_affinity": {gpu: format_cpu_list(topology.cpus_of(gpu)) or None for gpu in gpus} if topology else {},
        "gpu_link_types": link_types,
        "pcie_only_view": bool(topology and topology.pcie_only_view),
        "nodes": nodes,
        "nproc_per_node": nproc,
        "backend": backend,
        "profile": {
            "name": chosen.name,
            "description": chosen.description,
            "why": why,
            "notes": chosen.notes,
            "source": chosen.source,
            "expected_busbw_gbps": expected,
        },
        "env": env,
        "ranks": ranks,
        "command": torchrun_command(
            nproc_per_node=nproc, nnodes=nodes, rdzv_endpoint=rdzv_endpoint,
            max_restarts=max_restarts, trainer_args=trainer_args,
        ),
        "warnings": warnings,
    }


def apply_rank_binding(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """In a worker, before the process group starts: set this local rank's variables and bind it to
    its CPUs (those of its GPU, as far as this machine has them). Returns what it did."""
    environ = os.environ if environ is None else environ
    raw = environ.get(RANKS_ENV)
    if not raw:
        return {}
    import json

    local_rank = int(environ.get("LOCAL_RANK", "0"))
    ranks = json.loads(raw)
    if local_rank >= len(ranks):
        return {}
    entry = ranks[local_rank]
    for key, value in (entry.get("env") or {}).items():
        environ[key] = value
    done: dict[str, Any] = {"env": entry.get("env") or {}, "cpus": None}
    if entry.get("cpus") and hasattr(os, "sched_setaffinity"):
        from seedance_tasks.training.topology import parse_cpu_list

        wanted = set(parse_cpu_list(entry["cpus"]) or [])
        usable = wanted & os.sched_getaffinity(0)
        if usable:
            os.sched_setaffinity(0, usable)
            done["cpus"] = format_cpu_list(sorted(usable))
        else:
            done["skipped"] = f"none of CPUs {entry['cpus']} is available here"
    return done
