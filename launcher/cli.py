"""`python -m launcher`: validate everything, decide the mode, then exec vLLM.

Exit codes: 0 after --inspect-only/--explain, 2 on any refusal (JSON on stderr:
{"ok": false, "error": ..., "field": ...}), 127 if exec returned. Otherwise the process
becomes the vLLM server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Mapping, Sequence

from attest.baked import baked_path, load_baked
from attest.edge.refusal import ending_at_once_on_stop, refusing_main, report_refusal
from attest.edge.settings import help_table, note_default
from attest.edge.status import report_refused, write_status
from attest.engine import engine_search_path
from attest.errors import AttestError
from attest.primitives import require_writable_cache_env
from launcher.checkpoint import inspect_target_checkpoint
from launcher.engine_probe import probe_installed_vllm
from launcher.hardware import detect_nvidia_gpus, detect_rocm_architectures
from launcher.selection import explanation_table, select_mode
from launcher.server import OFFLINE_ENV, build_server_command
from launcher.settings import SETTINGS, LauncherSettings
from launcher.target import PROFILE_SETTING, select_target_profile

ExecFn = Callable[[str, Sequence[str], Mapping[str, str]], None]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="launcher",
        description="Fail-closed, local-files-only vLLM launcher for Qwen3.8-27B on one MI300X (or the target "
        "profile the image pins). Settings come from the environment (below); any doubt exits 2 with a JSON "
        "refusal on stderr.",
        epilog="settings (environment variables):\n" + help_table(SETTINGS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--inspect-only",
        action="store_true",
        help="validate and print the decision without starting vLLM or loading a model",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="judge every mode (autoregressive, native MTP, DFlash2 canary), print why each is "
        "accepted or rejected (JSON on stdout, a table on stderr); never starts vLLM",
    )
    return parser.parse_args(argv)


@refusing_main
def main(argv: Sequence[str] | None = None, *, execve: ExecFn = os.execve) -> int:
    with ending_at_once_on_stop("launcher"):  # PID 1 in its pod until it becomes vLLM
        return _launch(argv, execve)


def _pin_checks(baked, settings: LauncherSettings, vllm) -> list[str]:
    if not baked:
        return [f"not running from an Omni image (no {baked_path()}): pins not checked"]
    from launcher.image_pins import check_image_pins  # pin models load only inside an image

    return check_image_pins(baked, settings, vllm)


def _warnings(settings: LauncherSettings, profile, command) -> list[str]:
    """What the report and stderr warn of: weak defaults, a test-only profile, a key in the wrong
    variable or on the command line."""
    warnings = settings.warnings()
    if profile.test_only:
        warnings.append(f"the target profile {profile.name} is for tests only: {profile.hardware.description}")
    if os.environ.get("API_KEY"):
        warnings.append("API_KEY is set but this launcher reads QWEN_API_KEY (API_KEY is boot's): it is ignored")
    if command.api_key_transport == "command_line":
        warnings.append(
            "the installed vLLM does not read VLLM_API_KEY: the API key is on the server's command "
            "line, readable by local processes through /proc"
        )
    return warnings


def _findings(target, vllm, hardware, nvidia, decision, command) -> dict:
    """What the launcher found and decided, as the report shows it (no secret: the argv redacted)."""
    return {
        "checkpoint": target.public_dict(),
        "vllm": vllm.public_dict(),
        "hardware_arches": list(hardware),
        "nvidia_gpus": list(nvidia),
        "decision": decision.public_dict(),
        "server_argv": command.redacted_argv(),
        "api_key_transport": command.api_key_transport,
    }


def _launch(argv: Sequence[str] | None, execve: ExecFn) -> int:
    args = parse_args(argv)
    os.environ.update(OFFLINE_ENV)
    explain = args.explain
    settings = None
    try:
        settings = LauncherSettings.from_env()
        if not (args.inspect_only or explain):  # an earlier start's verdict is not this one's
            write_status(settings.status_file, program="launcher", stage="starting", pids=[os.getpid()])
        baked = load_baked()
        profile = select_target_profile(settings.target_profile, PROFILE_SETTING in settings.defaults_used, baked)
        target = inspect_target_checkpoint(
            settings.model_path,
            model_id=settings.model_id,
            revision=settings.model_revision,
            manifest_path=settings.checkpoint_manifest,
            expected_manifest_sha256=settings.checkpoint_manifest_sha256,
            hash_workers=settings.hash_workers,
            profile=profile,
        )
        vllm = probe_installed_vllm(engine_search_path(settings.engine_python))
        pin_checks = _pin_checks(baked, settings, vllm)
        needs_rocm = settings.required_gpu_arch or settings.requested_mode == "dflash2_canary" or explain
        hardware = detect_rocm_architectures() if needs_rocm else ()
        nvidia = detect_nvidia_gpus()
        writable = require_writable_cache_env(os.environ)
        decision = select_mode(target, vllm, settings, hardware_arches=hardware, explain=explain)
        command = build_server_command(settings, target, decision, vllm)
    except AttestError as exc:
        if settings is not None:
            exc = note_default(exc, SETTINGS, settings.defaults_used)
            if not (args.inspect_only or explain):
                report_refused(settings.status_file, program="launcher", error=exc)
        return report_refusal(exc)
    inspect_only = args.inspect_only or explain
    report = {
        "ok": True,
        "offline_only": True,
        "will_start_model": not inspect_only,
        **_findings(target, vllm, hardware, nvidia, decision, command),
        "image_pins": pin_checks,
        "writable": writable,
    }
    warnings = _warnings(settings, profile, command)
    if warnings:
        report["warnings"] = warnings
        for warning in warnings:
            print(f"launcher: warning: {warning}", file=sys.stderr, flush=True)
    if explain:
        report["explain"] = [verdict.public_dict() for verdict in decision.explanation]
        print(explanation_table(decision.explanation), file=sys.stderr, flush=True)
    print(json.dumps(report, ensure_ascii=False, sort_keys=True), flush=True)
    if inspect_only:
        return 0
    # Accepted: the same process becomes vLLM, so the probes watch this pid and the port.
    write_status(settings.status_file, program="launcher", stage="accepted", pids=[os.getpid()], port=settings.port)
    execve(command.argv[0], list(command.argv), dict(command.env))
    return 127
