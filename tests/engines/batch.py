"""The helpers' shared loop: parse each ARGV of a JSON list on stdin, print the results as
one `OMNI-RESULT <json>` line (the engines print their own logs around it)."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable


def run(parse: Callable[[list[str]], dict[str, Any]]) -> int:
    results = []
    for argv in json.load(sys.stdin):
        try:
            results.append(parse(argv))
        except SystemExit as exc:  # argparse refuses by exiting
            results.append({"refused": f"exit {exc.code}"})
    sys.stdout.write("OMNI-RESULT " + json.dumps(results, default=str) + "\n")
    return 0
