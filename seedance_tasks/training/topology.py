"""`nvidia-smi topo -m` output parsed into GPUs, NICs, link types, CPU and NUMA affinity.

The matrix comes in many shapes: tab-separated (empty cells possible, e.g. an empty CPU
affinity) or space-aligned (tabs expanded), old NIC headers (`mlx5_0`) or new ones (`NIC0` plus a
"NIC Legend" mapping them to `mlx5_0`), `N/A` NUMA cells, an extra `GPU NUMA ID` column, and the
`topo -mp` variant (PCIe paths only: NVLinks are not shown); CRLF line ends, a byte-order mark and
terminal colour codes are dropped (`read_topology_file` also reads UTF-16). A file may hold several matrices
(several machines); `parse_topologies` returns each. Nothing here runs `nvidia-smi` except
`detect`. A CPU Affinity, NUMA Affinity or GPU NUMA ID cell that is neither empty, `N/A` nor
what nvidia-smi prints there is an InputError naming the file, line, GPU and column.
"""

from __future__ import annotations

import codecs
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seedance_tasks.errors import InputError, UsageError

# Link types nvidia-smi prints, best first; `SOC` is the pre-2017 name of `SYS`.
LINK_ORDER = ["X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS"]
_LINK_RE = re.compile(r"^(X|NV\d+|NVB|PIX|PXB|PHB|NODE|SYS|SOC)$")
_DEVICE_RE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+|[A-Za-z][\w.-]*\d)$")
_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_TRAILING_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_UNNAMED_NIC_RE = re.compile(r"^NIC\d+$")
# terminal colour and cursor codes (ESC [ ... letter), as a copy through `script`, tmux or a CI
# console leaves them; and a byte-order mark
_ESCAPE_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\ufeff")
# The largest CPU id a CPU Affinity cell may name: far above Linux's largest NR_CPUS (8192), and
# small enough that a typo such as 0-99999999999 is refused instead of expanded in memory.
MAX_CPU_ID = 65_535
# The largest NUMA node id a NUMA Affinity / GPU NUMA ID cell may name: Linux allows at most
# 1 << NODES_SHIFT nodes, and NODES_SHIFT is at most 10 (x86-64, arm64), so ids run 0..1023
# (POWER9 GPU memory nodes, 252..255, are the highest seen in practice).
MAX_NUMA_ID = 1_023


def link_rank(link: str) -> int:
    """Distance order of a link type (0 = self, 1 = NVLink, ... 6 = across NUMA nodes); lower is closer."""
    if link == "X":
        return 0
    if link.startswith("NV"):
        return 1
    if link == "SOC":
        link = "SYS"
    return LINK_ORDER.index(link) if link in LINK_ORDER else len(LINK_ORDER)


def parse_cpu_list(text: str) -> list[int] | None:
    """`0-19,40-59` -> [0..19, 40..59] (sorted, once each); empty or `N/A` -> None.

    ValueError saying what is wrong for anything else: a part that is not an id or range, a range
    that ends below its start, an id above MAX_CPU_ID."""
    return _parse_ids(text, MAX_CPU_ID, "CPU")


def parse_numa_list(text: str) -> list[int] | None:
    """A NUMA Affinity cell: `0` -> [0], `0-1` -> [0, 1] (nvidia-smi prints a range where a GPU's
    memory affinity spans several nodes); empty or `N/A` -> None.

    ValueError saying what is wrong for anything else, as parse_cpu_list: `abc`, `0-x`, a
    negative id, an id above MAX_NUMA_ID."""
    return _parse_ids(text, MAX_NUMA_ID, "NUMA node")


def _parse_ids(text: str, limit: int, noun: str) -> list[int] | None:
    text = text.strip()
    if not text or text.upper() == "N/A":
        return None
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        first = _id(low, part, limit, noun)
        last = _id(high, part, limit, noun) if dash else first
        if first > last:
            raise ValueError(f"malformed range {part!r}: it ends below its start")
        ids.update(range(first, last + 1))
    return sorted(ids) or None


def _id(text: str, part: str, limit: int, noun: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"{part!r} is not a {noun} id or a range of them")
    if len(text) > len(str(limit)) or int(text) > limit:
        raise ValueError(f"{noun} {text} is above {limit}, the largest {noun} id accepted")
    return int(text)


