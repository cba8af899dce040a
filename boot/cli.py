"""`python -m boot COMMAND`: DeepSeek-V4.1-Flash on 3x DGX Spark.

Commands:
  run      prepare, then serve SGLang; on rank 0 smoke and warm-up once healthy (default)
  prepare  the pinned checkpoint in MODEL_PATH, verified: downloaded from the hub by rank 0 (the
           other ranks wait for its verdict), pulled by every rank (MODEL_SOURCE=registry: the
           init container), or checked on the image volume (MODEL_SOURCE=image)
  verify   re-check the local checkpoint against its lock, without any network
           (--full re-hashes every file instead of trusting the receipt's identities)
  health   GET /health of the local server
  smoke    run the API smoke checks against the local server

A refusal exits 2 with one line {"ok": false, "error": ..., "field": ...} on stderr.
Settings (environment variables):
"""

from __future__ import annotations

import json
import os
import sys
from typing import Sequence

import httpx

from attest.baked import load_baked
from attest.edge.refusal import ending_at_once_on_stop, refusing_main, report_refusal
from attest.edge.settings import help_table, note_default
from attest.edge.status import report_refused, write_status
from attest.engine import ENGINE_DISTRIBUTIONS, engine_search_path, find_installed
from attest.errors import AttestError
from attest.pins import check_engine_identity, check_model_revision
from attest.primitives import writable_dir
from boot.settings import REVISION, SETTINGS, BootSettings

COMMANDS = ("run", "prepare", "verify", "health", "smoke")


def check_image_pins(settings: BootSettings, command: str) -> list[str]:
    """Refuse to start when the image's baked pins disagree with what is here."""
    baked = load_baked()
    if baked is None:
        return []
    notes = [check_model_revision(baked, REVISION, "boot's pinned revision")]
    if settings.model_revision:
        notes.append(check_model_revision(baked, settings.model_revision, "MODEL_REVISION"))
    if command == "run":
        installed = find_installed(ENGINE_DISTRIBUTIONS["sglang"], "sglang", engine_search_path(settings.engine_python))
        notes.extend(check_engine_identity(baked, "sglang", installed))
    return notes


@refusing_main
def main(argv: Sequence[str] | None = None) -> int:
    with ending_at_once_on_stop("boot"):  # PID 1 in its pod: a stop must not wait out the grace period
        return _run(argv)


def _run(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(arg in ("-h", "--help") for arg in args) or args[:1] == ["help"]:
        print(__doc__ + help_table(SETTINGS))
        return 0
    command = args[0] if args else "run"
    if command not in COMMANDS or (args[1:] and args[1:] != ["--full"]) or (args[1:] and command != "verify"):
        print(__doc__, file=sys.stderr)
        print(f"boot: unknown command or option: {' '.join(args)}", file=sys.stderr)
        return 2
    settings = None
    try:
        settings = BootSettings.from_env()
        if command == "run":  # an earlier start's verdict is not this one's
            write_status(settings.status_file, program="boot", stage="starting", pids=[os.getpid()])
        if command != "health":  # every other command writes its receipt or results to STATE_PATH
            writable_dir(settings.state, "STATE_PATH", create=True, default_used="STATE_PATH" in settings.defaults_used)
        for note in check_image_pins(settings, command):
            print(f"pins: {note}", file=sys.stderr)
        return _command(command, args, settings)
    except AttestError as exc:
        if settings is None:
            return report_refusal(exc)
        if command == "run" and exc.field != "HEALTH_LOSS_TIMEOUT_S":  # `lost` is already reported
            report_refused(settings.status_file, program="boot", error=exc)
        return report_refusal(note_default(exc, SETTINGS, settings.defaults_used))
    except httpx.HTTPError as exc:
        return report_refusal(_local_server_refusal(exc, settings))


def _command(command: str, args: list[str], settings: BootSettings) -> int:
    """One command, its settings read and its pins checked."""
    if command == "prepare":
        from boot.checkpoint.sources import prepare

        prepare(settings)
        return 0
    if command == "verify":
        from boot.checkpoint.sources import verify_only

        verify_only(settings, full="--full" in args)
        return 0
    from boot.serving.api import Api, smoke

    if command == "health":
        print(json.dumps(Api(settings).get("/health", timeout=10)))
        return 0
    if command == "smoke":
        smoke(Api(settings), settings)
        return 0
    from boot.checkpoint.sources import prepare
    from boot.serving.api import warmup
    from boot.serving.serve import serve

    prepare(settings)

    def acceptance() -> None:
        if not settings.skip_smoke:
            api = Api(settings)
            smoke(api, settings)
            warmup(api, settings)

    return serve(settings, after_healthy=acceptance)


def _local_server_refusal(exc: httpx.HTTPError, settings: BootSettings | None) -> AttestError:
    """The local server's failed answer, naming the variable to look at."""
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        field = "API_KEY" if status in (401, 403) else "SERVER_PORT"
        hint = " (the API key in API_KEY is missing or not the server's)" if field == "API_KEY" else ""
        return AttestError(f"local server answered HTTP {status} to {exc.request.url}{hint}", field=field)
    port = settings.port if settings is not None else "?"
    return AttestError(
        f"local server request failed: {type(exc).__name__}: {exc} (is SGLang up on SERVER_PORT={port}?)",
        field="SERVER_PORT",
    )
