"""Log parsing on every log sample: timeouts, desync, channels, transports, nccl-tests bandwidth, verdicts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.training import health, launch
from tests.conftest import DATA

LOGS = DATA / "training" / "logs"


def report(name: str, **kwargs):
    return health.report((LOGS / name).read_text(), **kwargs)


def test_every_log_sample_is_covered_here():
    covered = {
        "nccl_info_2gpu_single_node_rings_trees_nccl1358.log", "nccl_info_2node_ib_gdrdma_init_complete_nccl429.log",
        "nccl_info_8gpu_pcie_p2p_and_shm_nccl1027.log", "nccl_tests_all_reduce_perf_header_8x4090_tree_nccl1530.txt",
        "nccl_tests_all_reduce_perf_rows_mooncake3484.txt", "torch_watchdog_desync_report_stas00.log",
        "torch_watchdog_timeout_default_10min_basicsr737.log",
    }
    assert {path.name for path in LOGS.iterdir()} == covered


def test_watchdog_timeout_default_ten_minutes():
    r = report("torch_watchdog_timeout_default_10min_basicsr737.log")
    assert r["timeouts"] == [
        {"rank": 1, "op": "ALLREDUCE", "seq": 808, "timeout_ms": 600000, "ran_ms": 600020, "numel": 9801523},
        {"rank": 0, "op": "ALLREDUCE", "seq": 808, "timeout_ms": 600000, "ran_ms": 600030, "numel": 9801523},
        {"rank": 2, "op": "ALLREDUCE", "seq": 808, "timeout_ms": 600000, "ran_ms": 600061, "numel": 9801523},
    ]
    assert {item["last_completed"] for item in r["watchdog_work"]} == {807}
    verdict = r["verdict"]
    assert verdict["status"] == "failed"
    assert "same collective" in verdict["cause"] and "seq 808" in verdict["cause"]
    assert "collective_timeout" in verdict["fix"]  # the 10-minute default is called out


def test_desync_report_names_the_lagging_rank():
    r = report("torch_watchdog_desync_report_stas00.log")
    assert r["timeouts"] == [{"rank": 0, "op": "ALLREDUCE", "seq": 2, "timeout_ms": 8000, "ran_ms": 8097, "numel": 4}]
    assert r["desync"]["ranks"] == [{"rank": 1, "finished": 2, "missing": 3}]
    assert r["verdict"]["status"] == "failed"
    assert "rank 1" in r["verdict"]["cause"] and "desync" in r["verdict"]["cause"]


def test_single_node_rings_and_trees():
    r = report("nccl_info_2gpu_single_node_rings_trees_nccl1358.log")
    assert r["channels"] == {"coll": 2}
    assert r["algorithms"] == ["ring", "tree"]
    assert r["transports"] == {"P2P/direct pointer": 1}
    assert r["comms"] == {"0": {"nranks": 2, "nnodes": 1}, "1": {"nranks": 2, "nnodes": 1}}
    assert r["timeouts"] == [] and r["verdict"]["status"] == "ok"


def test_multi_node_ib_gdrdma_channel_summary():
    r = report("nccl_info_2node_ib_gdrdma_init_complete_nccl429.log")
    assert r["channels"] == {"coll": 6, "p2p": 8, "p2p_per_peer": 1}
    assert r["transports"] == {"NET/IB/GDRDMA": 3, "P2P/direct pointer": 3}
    assert r["init_complete"] == 2
    assert r["verdict"]["status"] == "ok"


def test_pcie_shm_between_sockets():
    r = report("nccl_info_8gpu_pcie_p2p_and_shm_nccl1027.log")
    assert r["transports"] == {"P2P/direct pointer": 3, "P2P/direct pointer/read": 3, "SHM/direct/direct": 1}
    assert r["channels"] == {"coll": 2}
    shm = [item for item in r["verdict"]["findings"] if "SHM" in item["cause"]]
    assert shm and "3->4" in shm[0]["cause"]


def test_nccl_tests_rows_and_bandwidth_comparison():
    r = report("nccl_tests_all_reduce_perf_rows_mooncake3484.txt", expected_busbw=360)
    bw = r["bandwidth"]
    assert len(bw["rows"]) == 11
    assert bw["rows"][0] == {"size": 32768, "algbw": 1.76, "busbw": 3.07, "busbw_in_place": 3.2}
    assert bw["peak_busbw"] == 300.52
    assert bw["ranks"] == 8  # inferred from busbw/algbw = 2(n-1)/n = 1.75
    assert "not saturated" in r["verdict"]["cause"]  # the sweep stops at 32 MiB


def test_nccl_tests_full_sweep_compared_with_expected():
    rows = (LOGS / "nccl_tests_all_reduce_perf_rows_mooncake3484.txt").read_text().splitlines()[1:]
    big = "  1073741824     268435456     float     sum      -1   4500.0  238.61  417.57       0   4490.0  239.14  418.50       0"
    text = "\n".join([*rows, big])
    good = health.report(text, expected_busbw=450)
    assert good["verdict"]["status"] == "ok" and "93%" in good["verdict"]["cause"]
    slow = health.report(text, expected_busbw=600)
    assert slow["verdict"]["status"] == "warning" and "70%" in slow["verdict"]["cause"]


def test_nccl_tests_header_with_forced_algorithm():
    r = report("nccl_tests_all_reduce_perf_header_8x4090_tree_nccl1530.txt")
    assert r["bandwidth"]["rows"] == [{"size": 8, "algbw": 0.0, "busbw": 0.0}]
    assert r["bandwidth"]["ranks"] == 8
    assert r["forced"] == {"NCCL_ALGO": "TREE"}
    assert r["verdict"]["status"] == "warning" and "NCCL_ALGO=TREE" in r["verdict"]["cause"]


@pytest.mark.parametrize("name", ["torch_watchdog_desync_report_stas00.log", "nccl_info_2gpu_single_node_rings_trees_nccl1358.log"])
def test_cli_health_json(name):
    result = CliRunner().invoke(app, ["train", "health", str(LOGS / name), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("timeouts", "channels", "transports", "verdict"):
        assert key in data


@pytest.mark.parametrize("given, problem", [("folder", "is a directory, not a log file"), ("absent.log", "not found")])
def test_cli_health_on_a_folder_or_a_missing_log_says_which_with_a_hint(tmp_path, given, problem):
    (tmp_path / "folder").mkdir()
    result = CliRunner().invoke(app, ["train", "health", str(tmp_path / given)])
    assert result.exit_code == 2
    assert f"error: log {tmp_path / given}: {problem}" in result.output and "hint: pass one job's log" in result.output


def test_cli_health_refuses_a_non_positive_expected_bandwidth():
    result = CliRunner().invoke(app, ["train", "health", str(LOGS / "nccl_info_2gpu_single_node_rings_trees_nccl1358.log"),
                                      "--expected-busbw", "-5"])
    assert result.exit_code == 2 and "--expected-busbw" in result.output


def test_quiet_log_is_unknown():
    assert health.report("[rank0] step 1/4 loss 4.1\n")["verdict"]["status"] == "unknown"


FAILURE = """$ /venv/bin/python -m torch.distributed.run --nproc-per-node=2 -m seedance_tasks.training.trainer
[rank0] step 1/4 loss 4.1
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_09:16:27
  host      : node7
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 14226)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 14226
============================================================
"""


def test_torchrun_failure_summary_and_the_last_launch_of_a_log():
    failed = health.report(FAILURE)
    assert failed["failures"][0] | {"error": None} == {
        "rank": 1, "local_rank": 1, "host": "node7", "exitcode": -9, "signal": "SIGKILL", "error": None,
        "root_cause": True, "secondary": False,
    }
    assert failed["verdict"]["status"] == "failed"
    assert failed["verdict"]["cause"].startswith("rank 1 (local rank 1 on node7) failed: SIGKILL")
    relaunched = health.report(FAILURE + FAILURE.splitlines()[0] + "\n[rank0] resumed from checkpoint step 2\n")
    assert relaunched["launches"] == 2 and relaunched["failures"] == []  # judged on the last launch
    assert relaunched["verdict"]["status"] == "unknown"


WARN_LOGS = DATA / "training" / "nccl_warn"
# one log per class of NCCL WARN line / NCCL error code: (file, class, words the verdict's cause must hold)
WARN_CASES = [
    ("ib_completion_error.log", "ib_completion", "status 12"),
    ("ib_setup_failure.log", "ib_setup", "InfiniBand setup failed"),
    ("no_socket_interface.log", "interface", "no usable network interface"),
    ("socket_connection_closed.log", "socket", "TCP connection between ranks failed"),
    ("shm_segment_failure.log", "shm", "/dev/shm"),
    ("cuda_failure_oom.log", "cuda", "out of memory"),
    ("timeout_warning.log", "timeout", "timed out"),
    ("other_warning.log", "other", "Unexpected topology attribute 'foo' ignored"),
    ("torch_nccl_system_error.log", "nccl_system_error", "ncclSystemError"),
    ("torch_nccl_remote_error.log", "nccl_remote_error", "ncclRemoteError"),
    ("torch_nccl_cuda_error.log", "nccl_cuda_error", "ncclUnhandledCudaError"),
    ("torch_nccl_invalid_usage.log", "nccl_invalid_usage", "ncclInvalidUsage"),
    ("torch_nccl_internal_error.log", "nccl_internal_error", "ncclInternalError"),
    ("torch_nccl_invalid_argument.log", "nccl_invalid_argument", "ncclInvalidArgument"),
]


def test_every_warn_class_has_a_log_and_a_case():
    assert {path.name for path in WARN_LOGS.iterdir()} == {name for name, _, _ in WARN_CASES}
    classes = {name for name, *_ in health._WARN_CLASSES} | {"other"}
    classes |= {name for name, _, _ in health._NCCL_ERROR_CLASSES.values()}
    assert classes == {kind for _, kind, _ in WARN_CASES}


@pytest.mark.parametrize(("name", "kind", "words"), WARN_CASES, ids=[case[1] for case in WARN_CASES])
def test_every_warn_and_error_class_reaches_the_verdict(name, kind, words):
    r = health.report((WARN_LOGS / name).read_text())
    verdict = r["verdict"]
    assert verdict["status"] == ("warning" if kind == "other" else "failed")
    mine = [item for item in verdict["findings"] if item.get("class") == kind]
    assert mine, verdict["findings"]
    assert words in mine[0]["cause"] and mine[0]["fix"]
    assert verdict["cause"] == mine[0]["cause"]  # it is what the verdict leads with


def test_ib_completion_warn_is_not_ok_on_an_otherwise_healthy_log():
    r = report("nccl_info_2node_ib_gdrdma_init_complete_nccl429.log")
    assert r["verdict"]["status"] == "ok"
    warn = (WARN_LOGS / "ib_completion_error.log").read_text().splitlines()[4]
    worse = health.report((LOGS / "nccl_info_2node_ib_gdrdma_init_complete_nccl429.log").read_text() + "\n" + warn)
    assert worse["verdict"]["status"] == "failed"
    assert "InfiniBand/RoCE work completion error" in worse["verdict"]["cause"]
    assert not any("without timeouts or warnings" in item["cause"] for item in worse["verdict"]["findings"])


def test_warn_lines_of_one_class_are_one_finding_with_a_count():
    r = health.report((WARN_LOGS / "ib_completion_error.log").read_text())
    assert len(r["nccl_warnings"]) == 2
    ib = [item for item in r["verdict"]["findings"] if item.get("class") == "ib_completion"]
    assert len(ib) == 1 and "2 NCCL WARN lines" in ib[0]["cause"]


def test_cli_health_exits_with_the_failed_verdict_text():
    result = CliRunner().invoke(app, ["train", "health", str(WARN_LOGS / "socket_connection_closed.log")])
    assert "TCP connection between ranks failed" in result.output
    assert "ok: NCCL initialised" not in result.output


@pytest.mark.parametrize("args, option", [
    (["train", "schedule", "--world-size", "0"], "--world-size"),
    (["train", "schedule", "--steps", "0"], "--steps"),
    (["train", "plan", "--nodes", "0"], "--nodes"),
    (["train", "plan", "--nproc-per-node", "-1"], "--nproc-per-node"),
    (["train", "launch", "--nnodes", "0"], "--nnodes"),
])
def test_counts_that_cannot_be_are_refused_as_usage_errors(args, option):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and option in result.output and "Traceback" not in result.output


def _full_sweep(prefix: str = "") -> str:
    """The nccl-tests header, the sample's rows and a 1 GiB row, no NCCL_DEBUG lines."""
    header = (LOGS / "nccl_tests_all_reduce_perf_header_8x4090_tree_nccl1530.txt").read_text().splitlines()
    head = [line for line in header if line.startswith("#") and ("size" in line or "(B)" in line)]
    rows = (LOGS / "nccl_tests_all_reduce_perf_rows_mooncake3484.txt").read_text().splitlines()[1:]
    big = "  1073741824     268435456     float     sum      -1   4500.0  238.61  417.57       0   4490.0  239.14  418.50       0"
    return "\n".join(prefix + line for line in [*head, *rows, big]) + "\n"


