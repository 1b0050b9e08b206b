"""Run one task function in this fresh process: `python -m tests.chaos.runner module:function JSON`.

The JSON object is the function's keyword arguments; its result is printed as JSON on the last
line of stdout. Faults are armed from the environment (`seedance_tasks.faults`), which this
process reads at import time, as a task attempt would.
"""

from __future__ import annotations

import importlib
import json
import sys


def main(argv: list[str]) -> int:
    target, arguments = argv[1], json.loads(argv[2])
    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    result = function(**arguments)
    sys.stdout.write("\n" + json.dumps(result, default=str, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
