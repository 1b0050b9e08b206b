"""The CLI's one error boundary: any exception is one `error:` line with a `hint:` and a meaningful
exit code, never a traceback unless `--debug`; S3 endpoints that are down or frozen end in bounded time."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import typer
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.cli_support import handle_errors

LONG = "/tmp/" + "n" * 300  # ENAMETOOLONG on Linux (NAME_MAX 255)
TOPOLOGY = "topo/a100_8gpu_nv12_2numa_spaces_nonic.txt"  # a real `nvidia-smi topo -m` output (tests/data/training/SOURCE.md)


def seedance(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`seedance ARGS` in a fresh process (the console script's entry point), its own environment."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("SEEDANCE__", "SEEDANCE_DEBUG"))}
    return subprocess.run(
        [sys.executable, "-c", "from seedance_tasks.cli import main; main()", *args],
        env={**clean, **(env or {})}, capture_output=True, text=True, timeout=timeout,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_every_command_is_behind_the_boundary():
    import typer.main

    def walk(command, path=()):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, (*path, name))
        else:
            yield " ".join(path), command.callback

    commands = list(walk(typer.main.get_command(app)))
    assert len(commands) > 15
    assert [name for name, callback in commands if not getattr(callback, "__seedance_handled__", False)] == []


def test_an_os_error_is_one_error_line_naming_the_path_and_no_traceback():
    result = seedance("compact", LONG)
    assert result.returncode == 6, result.stderr
    assert "Traceback" not in result.stderr
    [line] = error_lines(result.stderr)
    assert "file name too long" in line and "nnnnnnnn" in line
    assert "hint:" in result.stderr


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_prints_the_traceback_too(how):
    if how == "flag":
        result = seedance("--debug", "compact", LONG)
    else:
        result = seedance("compact", LONG, env={"SEEDANCE_DEBUG": "1"})
    assert result.returncode == 6
    assert "Traceback (most recent call last)" in result.stderr
    assert len(error_lines(result.stderr)) == 1


def test_malformed_yaml_override_names_the_variable():
    result = seedance("compact", "/tmp/nowhere", env={"SEEDANCE__COMPACTION__TARGET_FILE_SIZE": "[1,"})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    [line] = error_lines(result.stderr)
    assert "SEEDANCE__COMPACTION__TARGET_FILE_SIZE" in line and "YAML" in line


def _demo_app(exc: BaseException) -> typer.Typer:
    demo = typer.Typer()

    @demo.command()
    @handle_errors
    def boom() -> None:
        raise exc

    @demo.command()
    def other() -> None:  # a second command, so `boom` is a subcommand
        pass

    return demo


def test_an_unexpected_bug_exits_70_and_asks_for_a_report():
    result = CliRunner().invoke(_demo_app(ZeroDivisionError("division by zero")), ["boom"])
    assert result.exit_code == 70
    assert "error: unexpected ZeroDivisionError: division by zero" in result.output
    assert "hint: rerun with --debug and report it" in result.output
    assert "Traceback" not in result.output


def test_ctrl_c_exits_130_with_a_short_line():
    result = CliRunner().invoke(_demo_app(KeyboardInterrupt()), ["boom"])
    assert result.exit_code == 130
    assert "interrupted" in result.output and "Traceback" not in result.output


def test_a_seedance_error_keeps_its_message_hint_and_code():
    from seedance_tasks.errors import RefusedError

    result = CliRunner().invoke(_demo_app(RefusedError("a Delta table at s3://x", hint="use OPTIMIZE")), ["boom"])
    assert result.exit_code == 3
    assert "error: a Delta table at s3://x" in result.output and "hint: use OPTIMIZE" in result.output


# ------------------------------------------------------------------------- S3 endpoint down or frozen

S3_BOUNDS = {"SEEDANCE__STORAGE__S3__CONNECT_TIMEOUT": "1s", "SEEDANCE__STORAGE__S3__REQUEST_TIMEOUT": "1s",
             "SEEDANCE__STORAGE__S3__MAX_ATTEMPTS": "2", "AWS_ACCESS_KEY_ID": "testing",
             "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_EC2_METADATA_DISABLED": "true"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def frozen_endpoint():
    """A loopback server that accepts connections and never answers; it stops itself after 120 s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()
    deadline = time.monotonic() + 120

    def serve() -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", held
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def _assert_names_endpoint(result: subprocess.CompletedProcess, endpoint: str) -> None:
    assert result.returncode == 7, result.stderr
    assert "Traceback" not in result.stderr
    [line] = error_lines(result.stderr)
    assert f"cannot reach the S3 endpoint {endpoint}" in line
    assert "hint: check that" in result.stderr


def test_s3_endpoint_down_is_one_error_line_naming_it():
    endpoint = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    result = seedance("compact", "s3://bucket/x", env={**S3_BOUNDS, "AWS_ENDPOINT_URL": endpoint})
    _assert_names_endpoint(result, endpoint)