def test_a_full_sweep_without_an_expectation_reports_its_peak():
    verdict = health.report(_full_sweep())["verdict"]
    assert verdict["status"] == "ok", verdict
    assert verdict["cause"].startswith("peak bus bandwidth 418.5 GB/s up to 1024 MiB messages, not compared")
    assert "--expected-busbw" in verdict["fix"]


@pytest.mark.parametrize("prefix", ["[1,0]<stdout>:", "[default0]:", "[rank0]:"])
def test_nccl_tests_rows_behind_a_launcher_prefix_are_read(prefix):
    plain, tagged = health.report(_full_sweep()), health.report(_full_sweep(prefix), expected_busbw=450)
    assert tagged["bandwidth"]["rows"] == plain["bandwidth"]["rows"] and len(plain["bandwidth"]["rows"]) == 12
    assert tagged["verdict"]["status"] == "ok" and "93%" in tagged["verdict"]["cause"]


def test_ranks_are_inferred_from_all_reduce_rows_only():
    reduce_row = "    33554432       8388608     float     sum       0   195.40  171.72  171.72       0   195.40  171.73  171.73       0"
    assert health.parse_nccl_tests(reduce_row)["ranks_inferred"] is None  # reduce: busbw = algbw for any n
    all_reduce = (LOGS / "nccl_tests_all_reduce_perf_rows_mooncake3484.txt").read_text()
    assert health.parse_nccl_tests(all_reduce)["ranks_inferred"] == 8


