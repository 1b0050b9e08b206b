"""Every real `nvidia-smi topo -m` sample parses to the right GPUs, links, NUMA nodes, NICs, CPUs."""

from __future__ import annotations

import pytest

from seedance_tasks.errors import InputError, UsageError
from seedance_tasks.training.topology import (
    format_cpu_list,
    parse_cpu_list,
    parse_numa_list,
    parse_topologies,
    parse_topology,
)
from tests.conftest import DATA

TOPO = DATA / "training" / "topo"
GPUS8 = [f"GPU{i}" for i in range(8)]


def load(name: str, index: int = 0):
    return parse_topology((TOPO / name).read_text(), name, index)


# file -> (nics, numa per GPU, CPU affinity per GPU (as printed), GPU-GPU link kinds, pcie-only view)
EXPECTED = {
    "a100_8gpu_nv12_2numa_spaces_nonic.txt": (
        [], [0, 0, 0, 0, 1, 1, 1, 1], ["0-23"] * 4 + ["24-47"] * 4, ["NV12"], False,
    ),
    "dgx1_8gpu_topo_mp_pcie_only_view_4nic.txt": (
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"], [0, 0, 0, 0, 1, 1, 1, 1],
        ["0-19,40-59"] * 4 + ["20-39,60-79"] * 4, ["PIX", "PHB", "SYS"], True,
    ),
    "dgx_a100_8gpu_nv12_12nic_mlx5.txt": (
        [f"mlx5_{i}" for i in range(12)], [3, 3, 1, 1, 7, 7, 5, 5],
        ["48-63,176-191"] * 2 + ["16-31,144-159"] * 2 + ["112-127,240-255"] * 2 + ["80-95,208-223"] * 2,
        ["NV12"], False,
    ),
    "h100_8gpu_nv18_2numa_ht_affinity_spaces.txt": (
        [], [0, 0, 0, 0, 1, 1, 1, 1], ["0-51,104-155"] * 4 + ["52-103,156-207"] * 4, ["NV18"], False,
    ),
    "h100_8gpu_nv18_6nic_niclegend_empty_affinity_della.txt": (
        [f"mlx5_{i}" for i in range(6)], [0, 0, 0, 0, 1, 1, 1, 1], [""] * 4 + ["1"] * 4, ["NV18"], False,
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_eight_gpu_samples(name):
    nics, numa, cpus, kinds, pcie_only = EXPECTED[name]
    topo = load(name)
    assert topo.gpus == GPUS8
    assert topo.nics == nics
    assert [topo.numa[gpu] for gpu in GPUS8] == numa
    assert [format_cpu_list(topo.cpu_affinity[gpu]) for gpu in GPUS8] == cpus
    assert topo.gpu_link_types() == kinds
    assert topo.pcie_only_view is pcie_only
    for gpu in GPUS8:
        assert topo.links[gpu][gpu] == "X"
        for other in GPUS8:  # the matrix is symmetric
            assert topo.links[gpu][other] == topo.links[other][gpu]


def test_mlx5_headers_and_links_to_nics():
    topo = load("dgx_a100_8gpu_nv12_12nic_mlx5.txt")
    assert topo.links["GPU0"]["mlx5_0"] == "PXB"
    assert topo.links["GPU0"]["mlx5_2"] == "SYS"
    assert topo.links["GPU6"]["mlx5_8"] == "PXB"
    assert topo.links["mlx5_4"]["mlx5_5"] == "PIX"
    assert topo.nearest_nics("GPU4") == ["mlx5_6", "mlx5_7"]
    # storage/management HCAs (SYS to every GPU) are not compute NICs
    assert topo.compute_nics() == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]


def test_nic_legend_resolves_names_and_gpu_numa_id_column():
    topo = load("h100_8gpu_nv18_6nic_niclegend_empty_affinity_della.txt")
    assert topo.nic_legend == {f"NIC{i}": f"mlx5_{i}" for i in range(6)}
    assert "NIC0" not in topo.links["GPU0"]
    assert topo.links["GPU0"]["mlx5_0"] == "PIX"
    assert topo.links["GPU0"]["mlx5_1"] == "PIX"
    assert topo.links["GPU3"]["mlx5_2"] == "PIX"
    assert topo.links["GPU6"]["mlx5_5"] == "PIX"
    assert topo.links["mlx5_3"]["mlx5_4"] == "PIX"
    assert topo.gpu_numa_id == {gpu: None for gpu in GPUS8}  # N/A
    assert topo.cpu_affinity["GPU0"] is None  # an empty cell, not a shifted NUMA value
    assert topo.nearest_nics("GPU0") == ["mlx5_0", "mlx5_1"]
    assert topo.nearest_nics("GPU1") == [f"mlx5_{i}" for i in range(6)]  # all NODE: a tie


def test_topo_mp_hides_nvlink():
    topo = load("dgx1_8gpu_topo_mp_pcie_only_view_4nic.txt")
    assert topo.links["GPU0"]["GPU1"] == "PIX"
    assert topo.links["GPU0"]["GPU4"] == "SYS"
    assert topo.links["GPU3"]["mlx5_1"] == "PIX"
    assert not topo.nvlink_all_pairs


def test_file_with_two_machines():
    found = parse_topologies((TOPO / "two_gpu_nv2_and_phb_consumer.txt").read_text())
    assert len(found) == 2
    nvlink, pcie = found
    assert nvlink.gpus == pcie.gpus == ["GPU0", "GPU1"]
    assert nvlink.links["GPU0"]["GPU1"] == "NV2" and nvlink.nvlink_all_pairs
    assert pcie.links["GPU1"]["GPU0"] == "PHB" and not pcie.nvlink_all_pairs
    assert nvlink.numa == {"GPU0": None, "GPU1": None}  # N/A
    assert format_cpu_list(pcie.cpu_affinity["GPU0"]) == "0-11"
    assert load("two_gpu_nv2_and_phb_consumer.txt", 1).links["GPU0"]["GPU1"] == "PHB"


def test_cpu_lists_round_trip():
    assert parse_cpu_list("0-2,5,8-9") == [0, 1, 2, 5, 8, 9]
    assert parse_cpu_list("N/A") is None and parse_cpu_list("") is None
    assert format_cpu_list([9, 8, 5, 2, 1, 0]) == "0-2,5,8-9"


def test_malformed_input_names_the_line():
    text = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV99X\t0-3\t0\nGPU1\tNV4\t X \t0-3\t0\n"
    with pytest.raises(InputError, match=r":2: unknown link type 'NV99X'"):
        parse_topology(text, "bad.txt")
    with pytest.raises(InputError, match="no `nvidia-smi topo -m` matrix"):
        parse_topology("No devices were found\n", "empty.txt")
    truncated = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-3\n"
    with pytest.raises(InputError, match="GPU1"):
        parse_topology(truncated, "short.txt")


@pytest.mark.parametrize("text, expected", [
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-3\n", "GPU(s) ['GPU1'] are in the header but have no row"),
    ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU2\tNV4\t X \n", ":3: row 'GPU2' has no column in the header"),
    ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\n", ":3: row GPU1 has 1 link cells, the header 2"),
    ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n  stray text\n", ":4: not a row"),
])
def test_every_malformed_matrix_is_named_by_line_with_a_hint(text, expected):
    with pytest.raises(InputError) as caught:
        parse_topology(text, "bad.txt")
    assert caught.value.message.startswith("bad.txt") and expected in caught.value.message, caught.value.message
    assert caught.value.hint


def test_asking_for_a_matrix_past_the_last_says_which_there_are():
    text = (TOPO / "two_gpu_nv2_and_phb_consumer.txt").read_text()
    with pytest.raises(UsageError) as caught:
        parse_topology(text, "two.txt", 2)
    assert "holds 2 topology matrices" in caught.value.message and "--machine between 0 and 1" in caught.value.hint


DELLA = "h100_8gpu_nv18_6nic_niclegend_empty_affinity_della.txt"
A100 = "a100_8gpu_nv12_2numa_spaces_nonic.txt"


def _a100_line(number: int, old: str, new: str) -> str:
    lines = (TOPO / A100).read_text().splitlines(keepends=True)
    assert old in lines[number - 1]
    lines[number - 1] = lines[number - 1].replace(old, new, 1)
    return "".join(lines)


def test_space_aligned_empty_affinity_cell_is_placed_by_its_column_not_shifted():
    tabbed = load(DELLA)
    spaced = parse_topology((TOPO / DELLA).read_text().expandtabs(8), "della_spaces.txt")  # as `expand -t 8`
    assert spaced.numa == tabbed.numa == {gpu: 0 if int(gpu[3]) < 4 else 1 for gpu in GPUS8}
    assert spaced.cpu_affinity == tabbed.cpu_affinity
    assert spaced.cpu_affinity["GPU0"] is None and spaced.cpu_affinity["GPU4"] == [1]
    assert spaced.gpu_numa_id == tabbed.gpu_numa_id


@pytest.mark.parametrize("old, new", [
    ("\t1\t1\t\tN/A", "\t\t1\t\tN/A"),  # every row short: no complete row shows where the columns are
    ("\t1\t1\t\tN/A", "\t52-103,156-207\t1\t\tN/A"),  # wide cells move the NUMA column of complete rows
])
def test_space_aligned_rows_whose_empty_cell_cannot_be_told_are_refused(old, new):
    text = (TOPO / DELLA).read_text().replace(old, new).expandtabs(8)
    with pytest.raises(InputError) as caught:
        parse_topology(text, "spaces.txt")
    assert caught.value.message.startswith("spaces.txt:3: row GPU0 has 2 cells for the 3 columns")
    assert "tab-separated" in caught.value.hint


@pytest.mark.parametrize("cell, reason", [
    ("0-2x3", "'0-2x3' is not a CPU id or a range of them"),
    ("47-24", "malformed range '47-24'"),
    ("0-99999999999", "CPU 99999999999 is above 65535"),
    ("65536", "CPU 65536 is above 65535"),
])
def test_a_malformed_cpu_affinity_cell_names_file_line_and_gpu(cell, reason):
    with pytest.raises(InputError) as caught:
        parse_topology(_a100_line(4, "0-23 ", f"{cell} "), "a100.txt")
    assert caught.value.message.startswith(f"a100.txt:4: CPU Affinity '{cell}' of GPU0 is not a CPU list")
    assert reason in caught.value.message and caught.value.hint


def test_numa_lists_are_checked_and_bounded_like_cpu_lists():
    assert parse_numa_list("0") == [0] and parse_numa_list("0-1,3") == [0, 1, 3]
    assert parse_numa_list("N/A") is None and parse_numa_list(" ") is None
    assert parse_numa_list("1023") == [1023]
    for bad in ("1-", "-3", "a", "1-2-3", "٣", "1024"):
        with pytest.raises(ValueError):
            parse_numa_list(bad)


def test_cpu_list_parts_are_checked_and_bounded():
    assert parse_cpu_list("3,1-2,2") == [1, 2, 3]
    assert parse_cpu_list("0-65535")[-1] == 65535
    for bad in ("1-", "-3", "a", "1-2-3", "٣"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


@pytest.mark.parametrize("line, old, new, expected", [
    (4, "0-23         0", "NV12 NV12 0-23  0", ":4: row GPU0 has 10 link cells, the header 8"),
    (4, "0-23         0", "0-23  0  7  9", ":4: row GPU0 has 4 cells after its links, the header 2"),
    (12, "", "", ":12: a second row for GPU0 (the first is line 4)"),
    (5, "NV12  NV12  NV12", "NV12  PIX   NV12", ":5: GPU1-GPU3 is PIX here but GPU3-GPU1 is NV12 on line 7"),
])
def test_edited_rows_are_refused_naming_the_line(line, old, new, expected):
    if line == 12:  # GPU0's row pasted again at the end
        text = (TOPO / A100).read_text() + (TOPO / A100).read_text().splitlines(keepends=True)[3]
    else:
        text = _a100_line(line, old, new)
    with pytest.raises(InputError) as caught:
        parse_topology(text, "a100.txt")
    assert expected in caught.value.message, caught.value.message
    assert caught.value.hint


def test_an_unindented_header_is_still_the_header():
    text = _a100_line(3, "      GPU0", "GPU0")
    assert parse_topology(text, "a100.txt").cpu_affinity == load(A100).cpu_affinity


def test_nic_headers_without_a_legend_are_reported_unnamed():
    head = "".join((TOPO / DELLA).read_text().splitlines(keepends=True)[:16])  # `head -n 16`: no legends
    topo = parse_topology(head, "della_nolegend.txt")
    assert topo.unnamed_nics == [f"NIC{i}" for i in range(6)]
    assert load(DELLA).unnamed_nics == []


@pytest.mark.parametrize("cell, reason", [
    ("0-x", "'0-x' is not a NUMA node id or a range of them"),
    ("abc", "'abc' is not a NUMA node id or a range of them"),
    ("-1", "'-1' is not a NUMA node id or a range of them"),
    ("1-0", "malformed range '1-0'"),
    ("1024", "NUMA node 1024 is above 1023"),
    ("99999999999", "NUMA node 99999999999 is above 1023"),
])
def test_a_malformed_numa_affinity_cell_names_file_line_gpu_and_column(cell, reason):
    with pytest.raises(InputError) as caught:
        parse_topology(_a100_line(4, "0-23         0", f"0-23         {cell}"), "a100.txt")
    assert caught.value.message.startswith(f"a100.txt:4: NUMA Affinity '{cell}' of GPU0 is not a NUMA node list")
    assert reason in caught.value.message, caught.value.message
    assert "N/A" in caught.value.hint and "1023" in caught.value.hint


@pytest.mark.parametrize("cell, reason", [
    ("x1", "'x1' is not a NUMA node id"), ("2000", "NUMA node 2000 is above 1023"), ("4-5", "not a list or range"),
])
def test_a_malformed_gpu_numa_id_cell_names_file_line_gpu_and_column(cell, reason):
    lines = (TOPO / DELLA).read_text().splitlines(keepends=True)
    assert lines[2].startswith("GPU0\t") and lines[2].endswith("\tN/A\n")
    lines[2] = lines[2][: -len("N/A\n")] + cell + "\n"
    with pytest.raises(InputError) as caught:
        parse_topology("".join(lines), "della.txt")
    assert caught.value.message.startswith(f"della.txt:3: GPU NUMA ID '{cell}' of GPU0 is not a NUMA node id")
    assert reason in caught.value.message and caught.value.hint


def test_numa_affinity_n_a_and_ranges_are_kept_not_refused():
    # nvidia-smi prints a range where a GPU's memory affinity spans nodes (seen on a dual-socket Xeon
    # E5 board: `NUMA Affinity 0-1`); N/A where the machine reports none
    spanning = parse_topology(_a100_line(4, "0-23         0", "0-23         0-1"), "a100.txt")
    assert spanning.numa_affinity["GPU0"] == [0, 1] and spanning.numa["GPU0"] is None
    assert spanning.multi_numa_gpus() == ["GPU0"] and spanning.numa["GPU1"] == 0
    assert spanning.to_dict()["numa_affinity"]["GPU0"] == "0-1"
    na = parse_topology(_a100_line(4, "0-23         0", "0-23         N/A"), "a100.txt")
    assert na.numa["GPU0"] is None and na.numa_affinity["GPU0"] is None and na.multi_numa_gpus() == []
    assert load(A100).numa_affinity == {gpu: [0] if int(gpu[3]) < 4 else [1] for gpu in GPUS8}
    assert load(A100).source == A100


@pytest.mark.parametrize("encode", [
    lambda text: "\ufeff".encode() + text.encode(),  # a UTF-8 byte-order mark (Windows editors)
    lambda text: text.encode("utf-16"),  # Windows PowerShell's `nvidia-smi topo -m > FILE`
    lambda text: "\n".join(f"\x1b[32m{line}\x1b[0m" for line in text.splitlines()).encode(),  # colour codes
    lambda text: text.replace("\n", "\r\n").encode(),
])
@pytest.mark.parametrize("name", ["h100_8gpu_nv18_6nic_niclegend_empty_affinity_della.txt",
                                  "h100_8gpu_nv18_2numa_ht_affinity_spaces.txt"])
def test_a_saved_matrix_with_a_bom_utf16_colour_codes_or_crlf_parses_as_printed(tmp_path, name, encode):
    import json

    from typer.testing import CliRunner

    from seedance_tasks.cli import app
    from seedance_tasks.training.topology import read_topology_file

    path = tmp_path / name
    path.write_bytes(encode((TOPO / name).read_text()))
    assert parse_topology(read_topology_file(path), name).to_dict() == load(name).to_dict()
    shown = CliRunner().invoke(app, ["train", "plan", "--topology", str(path), "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["gpus"] == GPUS8


@pytest.mark.parametrize("margin", ["    ", "\t", "  "])
@pytest.mark.parametrize("name", sorted(path.name for path in TOPO.glob("*.txt")))
def test_a_matrix_indented_as_a_whole_parses_as_printed(name, margin):
    text = (TOPO / name).read_text()
    indented = "\n".join(margin + line if line.strip() else line for line in text.splitlines())
    assert parse_topology(indented, name).to_dict() == parse_topology(text, name).to_dict()


def test_a_row_indented_differently_from_the_others_is_still_not_a_row():
    text = "    \tGPU0\tGPU1\n    GPU0\t X \tNV4\n      GPU1\tNV4\t X \n"
    with pytest.raises(InputError, match=":3: not a row"):
        parse_topology(text, "mixed.txt")