def test_s3_endpoint_frozen_gives_up_after_the_bounded_retries(frozen_endpoint):
    endpoint, held = frozen_endpoint
    result = seedance("compact", "s3://bucket/x", env={**S3_BOUNDS, "AWS_ENDPOINT_URL": endpoint}, timeout=240)
    _assert_names_endpoint(result, endpoint)
    assert held  # it did connect: the request itself timed out


def test_s3_settings_reach_boto3_clients(monkeypatch):
    from seedance_tasks import storage

    monkeypatch.setenv("SEEDANCE__STORAGE__S3__CONNECT_TIMEOUT", "3s")
    monkeypatch.setenv("SEEDANCE__STORAGE__S3__REQUEST_TIMEOUT", "7s")
    monkeypatch.setenv("SEEDANCE__STORAGE__S3__MAX_ATTEMPTS", "5")
    config = storage.boto3_client("s3")._client_config
    assert (config.connect_timeout, config.read_timeout) == (3, 7)
    assert config.retries["mode"] == "standard" and config.retries["total_max_attempts"] == 5


# ------------------------------------------------------------------------- progress bars


def _under_pty(args: list[str], env: dict) -> tuple[int, str]:
    """Run `seedance ARGS` with stdout/stderr on a pseudo-terminal; returns (exit code, all output)."""
    import pty
    import select

    master, slave = pty.openpty()
    clean = {key: value for key, value in os.environ.items() if not key.startswith("SEEDANCE__")}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from seedance_tasks.cli import main; main()", *args],
        stdin=slave, stdout=slave, stderr=slave, close_fds=True,
        env={**clean, "TERM": "xterm-256color", "COLUMNS": "120", **env},
    )
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


@pytest.fixture
def small_lake(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = tmp_path / "lake" / "day=1"
    part.mkdir(parents=True)
    for index in range(3):
        pq.write_table(pa.table({"id": list(range(index * 100, index * 100 + 100))}), part / f"f{index}.parquet")
    return tmp_path / "lake"


def test_long_commands_show_a_bar_with_percentage_on_a_terminal(small_lake):
    import re

    code, output = _under_pty(["compact", str(small_lake)], {"SEEDANCE__COMPACTION__MIN_AGE": "0"})
    assert code == 0, output
    assert "compacting" in output
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output)  # without colours and cursor moves
    assert re.search(r"compacting .*\b100% eta", text), text
    assert "compacted 1 partition(s)" in text


def test_no_bar_with_json_even_on_a_terminal(small_lake):
    code, output = _under_pty(["compact", str(small_lake), "--json"], {"SEEDANCE__COMPACTION__MIN_AGE": "0"})
    assert code == 0, output
    assert "compacting" not in output and '"partitions_compacted": 1' in output