def format_cpu_list(cpus: list[int] | None) -> str:
    """[0, 1, 2, 5] -> `0-2,5` (the inverse of parse_cpu_list)."""
    if not cpus:
        return ""
    ordered = sorted(set(cpus))
    ranges, start, prev = [], ordered[0], ordered[0]
    for cpu in ordered[1:] + [None]:  # type: ignore[list-item]
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        ranges.append(f"{start}-{prev}" if prev != start else str(start))
        if cpu is not None:
            start = prev = cpu
    return ",".join(ranges)


@dataclass
class Topology:
    """One machine: GPUs and NICs (NICs under their real names, e.g. `mlx5_0`), links, affinity.

    `links[a][b]` is the link type as printed (`NV12`, `PIX`, `SYS`, `X` on the diagonal).
    `pcie_only_view` is True for `topo -mp` output, where NVLinks are not shown.
    `numa[gpu]` is the GPU's NUMA node where its NUMA Affinity names exactly one, else None;
    `numa_affinity[gpu]` is every node the cell names (None for an empty or `N/A` cell).
    `source` is where the matrix was read from (a file name), for messages.
    """

    gpus: list[str]
    nics: list[str]
    links: dict[str, dict[str, str]]
    cpu_affinity: dict[str, list[int] | None]
    numa: dict[str, int | None]
    gpu_numa_id: dict[str, int | None] = field(default_factory=dict)
    nic_legend: dict[str, str] = field(default_factory=dict)
    pcie_only_view: bool = False
    unnamed_nics: list[str] = field(default_factory=list)  # `NICn` headers the file has no NIC Legend for
    numa_affinity: dict[str, list[int] | None] = field(default_factory=dict)
    source: str = ""

    def link(self, a: str, b: str) -> str:
        return self.links.get(a, {}).get(b, "")

    @property
    def nvlink_all_pairs(self) -> bool:
        """True when every GPU pair is joined by NVLink (NVSwitch or full mesh)."""
        pairs = [(a, b) for a in self.gpus for b in self.gpus if a != b]
        return bool(pairs) and all(self.link(a, b).startswith("NV") for a, b in pairs)

    @property
    def numa_nodes(self) -> list[int]:
        """Every NUMA node a GPU's NUMA Affinity names (empty when every cell is empty or `N/A`)."""
        nodes = {node for node in self.numa.values() if node is not None}
        nodes.update(node for listed in self.numa_affinity.values() for node in listed or [])
        return sorted(nodes)

    def multi_numa_gpus(self) -> list[str]:
        """The GPUs whose NUMA Affinity names several NUMA nodes (e.g. `0-1`): no single node to bind to."""
        return [gpu for gpu in self.gpus if len(self.numa_affinity.get(gpu) or []) > 1]

    def gpu_link_types(self) -> list[str]:
        """The distinct GPU-GPU link types, best first."""
        kinds = {self.link(a, b) for a in self.gpus for b in self.gpus if a != b}
        return sorted(kinds, key=lambda kind: (link_rank(kind), kind))

    def nic_distance(self, gpu: str, nic: str) -> int:
        return link_rank(self.link(gpu, nic) or self.link(nic, gpu) or "SYS")

    def nearest_nics(self, gpu: str) -> list[str]:
        """The NICs at the shortest PCIe distance from `gpu` (all of them on a tie)."""
        if not self.nics:
            return []
        best = min(self.nic_distance(gpu, nic) for nic in self.nics)
        return [nic for nic in self.nics if self.nic_distance(gpu, nic) == best]

    def compute_nics(self) -> list[str]:
        """NICs close to at least one GPU (PIX/PXB/PHB/NODE); NICs only reachable across the
        CPU interconnect from every GPU (storage/management ports on DGX machines) are left out,
        unless that leaves none."""
        close = [
            nic for nic in self.nics
            if any(self.nic_distance(gpu, nic) < link_rank("SYS") for gpu in self.gpus)
        ]
        return close or list(self.nics)

    def cpus_of(self, gpu: str) -> list[int] | None:
        """CPU affinity of `gpu`; when its cell is empty, that of another GPU on the same NUMA node."""
        cpus = self.cpu_affinity.get(gpu)
        if cpus:
            return cpus
        node = self.numa.get(gpu)
        if node is None:
            return None
        for other in self.gpus:
            if other != gpu and self.numa.get(other) == node and self.cpu_affinity.get(other):
                return self.cpu_affinity[other]
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": list(self.gpus),
            "nics": list(self.nics),
            "links": {a: dict(row) for a, row in self.links.items()},
            "numa": dict(self.numa),
            "numa_affinity": {gpu: format_cpu_list(nodes) or None for gpu, nodes in self.numa_affinity.items()},
            "cpu_affinity": {gpu: format_cpu_list(cpus) or None for gpu, cpus in self.cpu_affinity.items()},
            "gpu_numa_id": dict(self.gpu_numa_id),
            "nic_legend": dict(self.nic_legend),
            "pcie_only_view": self.pcie_only_view,
            "unnamed_nics": list(self.unnamed_nics),
            "source": self.source,
        }


