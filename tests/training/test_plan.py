"""Plans: profile choice, the env they emit (only names NCCL/PyTorch read), overrides, per-rank
NIC and CPU binding, and the `seedance train plan` command."""

from __future__ import annotations

import csv
import json
import os

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.errors import ConfigError, UsageError
from seedance_tasks.training import envvars
from seedance_tasks.training.plan import apply_rank_binding, load_profiles, make_plan
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


def test_nic_headers_without_a_legend_leave_nccl_ib_hca_unset_with_a_warning():
    della = TOPO / "h100_8gpu_nv18_6nic_niclegend_empty_affinity_della.txt"
    topo = parse_topologies("".join(della.read_text().splitlines(keepends=True)[:16]), "della_nolegend.txt")[0]
    plan = make_plan(topo, nodes=2, rdzv_endpoint="n0:29500")
    assert plan["profile"]["name"] == "ib-multi-node"
    assert "NCCL_IB_HCA" not in plan["env"]
    assert all("NCCL_IB_HCA" not in rank["env"] for rank in plan["ranks"])
    assert any(warning.startswith("NIC0..NIC5 have no NIC Legend; pass the whole `nvidia-smi topo -m` output")
               for warning in plan["warnings"])


def test_cli_plan_on_a_malformed_affinity_cell_is_an_error_line_not_an_internal_error(tmp_path):
    source = (TOPO / "a100_8gpu_nv12_2numa_spaces_nonic.txt").read_text()
    bad = tmp_path / "a100.txt"
    bad.write_text(source.replace("0-23 ", "0-2x3 ", 1))
    result = CliRunner().invoke(app, ["train", "plan", "--topology", str(bad)])
    assert result.exit_code == 1, result.output
    assert f"error: {bad}:4: CPU Affinity '0-2x3' of GPU0 is not a CPU list" in result.output
    assert "hint:" in result.output and "unexpected" not in result.output