def _health_cli(tmp_path, *args):
    log = tmp_path / "sweep.txt"
    log.write_text(_full_sweep())
    return CliRunner().invoke(app, ["train", "health", str(log), *args])


def test_cli_health_link_must_be_one_the_profile_knows(tmp_path):
    unknown = _health_cli(tmp_path, "--profile", "nvlink-single-node", "--link", "NV99")
    assert unknown.exit_code == 2, unknown.output
    assert "no expected bus bandwidth for --link NV99" in unknown.output
    assert "known links for it: NV18, NV12, NV8, NV4, NV2" in unknown.output
    known = _health_cli(tmp_path, "--profile", "nvlink-single-node", "--link", "NV18", "--json")
    assert json.loads(known.stdout)["bandwidth"]["expected_busbw"] == 360


def test_cli_health_link_without_a_profile_is_a_usage_error(tmp_path):
    result = _health_cli(tmp_path, "--link", "NV18")
    assert result.exit_code == 2 and "--link" in result.output and "needs --profile" in result.output
    assert "hint:" in result.output


def test_cli_health_profile_without_figures_says_so(tmp_path):
    result = _health_cli(tmp_path, "--profile", "cpu-gloo", "--json")
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)["verdict"]
    assert "profile 'cpu-gloo' has no expected bus bandwidth figures" in verdict["cause"]
    with_link = _health_cli(tmp_path, "--profile", "cpu-gloo", "--link", "NV18")
    assert with_link.exit_code == 2 and "no expected_busbw_gbps figures" in with_link.output