def _is_header(line: str) -> bool:
    """`GPU0  GPU1 ... CPU Affinity` (indented as printed, or not); a `GPU0  X  NV12 ...` row is not one."""
    tokens = line.split()
    return bool(tokens) and tokens[0] == "GPU0" and (len(tokens) == 1 or not _LINK_RE.match(tokens[1]))


def _header_columns(line: str) -> list[str]:
    if "\t" in line:
        return [cell.strip() for cell in line.split("\t") if cell.strip()]
    return [cell for cell in re.split(r"\s{2,}", line.strip()) if cell]


def _cells(line: str, tabbed: bool) -> list[tuple[int, str]]:
    """A row's cells with their place: the cell index when tab-separated (empty cells kept), the
    character column when space-aligned (where empty cells leave no trace but a gap)."""
    if tabbed:
        return [(index, cell.strip()) for index, cell in enumerate(line.split("\t"))]
    return [(match.start(), match.group()) for match in re.finditer(r"\S+", line)]


@dataclass
class _Matrix:
    columns: list[str]
    rows: list[tuple[int, str]] = field(default_factory=list)  # (line number, line)
    header: str = ""
    tabbed: bool = False
    legend: dict[str, str] = field(default_factory=dict)
    legend_has_nvlink: bool | None = None
    margin: str | None = None  # what every row starts with (a whole pasted block's indentation); None until the first


def _split_matrices(text: str, source: str) -> list[_Matrix]:
    matrices: list[_Matrix] = []
    current: _Matrix | None = None
    in_legend = in_nic_legend = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _ESCAPE_RE.sub("", raw).rstrip("\r")
        stripped = line.strip()
        if stripped.startswith(("#", "$")):
            continue
        if _is_header(line):
            current = _Matrix(_header_columns(line), tabbed="\t" in line, header=line)
            matrices.append(current)
            in_legend = in_nic_legend = False
            continue
        if current is None or not stripped:
            continue
        if stripped == "Legend:":
            in_legend, in_nic_legend = True, False
            current.legend_has_nvlink = False
            continue
        if stripped == "NIC Legend:":
            in_legend, in_nic_legend = False, True
            continue
        if in_nic_legend:
            match = _LEGEND_RE.match(line)
            if match:
                current.legend[match.group(1)] = match.group(2)
            continue
        if in_legend:
            if stripped.startswith("NV#"):
                current.legend_has_nvlink = True
            continue
        label = stripped.split()[0]
        if current.margin is None and _DEVICE_RE.match(label):
            # rows start at column 0; a matrix indented as a whole (pasted from markdown) indents
            # its header by the same margin, which is stripped from every row
            lead = line[: len(line) - len(line.lstrip(" \t"))]
            current.margin = lead if current.header.startswith(lead) else ""
            header = current.header[len(current.margin):]
            current.columns, current.tabbed = _header_columns(header), "\t" in header
        margin = current.margin or ""
        if line.startswith(margin) and line[len(margin)] not in " \t" and _DEVICE_RE.match(label):
            current.rows.append((number, line[len(margin):]))
        else:
            raise InputError(
                f"{source}:{number}: not a row of an `nvidia-smi topo -m` matrix: {stripped[:60]!r}",
                hint="pass the output of `nvidia-smi topo -m` as printed",
            )
    return matrices


_EDITED_HINT = "the matrix looks edited or cut: pass the output of `nvidia-smi topo -m` as printed"


