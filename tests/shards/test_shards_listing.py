"""What verify is pointed at: brace patterns (sized before they are expanded), indexes that are not
JSON or hold bad entries, shards missing from a pattern, files that are neither shard nor index,
and member names that verify must name precisely. Each is a listed problem (or a usage error with
a hint) and the other shards are still checked."""

from __future__ import annotations

import json
import os
import random
import resource
from pathlib import Path

import pytest
from braceexpand import braceexpand
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.errors import InputError, RefusedError, UsageError
from seedance_tasks.shards.index import pattern_size, resolve_shards
from seedance_tasks.shards.verify import verify
from tests.shards.test_shards import write_tar


def kinds(report: dict) -> list[tuple[str, str]]:
    return [(Path(item["shard"]).name, item["kind"]) for item in report["problems"]]


def cli_verify(target: Path | str, *extra: str):
    return CliRunner().invoke(app, ["shards", "verify", str(target), "--no-check-decode", *extra])


def test_a_huge_brace_pattern_is_refused_before_it_is_expanded(tmp_path):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = cli_verify(f"{tmp_path}/s-{{0..99999999}}.tar")
    assert result.exit_code == 2 and "100,000,000 shards" in result.output and "hint:" in result.output
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: nothing expanded


@pytest.mark.parametrize("pattern", ["s-{0..999}-{0..999}.tar", "s-{a..z}{a..z}{a..z}{a..z}.tar"])
def test_a_pattern_is_sized_by_all_its_groups(tmp_path, pattern):
    with pytest.raises(UsageError, match="more than 100,000"):
        verify(f"{tmp_path}/{pattern}")


NESTED = ["s-{a,b{00..99}}.tar", "{a{0000..9999},b{0000..9999}}", "{x,y{0..9}}", "python{2.{5..7},3.{2,3}}",
          "{x{0..2}y,z}{1..3}", "{{a,b}}", "{abc}{,}", r"{a\,b,c}", "{1..10..3}{z..A..7}", "}{{a,b}", "{Z..a}"]


def expanded_count(pattern: str) -> int | str:
    try:
        return sum(1 for _ in braceexpand(pattern))
    except ValueError:
        return "ValueError"


def counted(pattern: str) -> int | str:
    try:
        return pattern_size(pattern)
    except ValueError:
        return "ValueError"


@pytest.mark.parametrize("pattern", NESTED)
def test_a_pattern_is_counted_exactly_as_braceexpand_expands_it(pattern):
    assert pattern_size(pattern) == expanded_count(pattern)


def test_any_pattern_is_counted_as_braceexpand_expands_it_or_fails_where_it_fails():
    rng = random.Random(0)
    for _ in range(5000):
        pattern = "".join(rng.choice("{},.\\a0-9zA") for _ in range(rng.randint(0, 14)))
        assert counted(pattern) == expanded_count(pattern), pattern


def test_a_nested_pattern_at_the_cap_is_listed_and_one_more_is_refused(tmp_path):
    write_tar(tmp_path / "s-a00000.tar", [("a.cls", b"1")])
    at_cap = resolve_shards(f"{tmp_path}/s-{{a{{00000..49999}},b{{00000..49999}}}}.tar", strict=False)
    assert [ref.name for ref in at_cap.shards] == ["s-a00000.tar"] and len(at_cap.problems) == 99_999
    for pattern, size in [("s-{a{00000..49999},b{00000..50000}}.tar", "100,001"),
                          ("s-{x,y{00000..99999}}.tar", "100,001")]:
        with pytest.raises(UsageError) as raised:
            resolve_shards(f"{tmp_path}/{pattern}")
        assert f"{tmp_path}/{pattern} names {size} shards, more than 100,000" in str(raised.value)
        assert raised.value.hint


def test_a_pattern_with_unbalanced_braces_is_a_usage_error(tmp_path):
    result = cli_verify(f"{tmp_path}/s-{{0..2.tar")
    assert result.exit_code == 2 and "unbalanced braces" in result.output and "hint:" in result.output


def test_a_shard_missing_from_a_pattern_is_a_problem_and_the_others_are_checked(tmp_path):
    write_tar(tmp_path / "s-0.tar", [("a.cls", b"1")])
    write_tar(tmp_path / "s-2.tar", [("b.cls", b"2")])
    result = cli_verify(f"{tmp_path}/s-{{0..2}}.tar", "--json")
    assert result.exit_code == 4
    report = json.loads(result.stdout)
    assert kinds(report) == [("s-1.tar", "missing")] and report["shards"] == 2 and report["samples"] == 2
    with pytest.raises(InputError) as raised:  # the loaders' strict listing still stops there
        resolve_shards(f"{tmp_path}/s-{{0..2}}.tar")
    assert "s-1.tar" in str(raised.value) and raised.value.hint