@pytest.mark.parametrize("which", ["config", "owners", "profiles"])
def test_a_malformed_yaml_file_is_one_error_line_with_its_line_and_a_hint(tmp_path, which):
    """The config, owners and NCCL profiles files: the error names the file and the line, on one line."""
    broken = tmp_path / f"{which}.yaml"
    broken.write_text("first: 1\nsecond: [unclosed\n")
    billing = tmp_path / "bill.csv"
    billing.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost\n")
    env = {}
    if which == "config":
        env["SEEDANCE_CONFIG"] = str(broken)
    if which == "profiles":
        env["SEEDANCE__TRAINING__PROFILES_FILE"] = str(broken)
        args = ["train", "plan", "--topology", "tests/data/training/" + TOPOLOGY, "--nodes", "1"]
    else:
        args = ["cost", "recover", "--month", "2024-09", "--billing", str(billing), "--out", str(tmp_path / "out"),
                "--owners", str(broken if which == "owners" else "config/owners.yaml")]
    result = seedance(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = error_lines(result.stderr)
    assert str(broken) in line and "not valid YAML" in line and "line 3, column 1" in line, line
    assert "hint: fix the YAML" in result.stderr


def test_table_cells_are_shown_as_they_are_not_as_console_markup():
    from rich.console import Console

    from seedance_tasks.cli_support import table

    out = Console(record=True, width=200)
    out.print(table("[bold]title[/]", ["name", "rows"], [["p=[red]x[/]", 3], ["[link=http://a]y", 1234]]))
    text = out.export_text()
    assert "p=[red]x[/]" in text and "[link=http://a]y" in text and "1,234" in text
    assert "[bold]" not in text  # the title is the caller's markup


# ------------------------------------------------------------------------- usage errors (click's own)

@pytest.mark.parametrize(("args", "command", "named"), [
    (["compact", "/tmp", "--workers", "-3"], "seedance compact", "--workers"),
    (["compact"], "seedance compact", "'uri'"),
    (["nosuchcommand"], "seedance", "nosuchcommand"),
    (["shards", "build", "/tmp", "--out", "/tmp/x", "--max-samples", "-1"], "seedance shards build", "--max-samples"),
    (["ckpt", "ls", "--stroe", "/tmp"], "seedance ckpt ls", "--stroe"),
    (["train", "health", "/tmp/log", "--expected-busbw", "fast"], "seedance train health", "--expected-busbw"),
])
def test_a_usage_error_is_one_error_line_and_a_hint_not_a_box(args, command, named):
    result = seedance(*args)
    assert result.returncode == 2, result.stderr
    [line] = error_lines(result.stderr)
    assert line.startswith(f"error: {command}: ") and named in line, line
    assert f"hint: see '{command} --help'" in result.stderr
    assert "╭" not in result.stderr and "Traceback" not in result.stderr


def test_a_bad_parameter_raised_inside_a_command_is_a_usage_error_not_a_bug():
    from seedance_tasks.cli_support import SeedanceGroup

    demo = typer.Typer(cls=SeedanceGroup)

    @demo.command()
    @handle_errors
    def boom() -> None:
        raise typer.BadParameter("must be even", param_hint="'--n'")

    @demo.command()
    def other() -> None:
        pass

    result = CliRunner().invoke(demo, ["boom"])
    assert result.exit_code == 2
    assert "error: " in result.output and "must be even" in result.output and "unexpected" not in result.output


def test_a_group_alone_still_prints_its_help():
    result = seedance("shards")
    assert "Usage: seedance shards" in result.stdout + result.stderr and not error_lines(result.stderr)


@pytest.mark.parametrize("args", [["compact", ""], ["trash", "purge", ""], ["ckpt", "ls", "--store", ""]])
def test_an_empty_path_is_refused_not_the_current_directory(args, tmp_path):
    result = subprocess.run([sys.executable, "-c", "from seedance_tasks.cli import main; main()", *args],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = error_lines(result.stderr)
    assert "empty path or URI" in line and "hint:" in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written where it was run


def test_a_command_that_exits_with_a_code_keeps_it():
    result = CliRunner().invoke(_demo_app(typer.Exit(3)), ["boom"])
    assert result.exit_code == 3 and "error:" not in result.output


def test_trash_purge_of_a_mistyped_root_is_an_error_not_zero_purged(tmp_path):
    result = CliRunner().invoke(app, ["trash", "purge", str(tmp_path / "lakee"), "--older-than", "0"])
    assert result.exit_code == 1 and "no such dataset or store" in result.output and "lakee" in result.output
    assert CliRunner().invoke(app, ["trash", "purge", str(tmp_path), "--dry-run"]).exit_code == 0


def test_a_path_that_is_not_utf8_is_an_input_error_not_a_bug(tmp_path):
    from seedance_tasks.boundary import classify

    name = os.fsencode(tmp_path) + b"/caf\xe9"  # Latin-1 bytes: Python holds them as a lone surrogate
    result = subprocess.run([sys.executable.encode(), b"-c", b"from seedance_tasks.cli import main; main()",
                             b"compact", name], capture_output=True, timeout=300)
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    [line] = error_lines(stderr)
    assert "not valid utf-8" in line and "caf\\xe9" in line and "hint:" in stderr
    try:
        "\ud800".encode()
    except UnicodeEncodeError as exc:
        assert classify(exc).exit_code == 1  # a surrogate no byte escapes to: still no crash in the error path


def test_json_output_is_strict_json_even_with_nan_or_infinite_numbers(capsys):
    import json

    from seedance_tasks.cli_support import emit

    emit({"ratio": float("nan"), "rate": [float("inf"), 1.5], "n": 3}, True, print)
    assert json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(name)) == {
        "ratio": None, "rate": [None, 1.5], "n": 3}


@pytest.mark.parametrize(("how", "key"), [
    ("file", "'training.log_dir'"),
    ("env", "'compaction.default_uri' (from SEEDANCE__COMPACTION__DEFAULT_URI)"),
    ("env-key", "'telemetry.pricing.device_hour_prices' (from SEEDANCE__TELEMETRY__PRICING__DEVICE_HOUR_PRICES)"),
])
def test_a_nul_byte_in_a_setting_is_a_config_error_naming_the_key_not_a_bug(tmp_path, how, key):
    # YAML's "\0" / "\u0000" escapes reach the settings as text; every path that carried one failed far
    # from the setting: "error: unexpected ValueError: embedded null byte ... report it" (exit 70)
    env = {}
    if how == "file":
        config = tmp_path / "seedance.yaml"
        config.write_text('training:\n  log_dir: "/tmp/run\\u0000s"\n')
        env["SEEDANCE_CONFIG"] = str(config)
    elif how == "env":
        env["SEEDANCE__COMPACTION__DEFAULT_URI"] = '"/lake\\0"'
    else:
        env["SEEDANCE__TELEMETRY__PRICING__DEVICE_HOUR_PRICES"] = '{"h100\\0": 2}'
    done = seedance("train", "launch", "--steps", "1", env=env)
    assert done.returncode == 2, done.stderr
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and key in lines[0] and "holds a NUL byte" in lines[0], done.stderr
    assert "hint:" in done.stderr and "Traceback" not in done.stderr