def _srun_labelled(text: str, tasks: tuple[int, ...] = (3, 12, 0, 15, 7, 10)) -> str:
    """`text` as `srun --label` prints it for a 16-task job: each output line behind the id of the
    task that wrote it, right-aligned to the widest id (` 3: `, `12: `); the sample's own
    `# source:` note is left as it is."""
    width, out, labelled = len(str(max(tasks))), [], 0
    for line in text.splitlines(keepends=True):
        if not line.startswith("# source:"):
            line, labelled = f"{tasks[labelled % len(tasks)]:>{width}}: {line}", labelled + 1
        out.append(line)
    return "".join(out)


@pytest.mark.parametrize("name", sorted(path.name for path in LOGS.iterdir()))
def test_srun_label_prefixes_parse_as_the_unlabelled_log(name):
    plain = (LOGS / name).read_text()
    labelled = _srun_labelled(plain)
    assert " 3: " in labelled and "\n12: " in labelled
    assert health.parse_nccl_log(labelled) == health.parse_nccl_log(plain)
    assert health.parse_nccl_tests(labelled) == health.parse_nccl_tests(plain)
    assert health.report(labelled) == health.report(plain)


def test_srun_labels_in_front_of_other_launcher_prefixes_and_a_failure_summary():
    sweep = _full_sweep("[1,0]<stdout>:")
    assert health.report(_srun_labelled(sweep), expected_busbw=450) == health.report(sweep, expected_busbw=450)
    assert len(health.report(_srun_labelled(sweep))["bandwidth"]["rows"]) == 12
    labelled = health.report(_srun_labelled(FAILURE, tasks=(0, 1)))
    assert labelled == health.report(FAILURE) and labelled["failures"][0]["rank"] == 1