def test_an_index_that_is_not_json_is_a_report_with_one_problem(tmp_path):
    (tmp_path / "shardindex.json").write_text("not json")
    result = cli_verify(tmp_path / "shardindex.json", "--json")
    assert result.exit_code == 4
    assert kinds(json.loads(result.stdout)) == [("shardindex.json", "index")]
    plain = cli_verify(tmp_path)
    assert plain.exit_code == 4 and "not valid JSON" in plain.output and "hint:" in plain.output


def test_bad_index_entries_are_problems_and_the_good_entries_are_checked(tmp_path):
    write_tar(tmp_path / "s-0.tar", [("a.cls", b"1")])
    write_tar(tmp_path / "s-1.tar", [("b.cls", b"1")])
    entries = [{"url": "../outside.tar", "nsamples": 1}, 5, {"url": "s-0.tar", "nsamples": 1},
               {"url": "./s-0.tar", "nsamples": 1}, {"url": "s-1.tar", "nsamples": True}]
    (tmp_path / "shardindex.json").write_text(json.dumps({"wids_version": 1, "shardlist": entries}))
    result = cli_verify(tmp_path, "--json")
    assert result.exit_code == 3  # an entry leaving the index's directory is refused
    report = json.loads(result.stdout)
    assert kinds(report) == [("shardindex.json", "refused"), ("shardindex.json", "index"),
                             ("s-0.tar", "duplicate"), ("s-1.tar", "index")]
    messages = [item["problem"] for item in report["problems"]]
    assert "listed twice" in messages[2] and "already seen" not in " ".join(messages)
    assert "nsamples True" in messages[3]
    assert report["shards"] == 2 and report["samples"] == 2
    with pytest.raises(RefusedError) as raised:
        resolve_shards(str(tmp_path))
    assert "leaves the index's directory" in str(raised.value) and raised.value.hint
    (tmp_path / "shardindex.json").write_text(json.dumps({"wids_version": 1, "shardlist": [5]}))
    with pytest.raises(InputError) as raised:
        resolve_shards(str(tmp_path))
    assert "object with a relative `url`" in raised.value.hint


def test_a_file_that_is_neither_tar_nor_index_is_a_usage_error_with_a_hint(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    result = cli_verify(tmp_path / "notes.txt")
    assert result.exit_code == 2 and "neither a .tar shard nor a shard index" in result.output
    assert "hint:" in result.output
    with pytest.raises(UsageError):
        verify(str(tmp_path / "notes.txt"))


def test_member_names_without_a_key_and_keys_spelled_two_ways_are_named(tmp_path):
    write_tar(tmp_path / "d-0.tar", [(".cls", b"1"), ("README", b"2"), ("a/b.cls", b"3"), ("a//b.jpg", b"4")])
    report = verify(str(tmp_path), check_decode=False)
    messages = {item["kind"] + ":" + item["problem"] for item in report["problems"]}
    assert "no-key:member '.cls': its file name starts with a dot, so it has no sample key" in messages
    assert "no-key:member 'README': it has no extension, so no sample key" in messages
    assert "duplicate:key 'a//b' already seen earlier in this shard (as 'a/b')" in messages


def test_a_shard_the_index_lists_but_that_is_not_there_is_missing(tmp_path):
    write_tar(tmp_path / "s-0.tar", [("a.cls", b"1")])
    entries = [{"url": "s-0.tar", "nsamples": 1}, {"url": "s-1.tar", "nsamples": 1}]
    (tmp_path / "shardindex.json").write_text(json.dumps({"wids_version": 1, "shardlist": entries}))
    report = verify(str(tmp_path), check_decode=False)
    assert kinds(report) == [("s-1.tar", "missing")] and report["samples"] == 1


def test_an_index_entry_through_a_symlink_or_naming_a_fifo_is_refused_not_read(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    write_tar(outside / "secret.tar", [("s.cls", b"1")])
    os.mkfifo(outside / "fifo")
    root = tmp_path / "root"
    root.mkdir()
    write_tar(root / "ok.tar", [("a.cls", b"1")])
    (root / "link").symlink_to(outside)
    (root / "direct.tar").symlink_to(outside / "secret.tar")
    (root / "via.tar").symlink_to(outside / "fifo")  # followed, the read would block forever
    os.mkfifo(root / "pipe.tar")
    (root / "dir.tar").mkdir()
    urls = ["link/secret.tar", "direct.tar", "via.tar", "pipe.tar", "dir.tar", "ok.tar"]
    (root / "shardindex.json").write_text(json.dumps({"wids_version": 1, "shardlist": [{"url": u} for u in urls]}))
    report = verify(str(root), check_decode=False)
    assert kinds(report) == [("shardindex.json", "refused")] * 3 + [("pipe.tar", "refused"), ("dir.tar", "unreadable")]
    assert "passes through the symlink 'link'" in report["problems"][0]["problem"]
    assert report["samples"] == 1 and [item["ok"] for item in report["per_shard"]] == [False, False, True]
    with pytest.raises(UsageError, match="not a regular file or a directory"):
        verify(str(root / "pipe.tar"), check_decode=False)