def _link_cells(where: str, label: str, values: list[str], devices: list[str]) -> list[str]:
    """The row's link cells, one per header device; InputError when there are more or fewer."""
    found = 0
    while found < len(values) and _LINK_RE.match(values[found]):
        found += 1
    if found > len(devices) or len(values) < len(devices):
        raise InputError(f"{where}: row {label} has {max(found, min(len(values), len(devices)))} link cells, "
                         f"the header {len(devices)}", hint=_EDITED_HINT)
    for device, cell in zip(devices, values, strict=False):
        if not _LINK_RE.match(cell):
            raise InputError(f"{where}: unknown link type {cell!r} between {label} and {device}",
                             hint="expected X, NV#, PIX, PXB, PHB, NODE or SYS")
    return ["SYS" if cell == "SOC" else cell for cell in values[: len(devices)]]


def _too_many(where: str, label: str, found: int, extra: list[str]) -> InputError:
    return InputError(f"{where}: row {label} has {found} cells after its links, the header {len(extra)} "
                      f"({', '.join(extra) or 'no affinity columns'})", hint=_EDITED_HINT)


def _tabbed_trailing(where: str, label: str, rest: list[str], extra: list[str]) -> dict[str, str]:
    # tab mode keeps empty cells: the first is CPU Affinity (may be empty); nvidia-smi pads with
    # extra tabs before later columns, so those take the remaining non-empty cells
    if not rest or not extra:
        if any(rest):
            raise _too_many(where, label, len([cell for cell in rest if cell]), extra)
        return {}
    later = [cell for cell in rest[1:] if cell]
    if len(later) > len(extra) - 1:
        raise _too_many(where, label, 1 + len(later), extra)
    return {extra[0]: rest[0], **dict(zip(extra[1:], later, strict=False))}


def _place_short_rows(
    short: dict[str, tuple[str, list[tuple[int, str]]]], complete: list[dict[str, int]], extra: list[str]
) -> dict[str, dict[str, str]]:
    """Space-aligned rows with fewer affinity cells than columns (an empty cell leaves only a gap):
    each cell goes to the column that starts at exactly its character column in the complete rows,
    or the row is refused, naming its line, when none or several do."""
    starts = {column: {row[column] for row in complete} for column in extra}
    placed: dict[str, dict[str, str]] = {}
    for label, (where, cells) in short.items():
        row: dict[str, str] = {}
        for start, text in cells:
            columns = [column for column in extra if start in starts[column] and column not in row]
            if len(columns) != 1:
                raise InputError(
                    f"{where}: row {label} has {len(cells)} cells for the {len(extra)} columns "
                    f"{', '.join(extra)}, and this space-aligned matrix does not show which is empty",
                    hint="pass the tab-separated output as nvidia-smi prints it (`nvidia-smi topo -m > FILE`), "
                         "not a copy with the tabs expanded")
            row[columns[0]] = text
        placed[label] = row
    return placed


def _affinity(where: str, label: str, trailing: dict[str, str]) -> list[int] | None:
    cell = trailing.get("CPU Affinity", "")
    try:
        return parse_cpu_list(cell)
    except ValueError as exc:
        raise InputError(f"{where}: CPU Affinity {cell!r} of {label} is not a CPU list: {exc}",
                         hint="expected CPU ids and ranges as nvidia-smi prints them, e.g. 0-23,48-71 "
                              f"(ids up to {MAX_CPU_ID})") from None


_NUMA_HINT = f"as nvidia-smi prints it, e.g. 0 (or a range such as 0-1), or N/A (ids 0 to {MAX_NUMA_ID})"


def _numa_affinity(where: str, label: str, trailing: dict[str, str]) -> list[int] | None:
    cell = trailing.get("NUMA Affinity", "")
    try:
        return parse_numa_list(cell)
    except ValueError as exc:
        raise InputError(f"{where}: NUMA Affinity {cell!r} of {label} is not a NUMA node list: {exc}",
                         hint=f"expected NUMA node ids {_NUMA_HINT}") from None


