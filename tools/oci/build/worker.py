"""Bazel persistent workers for the build tools (layer, image, index): one warm process serves
many actions, so a one-line change pays no interpreter start-up or imports.

`run(main)` is a tool's entry point. Started by Bazel with `--persistent_worker`, it answers
JSON WorkRequests on stdin (`{"arguments": [...], "requestId": N}`) with WorkResponses on
stdout (`{"exitCode", "output", "requestId"}`), one per line, as Bazel's JSON worker protocol
says; what a request prints goes into its response. Otherwise it is the plain command line,
where an `@FILE` argument (Bazel's param file, one argument per line) is read in place.

Hand-written rather than a library: the protocol is a dozen lines of JSON over stdio, and
Bazel's own worker libraries are for Java and C++.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Callable

Main = Callable[[list[str]], int]


def _expand(arguments: list[str]) -> list[str]:
    """Arguments with each `@FILE` replaced by the file's lines (Bazel's multiline param file)."""
    expanded = []
    for argument in arguments:
        if argument.startswith("@") and not argument.startswith("@@"):
            expanded += Path(argument[1:]).read_text(encoding="utf-8").splitlines()
        else:
            expanded.append(argument)
    return expanded


def serve(main: Main, stdin=None, stdout=None) -> int:
    """Answer WorkRequests until stdin closes. A request that raises is answered with exit 1 and
    the error; the worker keeps serving (Bazel restarts it only when it dies)."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    for line in stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        captured = io.StringIO()
        try:
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                code = main(_expand(list(request.get("arguments") or [])))
        except SystemExit as exc:  # argparse and tools exit this way
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # a bug in one action must not take the worker down silently
            captured.write(f"{type(exc).__name__}: {exc}\n")
            code = 1
        response = {"exitCode": code, "output": captured.getvalue(), "requestId": request.get("requestId", 0)}
        stdout.write(json.dumps(response) + "\n")
        stdout.flush()
    return 0


def run(main: Main, argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if "--persistent_worker" in arguments:
        return serve(main)
    return main(_expand(arguments))