def test_only_the_exact_srun_label_is_taken_off_a_line():
    lines = ["0: 12: kept", "  7: x", "12:34:56 NCCL INFO a", "node1: NCCL INFO b", "0:node1:1:1 [0] NCCL INFO c",
             "\t0: tab", "x0: y", "0:  two spaces"]
    assert health._lines("\n".join(lines)) == ["12: kept", "x", *lines[2:7], " two spaces"]


@pytest.mark.parametrize("line, rank, seq", [
    # PyTorch 1.8-1.10: no SeqNum
    ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=1800000) "
     "ran for 1800493 milliseconds before timing out.", 0, None),
    # the process group's prefix in front of the rank
    ("[rank1]:[E626 06:24:44.903 ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=98, NumelOut=98, "
     "Timeout(ms)=600000) ran for 600020 milliseconds before timing out.", 1, 808),
    # no rank in the message at all
    ("[E202 12:25:57.436 ProcessGroupNCCL.cpp:697] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=12, OpType=COALESCED, NumelIn=10, NumelOut=20, Timeout(ms)=600000) ran for 600000 "
     "milliseconds before timing out.", None, 12),
])
def test_watchdog_timeouts_in_other_pytorch_wordings_fail_the_verdict(tmp_path, line, rank, seq):
    r = health.report(line + "\n")
    budget = 600000 if seq else 1800000
    assert [(item["rank"], item["seq"], item["timeout_ms"]) for item in r["timeouts"]] == [(rank, seq, budget)]
    assert r["verdict"]["status"] == "failed" and "watchdog timeout" in r["verdict"]["cause"]
    (tmp_path / "job.log").write_text(line + "\n")
    shown = CliRunner().invoke(app, ["train", "health", str(tmp_path / "job.log")])
    assert shown.exit_code == 0 and "watchdog timeouts" in shown.output and "None" not in shown.output