def _gpu_numa_id(where: str, label: str, trailing: dict[str, str]) -> int | None:
    cell = trailing.get("GPU NUMA ID", "")
    try:
        nodes = parse_numa_list(cell)
        if nodes and (len(nodes) > 1 or "," in cell or "-" in cell):
            raise ValueError("a GPU's own memory is on one NUMA node, not a list or range")
    except ValueError as exc:
        raise InputError(f"{where}: GPU NUMA ID {cell!r} of {label} is not a NUMA node id: {exc}",
                         hint=f"expected one NUMA node id as nvidia-smi prints it, e.g. 4, or N/A "
                              f"(ids 0 to {MAX_NUMA_ID})") from None
    return nodes[0] if nodes else None


def _check_symmetric(links: dict[str, dict[str, str]], lines: dict[str, str]) -> None:
    for a, row in links.items():
        for b, link in row.items():
            other = links.get(b, {}).get(a)
            if other is not None and other != link and a < b:
                raise InputError(f"{lines[a]}: {a}-{b} is {link} here but {b}-{a} is {other} on line "
                                 f"{lines[b].rsplit(':', 1)[1]}: the matrix is not symmetric", hint=_EDITED_HINT)


def _build(matrix: _Matrix, source: str) -> Topology:
    devices = [col for col in matrix.columns if col not in _TRAILING_COLUMNS]
    extra = [col for col in matrix.columns if col in _TRAILING_COLUMNS]
    legend = dict(matrix.legend)

    def name(device: str) -> str:
        return legend.get(device, device)

    gpus = [device for device in devices if device.startswith("GPU")]
    nics = [name(device) for device in devices if not device.startswith("GPU")]
    links: dict[str, dict[str, str]] = {}
    lines: dict[str, str] = {}  # device -> `file:line` of its row
    trailing: dict[str, dict[str, str]] = {}
    short: dict[str, tuple[str, list[tuple[int, str]]]] = {}
    complete: list[dict[str, int]] = []  # space-aligned: where each affinity column starts
    for number, line in matrix.rows:
        where = f"{source}:{number}"
        cells = _cells(line, matrix.tabbed)
        label, values = cells[0][1], cells[1:]
        if label not in devices:
            raise InputError(f"{where}: row {label!r} has no column in the header {devices}", hint=_EDITED_HINT)
        if name(label) in lines:
            raise InputError(f"{where}: a second row for {label} (the first is line "
                             f"{lines[name(label)].rsplit(':', 1)[1]})", hint=_EDITED_HINT)
        lines[name(label)] = where
        row = _link_cells(where, label, [text for _, text in values], devices)
        links[name(label)] = dict(zip(map(name, devices), row, strict=True))
        rest = values[len(devices):]
        if not label.startswith("GPU"):
            continue
        if matrix.tabbed:
            trailing[label] = _tabbed_trailing(where, label, [text for _, text in rest], extra)
        elif len(rest) > len(extra):
            raise _too_many(where, label, len(rest), extra)
        elif len(rest) == len(extra):
            trailing[label] = {column: text for column, (_, text) in zip(extra, rest, strict=True)}
            complete.append({column: start for column, (start, _) in zip(extra, rest, strict=True)})
        elif rest:
            short[label] = (where, rest)
    trailing.update(_place_short_rows(short, complete, extra))
    missing = [gpu for gpu in gpus if gpu not in links]
    if missing:
        raise InputError(f"{source}: GPU(s) {missing} are in the header but have no row",
                         hint="the matrix looks truncated: pass the whole output of `nvidia-smi topo -m`")
    _check_symmetric(links, lines)
    cpu_affinity = {gpu: _affinity(lines[gpu], gpu, trailing.get(gpu, {})) for gpu in gpus}
    numa_affinity = {gpu: _numa_affinity(lines[gpu], gpu, trailing.get(gpu, {})) for gpu in gpus}
    numa = {gpu: nodes[0] if nodes and len(nodes) == 1 else None for gpu, nodes in numa_affinity.items()}
    gpu_numa_id = ({gpu: _gpu_numa_id(lines[gpu], gpu, trailing.get(gpu, {})) for gpu in gpus}
                   if "GPU NUMA ID" in extra else {})
    unnamed = [device for device in devices if _UNNAMED_NIC_RE.match(device) and device not in legend]
    has_nvlink = any(cell.startswith("NV") for row in links.values() for cell in row.values())
    pcie_only = matrix.legend_has_nvlink is False and not has_nvlink and len(gpus) > 1
    return Topology(gpus, nics, links, cpu_affinity, numa, gpu_numa_id, legend, pcie_only, unnamed,
                    numa_affinity, source)


