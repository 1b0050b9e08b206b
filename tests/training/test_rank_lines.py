"""Ranks share torchrun's stdout pipe: each log line must reach it whole, or the launcher's
line parsing (starts, interruptions, restarts) misses lines that another rank's output split."""

import os
import re
import subprocess
import sys

WRITER = """
import sys
from seedance_tasks.training.trainer import _log
rank = int(sys.argv[1])
print("ready", file=sys.stderr, flush=True)
sys.stdin.read(1)  # both start writing together
for number in range(3000):
    _log(rank, f"step {number}/3000 loss=0.{number:06d} " + "x" * 60)
"""


def test_two_ranks_writing_at_once_never_split_a_line():
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # as the launcher runs them
    read, write = os.pipe()
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(rank)], stdout=write, stdin=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env) for rank in (0, 1)]
    os.close(write)
    assert [writer.stderr.readline() for writer in writers] == [b"ready\n"] * 2
    for writer in writers:
        writer.stdin.write(b"g")
        writer.stdin.close()
    with os.fdopen(read) as stream:
        lines = stream.read().splitlines()
    assert [writer.wait(120) for writer in writers] == [0, 0]
    assert len(lines) == 6000
    pattern = re.compile(r"\[rank[01]\] step \d+/3000 loss=0\.\d{6} x{60}")
    assert [line for line in lines if not pattern.fullmatch(line)] == []