OLD_NCCL_TESTS = """\
# nThread 1 nGpus 8 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float     sum    37.35    0.00    0.00  0e+00    36.51    0.00    0.00  0e+00
  1073741824     268435456   float     sum    12345   86.97  152.20  5e-07    12340   87.01  152.27  5e-07
# Out of bounds values : {oob}
# Avg bus bandwidth    : 76.1
"""


def test_an_older_nccl_tests_table_without_root_and_with_an_error_column_is_read_by_its_header():
    r = health.report(OLD_NCCL_TESTS.format(oob="0 OK"), expected_busbw=160)
    assert [row["busbw"] for row in r["bandwidth"]["rows"]] == [0.0, 152.2]
    assert r["bandwidth"]["peak_busbw"] == 152.27 and r["bandwidth"]["ranks"] == 8
    assert r["verdict"]["status"] == "ok"  # a max error of 5e-07 in float sums is rounding, not a wrong result
    bad = health.report(OLD_NCCL_TESTS.format(oob="3 FAILED"), expected_busbw=160)
    assert bad["verdict"]["status"] == "failed" and "3 out-of-bounds" in bad["verdict"]["cause"]


def test_a_table_header_names_a_broadcast_root_and_in_place_columns_are_not_mixed_up():
    table = ("#  size  count  type  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong\n"
             "  1073741824  268435456  float  0  5000.0  214.7  214.7  0  4000.0  268.4  268.4  1\n"
             "  2147483648  536870912  float  0  9000.0  238.6  238.6  0\n")
    rows = health.parse_nccl_tests(table)["rows"]
    assert rows[0]["root"] == 0 and rows[0]["redop"] == "none"
    assert rows[0]["out_of_place"]["busbw"] == 214.7 and rows[0]["in_place"]["busbw"] == 268.4
    assert "in_place" not in rows[1] and health.parse_nccl_tests(table)["wrong"] == 1


def test_init_complete_lines_that_name_the_init_call_are_counted():
    text = ("h:1:2 [3] NCCL INFO ncclCommInitRankConfig comm 0x55d5a0 rank 3 nranks 8 cudaDev 3 nvmlDev 3 "
            "busId 5a000 commId 0x1234 - Init COMPLETE\n")
    r = health.report(text)
    assert r["init_complete"] == 1 and r["comms"] == {"3": {"nranks": 8}}


def test_two_ranks_timeouts_written_into_one_line_are_both_read_and_a_cut_one_is_not_misread():
    one = ("[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, "
           "NumelIn=9, NumelOut=9, Timeout(ms)=600000) ran for 60002{rank} milliseconds before timing out.")
    glued = one.format(rank=1) + "[rank0]:" + one.format(rank=0)
    assert [(t["rank"], t["ran_ms"]) for t in health.report(glued + "\n")["timeouts"]] == [(1, 600021), (0, 600020)]
    cut = one.format(rank=1)[:110] + one.format(rank=0)  # rank 1's message cut short by rank 0's
    assert [(t["rank"], t["ran_ms"]) for t in health.report(cut + "\n")["timeouts"]] == [(0, 600020)]


def test_a_nan_row_of_nccl_tests_is_reported_naming_its_size():
    header = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
              "busbw #wrong\n")
    good = "  1073741824     268435456     float     sum      -1   5000.0  214.75  375.81      0   5000.0  214.75  375.81      0\n"
    bad = "  2147483648     536870912     float     sum      -1      nan     nan    -nan      0   9000.0  238.60  417.56      0\n"
    for text in (header + good + bad, good + bad):  # read by the header, and without one
        r = health.report(text)
        assert [row["size"] for row in r["bandwidth"]["rows"]] == [1073741824]
        assert r["bandwidth"]["unreadable_rows"][0]["size"] == 2147483648
        assert r["verdict"]["status"] == "warning"
        assert "2147483648" in r["verdict"]["cause"] and "nan" in r["verdict"]["cause"]
    alone = health.report(header + bad)
    assert alone["verdict"]["status"] == "warning" and "2147483648" in alone["verdict"]["cause"]