def parse_topologies(text: str, source: str = "<topology>") -> list[Topology]:
    """Every `nvidia-smi topo -m` matrix in `text`, in order; InputError naming the line if malformed."""
    matrices = _split_matrices(text, source)
    if not matrices:
        raise InputError(
            f"{source}: no `nvidia-smi topo -m` matrix found (no header line starting with GPU0)",
            hint="save the output of `nvidia-smi topo -m` to a file and pass it with --topology",
        )
    return [_build(matrix, source) for matrix in matrices]


# The largest topology file read: a 72-GPU, 18-NIC matrix is under 64 KiB; a log or a core dump
# passed by mistake must not be read into memory whole.
MAX_TOPOLOGY_BYTES = 4 * 1024**2
TOPOLOGY_HINT = ("save a machine's matrix with `nvidia-smi topo -m > topo.txt` and pass that file, or detect it "
                 "on the GPU machine (the CLI's --detect, the DAG's topology `detect`)")


def read_topology_file(path: str | Path) -> str:
    """The text of a saved `nvidia-smi topo -m`: UTF-8 (a byte-order mark dropped) or UTF-16 with
    its byte-order mark (what Windows PowerShell's `>` writes); bytes that do not decode become
    U+FFFD, so a damaged line is named by the parser, not a decoding error. UsageError for a file
    larger than MAX_TOPOLOGY_BYTES."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_TOPOLOGY_BYTES + 1)
    if len(data) > MAX_TOPOLOGY_BYTES:
        raise UsageError(f"topology file {path} is larger than {MAX_TOPOLOGY_BYTES // 1024**2} MiB: not the output "
                         "of `nvidia-smi topo -m`", hint=TOPOLOGY_HINT)
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16", errors="replace")
    return data.decode("utf-8-sig", errors="replace")


def parse_topology(text: str, source: str = "<topology>", index: int = 0) -> Topology:
    """The `index`-th matrix in `text` (most files hold one)."""
    found = parse_topologies(text, source)
    if not 0 <= index < len(found):
        raise UsageError(f"{source} holds {len(found)} topology matrices; there is no #{index}",
                         hint=f"pass --machine between 0 and {len(found) - 1}")
    return found[index]


def load_topology(path: str | None = None, *, detect_here: bool = False, machine: int = 0) -> Topology | None:
    """The topology the CLI's `--topology FILE` / `--detect` or the DAG's `topology` param names:
    the `machine`-th matrix of the file `path`, this machine's (`detect_here`), or None when
    neither is given. UsageError, worded the same for every face, for both at once, an empty
    name, a path that is missing, a folder or not a regular file (a FIFO or device would never end),
    an unreadable or oversized file; InputError naming the line for a malformed matrix."""
    if path is not None and detect_here:
        raise UsageError("give a topology file or detect it on this machine, not both",
                         hint="drop --topology FILE or --detect")
    if detect_here:
        return detect()
    if path is None:
        return None
    if not path.strip():
        raise UsageError("the topology file name is empty", hint=TOPOLOGY_HINT)
    file = Path(path)
    if not file.is_file():
        what = ("is a directory, not a topology file" if file.is_dir() else
                "is not a regular file" if file.exists() else "not found")
        raise UsageError(f"topology file {path}: {what}", hint=TOPOLOGY_HINT)
    try:
        text = read_topology_file(file)
    except OSError as exc:
        raise UsageError(f"cannot read topology file {path}: {exc.strerror or exc}",
                         hint="check its permissions; " + TOPOLOGY_HINT) from None
    return parse_topology(text, str(file), machine)


def detect(timeout_s: float = 30) -> Topology:
    """This machine's topology, from `nvidia-smi topo -m`; UsageError where there is no nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise UsageError(
            "--detect needs nvidia-smi, which is not on this machine's PATH",
            hint="run on a GPU machine, or pass a saved `nvidia-smi topo -m` with --topology",
        )
    done = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise UsageError(f"nvidia-smi topo -m failed ({done.returncode}): {done.stderr.strip()[:300]}",
                         hint="check the GPU driver (nvidia-smi alone), or pass a saved `nvidia-smi topo -m` with --topology")
    return parse_topology(done.stdout, "nvidia-smi topo -m")
