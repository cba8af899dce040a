"""How every command reports a refusal: one JSON line on stderr, exit 2, no traceback and no
secret; and how a program stops at once on SIGTERM or SIGINT."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import threading
from typing import Callable, Iterator, TypeVar

from attest.edge.redact import known_secrets, redactor
from attest.errors import AttestError

Command = TypeVar("Command", bound=Callable[..., int])


def report_refusal(exc: AttestError, secrets: tuple[str, ...] = ()) -> int:
    """Print `{"ok": false, "error": ..., "field": ...}` on stderr; the exit code is 2.

    Secrets from the environment, those the process learned (attest.edge.redact.learn) and
    `secrets` are redacted in every escaped form."""
    redact = redactor([*known_secrets(), *secrets])
    # Before encoding (the message may hold an escaped form) and after (encoding escapes again).
    line = json.dumps({"ok": False, "error": redact(str(exc)), "field": redact(exc.field)}, ensure_ascii=False)
    print(redact(line), file=sys.stderr)
    return 2


def report_unexpected(exc: BaseException, secrets: tuple[str, ...] = ()) -> int:
    """A bug is still a refusal: one JSON line (no traceback, no secret), exit 2."""
    return report_refusal(
        AttestError(f"internal error: {type(exc).__name__}: {str(exc)[:500]}", field="internal"), secrets
    )


def report_error(exc: BaseException, secrets: tuple[str, ...] = ()) -> int:
    """Exit 2 with one JSON line: a refusal for a domain error (AttestError and every error
    derived from it), a reported bug for anything else."""
    if isinstance(exc, AttestError):
        return report_refusal(exc, secrets)
    return report_unexpected(exc, secrets)


def refusing_main(command: Command) -> Command:
    """Every command's entry point: whatever it raises becomes report_error's line and exit 2
    (no traceback, no secret); argparse's own exits pass through."""

    @functools.wraps(command)
    def refusing(*args, **kwargs) -> int:
        try:
            return command(*args, **kwargs)
        except Exception as exc:  # a bug is still a refusal: one JSON line, no traceback, no secret
            return report_error(exc)

    return refusing  # type: ignore[return-value]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def ending_at_once_on_stop(program: str) -> Iterator[None]:
    """While inside, SIGTERM or SIGINT ends `program` at once: one JSON line, exit 128 + signal.

    In a container the program is PID 1, and the kernel gives PID 1 no default action: without a
    handler SIGTERM is dropped, and the runtime waits out the pod's grace period
    (terminationGracePeriodSeconds, 120 s) before its SIGKILL. Ending at once is what that SIGKILL
    does, only sooner: every write before the engine runs is crash-safe already (downloads resume
    from their .part files; receipts, verdicts and the status file are written atomically). An
    engine brings its own handlers (boot's serve forwards the signal to SGLang's group). Outside
    the main thread (a test calling main() from a worker) nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        line = {"ok": False, "error": f"{program}: stopped by {signal.Signals(signum).name}", "field": "signal"}
        os.write(2, (json.dumps(line) + "\n").encode())
        os._exit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