def test_a_watchdog_message_without_a_rank_takes_the_rank_of_its_line_prefix():
    message = ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn=1024, "
               "NumelOut=1024, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.")
    text = (f"[rank3]:[E1202 10:00:00.000 ProcessGroupNCCL.cpp:616] {message}\n"
            f"0: [rank5]:[E1202 ProcessGroupNCCL.cpp:616] [Rank 7] {message}\n"
            f"[E1202 ProcessGroupNCCL.cpp:616] {message}\n")
    r = health.report(text)
    assert [item["rank"] for item in r["timeouts"]] == [3, 7, None]  # the message's own rank wins
    assert "rank(s) 3, 7" in r["verdict"]["cause"]


NCCL_TESTS_HEAD = (LOGS / "nccl_tests_all_reduce_perf_rows_mooncake3484.txt").read_text().splitlines()[1:4]


@pytest.mark.parametrize(("failure", "said", "code"), [
    ("node1: Test NCCL failure common.cu:1005 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '",
     "a NCCL call at common.cu:1005 returned an error: 'unhandled cuda error", "ncclUnhandledCudaError"),
    ("node1: Test NCCL failure common.cu:1122 'remote process exited or there was a network error / "
     "NET/IB : Got completion from peer 10.0.0.2<42> with status=12'",
     "a NCCL call at common.cu:1122 returned an error: 'remote process exited", "ncclRemoteError"),
    ("node2: Test CUDA failure common.cu:733 'out of memory'", "a CUDA call at common.cu:733 returned an error: "
     "'out of memory'", None),
])
def test_an_nccl_tests_run_that_stopped_on_an_error_is_a_failed_verdict(tmp_path, failure, said, code):
    # a healthy start (NCCL INFO, the first rows of the sweep), then nccl-tests' own error check
    text = "\n".join([
        "#  Rank  0 Group  0 Pid  41230 on    node1 device  0 [0x18] NVIDIA H100 80GB HBM3",
        "node1:41230:41251 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        *NCCL_TESTS_HEAD, failure, " .. node1 pid 41230: Test failure common.cu:891", ""])
    r = health.report(text)
    assert r["verdict"]["status"] == "failed" and said in r["verdict"]["cause"], r["verdict"]
    assert r["test_failures"][0]["at"] == failure.split()[4] and r["test_failures"][-1]["at"] == "common.cu:891"
    assert r["nccl_errors"] == ([code] if code else [])
    log = tmp_path / "nccl_tests.log"
    log.write_text(text)
    result = CliRunner().invoke(app, ["train", "health", str(log), "--json"])
    assert json.loads(result.stdout)["verdict"]["status"] == "failed"


@pytest.mark.parametrize(("code", "said", "fix"), [
    ("-9", "failed: SIGKILL", "OOM killer"),
    ("137", "failed: exit code 137 (SIGKILL)", "OOM killer"),  # as a shell or a container reports it
    ("-11", "failed: SIGSEGV", "no Python traceback"),
    ("139", "failed: exit code 139 (SIGSEGV)", "PYTHONFAULTHANDLER=1"),
    ("143", "failed: exit code 143 (SIGTERM)", "from outside"),
    ("1", "failed: exit code 1", "read rank 1's traceback"),
    ("255", "failed: exit code 255", "read rank 1's traceback"),  # 255 - 128 is no signal
])
def test_a_rank_killed_by_a_signal_is_named_so_and_not_sent_looking_for_a_traceback(code, said, fix):
    summary = FAILURE.replace("exitcode  : -9 (pid: 14226)", f"exitcode  : {code} (pid: 14226)").replace(
        "traceback : Signal 9 (SIGKILL) received by PID 14226",
        "traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    verdict = health.report(summary)["verdict"]
    assert verdict["status"] == "failed" and f"rank 1 (local rank 1 on node7) {said}:" in verdict["cause"], verdict
    assert fix in verdict["fix"], verdict


@pytest.mark.timeout(60)  # was exponential in the items: 20 took a second, these 40 would take days
def test_a_long_line_that_almost_is_a_channel_summary_is_read_at_once():
    almost = "node1:1:2 [0] NCCL INFO " + "1 coll channels " * 40 + "and then something else"
    assert health.report(almost)["channels"] == {}
    real = "node1:1:2 [0] NCCL INFO 24 coll channels, 24 collnet channels, 16 nvls channels, 32 p2p channels, " \
           "32 p2p channels per peer"
    assert health.report(real)["channels"] == {"coll": 24, "collnet": 24, "nvls": 16, "p2p": 32, "p2p_per_peer": 32}


@pytest.mark.parametrize("value", ["inf", "Infinity", "1e309"])
def test_cli_health_refuses_an_infinite_expected_bandwidth(value):
    # was taken: every peak was then "0% of the inf GB/s this profile expects"
    result = CliRunner().invoke(app, ["train", "health", str(LOGS / "nccl_tests_all_reduce_perf_rows_mooncake3484.txt"),
                                      "--expected-busbw", value])
    assert result.exit_code == 2 and "--expected-busbw inf: not a bandwidth" in result.output, result.output
    assert "hint:" in result.output and "Traceback" not in result.output


HUNG_START = """$ /venv/bin/python -m torch.distributed.run --nproc-per-node=2 -m seedance_tasks.training.trainer
[default0]:node1:100:120 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
[default0]:node1:100:120 [0] NCCL INFO comm 0x55d5 rank 0 nranks 2 cudaDev 0 busId 18000 - Init COMPLETE
[default0]:[rank0] step 1/100 loss 4.1
"""
STUCK = ("[default1]:[rank1]:[E1206 03:10:00.000000 100 ProcessGroupNCCL.cpp:1484] [PG ID 0 PG GUID 0(default_pg) "
         "Rank 1] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring "
         "enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang\n"
         "[default1]:[rank1]:[F1206 03:10:00.000000 100 ProcessGroupNCCL.cpp:1306] [PG ID 0 PG GUID 0(default_pg) "
         "Rank 1] Heartbeat monitor timed out! Process will be terminated after dumping debug info.\n")


@pytest.mark.parametrize(("tail", "said"), [
    (launch.HUNG_MESSAGE.format(seconds=900) + "\n", "the job printed nothing for 900 s and was killed as hung"),
    (STUCK, "PyTorch's NCCL watchdog got stuck (heartbeat monitor timed out) on rank(s) 1"),
    (STUCK + launch.HUNG_MESSAGE.format(seconds=1.5) + "\n", "printed nothing for 1.5 s"),
])
def test_a_hung_job_is_a_failed_verdict_not_a_healthy_nccl_init(tail, said):
    verdict = health.report(HUNG_START + tail)["verdict"]
    assert verdict["status"] == "failed" and said in verdict["cause"], verdict
    assert "py-spy dump" in verdict["fix"]
    assert health.report(HUNG_START)["verdict"]["status"] == "ok"  # the same start without the hang


def test_pxn_connections_count_as_their_transport_whatever_the_proxy_rank():
    log = "\n".join([
        "node8:181412:181412 [1] NCCL INFO Channel 00/0 : 9[1] -> 0[0] [send] via NET/IB/0(8)/GDRDMA",
        "node8:181412:181412 [1] NCCL INFO Channel 01/0 : 9[1] -> 0[0] [send] via NET/IB/1(1)/GDRDMA",
        "node8:181411:181411 [0] NCCL INFO Channel 00/0 : 1[1] -> 8[0] [receive] via NET/IB/0/GDRDMA",
    ])
    assert health.report(log)["transports"] == {"NET/IB/GDRDMA": 3}
