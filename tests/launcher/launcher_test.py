"""The launcher end to end: happy path, exec, explain, mode selection, attestation builder,
API key handling, hardware reports, and that vLLM and torch are never imported."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from tests.fixtures.bounds import ended_long_before
from tests.fixtures.processes import wait_for_file
from tests.fixtures.qwen import SPECULATOR_REVISION, TARGET_REVISION, LauncherWorld, make_fake_tool, make_fake_vllm
from tests.fixtures.tools import make_script, make_venv, recorded_timeouts

KEY = "sk-test-secret-key-123"


@pytest.fixture
def world(tmp_path: Path) -> LauncherWorld:
    return LauncherWorld(tmp_path)


def test_inspect_only_reports_the_decision_without_the_key(world: LauncherWorld) -> None:
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    report = result.report
    assert report["ok"] is True and report["offline_only"] is True and report["will_start_model"] is False
    assert report["checkpoint"]["revision"] == TARGET_REVISION
    assert report["checkpoint"]["native_mtp_head"] is True
    assert report["vllm"]["source_commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert report["decision"]["mode"] == "native_mtp"
    assert report["decision"]["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
    assert report["api_key_transport"] == "environment:VLLM_API_KEY"
    assert KEY not in result.stdout + result.stderr
    assert result.exec_calls == []


def test_exec_gets_exactly_the_expected_argv_and_a_clean_offline_env(world: LauncherWorld) -> None:
    world.env.update(PYTHONPATH="/ours", HF_HUB_OFFLINE="0", QWEN_MAX_MODEL_LEN="32768")
    result = world.run()
    assert result.code == 127  # exec was intercepted, so main fell through
    [(path, argv, env)] = result.exec_calls
    assert path == argv[0] == sys.executable
    assert argv == [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(world.model.resolve()),
        "--host",
        "127.0.0.1",
        "--port",
        "8103",
        "--served-model-name",
        "qwen3.8-27b",
        "--dtype",
        "float16",
        "--tensor-parallel-size",
        "1",
        "--gpu-memory-utilization",
        "0.600",
        "--max-model-len",
        "32768",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":1}',
    ]
    assert env["VLLM_API_KEY"] == KEY
    assert "QWEN_API_KEY" not in env and "PYTHONPATH" not in env
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "VLLM_USE_MODELSCOPE": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }.items():
        assert env[name] == value
    assert result.report["will_start_model"] is True
    assert result.report["server_argv"] == argv


def test_key_on_the_command_line_only_when_vllm_cannot_read_it_from_env(world: LauncherWorld) -> None:
    world.site = world.base / "old-engine"
    make_fake_vllm(world.site, api_key_env=False)
    result = world.run()
    [(_, argv, env)] = result.exec_calls
    assert argv[argv.index("--api-key") + 1] == KEY
    assert "VLLM_API_KEY" not in env
    report = result.report
    assert report["api_key_transport"] == "command_line"
    assert report["server_argv"][report["server_argv"].index("--api-key") + 1] == "[REDACTED]"
    assert KEY not in result.stdout + result.stderr
    assert "readable by local processes through /proc" in report["warnings"][0]


def test_engine_interpreter_is_configurable(world: LauncherWorld, tmp_path: Path) -> None:
    """The engine's own interpreter (a venv of ours, its packages on its own path) is probed and
    started; our PYTHONPATH is neither what it is probed with nor what it runs with."""
    engine, pth = make_venv(tmp_path / "engine", [world.site])
    world.env["OMNI_ENGINE_PYTHON"] = str(engine)
    world.env["PYTHONPATH"] = str(tmp_path / "ours-only")
    result = world.run()
    [(path, argv, env)] = result.exec_calls
    assert path == argv[0] == str(engine) and "PYTHONPATH" not in env
    pth.unlink()  # without its packages, the engine is refused
    assert world.run().refusal["field"] == "vllm"


def test_dflash2_canary_end_to_end(world: LauncherWorld) -> None:
    world.env["INFERENCE_MODE"] = "dflash2"
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    decision = result.report["decision"]
    assert decision["mode"] == "dflash2_canary"
    assert decision["speculative_config"] == {
        "method": "dflash",
        "model": str(world.speculator.resolve()),
        "num_speculative_tokens": 7,
    }
    assert result.report["hardware_arches"] == ["gfx942"]


def test_explain_judges_every_mode_in_json_and_a_table(world: LauncherWorld) -> None:
    world.env["INFERENCE_MODE"] = "autoregressive"
    result = world.run("--explain")
    assert result.code == 0 and result.exec_calls == []
    verdicts = {item["mode"]: item for item in result.report["explain"]}
    assert list(verdicts) == ["autoregressive", "native_mtp", "dflash2_canary"]
    assert verdicts["autoregressive"]["selected"] and verdicts["autoregressive"]["accepted"]
    assert verdicts["native_mtp"]["accepted"] and not verdicts["native_mtp"]["selected"]
    assert "not selected: AR was explicitly requested" in verdicts["native_mtp"]["reasons"]
    assert verdicts["dflash2_canary"]["accepted"] and not verdicts["dflash2_canary"]["selected"]
    table = result.stderr.splitlines()
    assert table[0].split() == ["MODE", "ACCEPTED", "SELECTED", "REASONS"]
    assert table[1].split()[:3] == ["autoregressive", "yes", "*"]


MTP_EVIDENCE = {
    "none": (False, False),
    "checkpoint_only": (True, False),
    "vllm_only": (False, True),
    "both": (True, True),
}


@pytest.mark.parametrize(
    "requested,evidence,gate_passes",
    list(itertools.product(["auto", "autoregressive", "native_mtp", "dflash2_canary"], MTP_EVIDENCE, [True, False])),
)
def test_mode_selection_matrix(tmp_path: Path, requested: str, evidence: str, gate_passes: bool) -> None:
    checkpoint_mtp, vllm_mtp = MTP_EVIDENCE[evidence]
    world = LauncherWorld(tmp_path)
    world.env["INFERENCE_MODE"] = requested
    if not checkpoint_mtp:
        world.edit_config(lambda c: c["text_config"].__setitem__("mtp_num_hidden_layers", 0), reattest=True)
    if not vllm_mtp:
        world.site = tmp_path / "engine-no-mtp"
        make_fake_vllm(world.site, mtp=False)
    if not gate_passes:
        world.edit_gate(
            benchmark={
                "passed": False,
                "concurrency": [1, 2],
                "samples_per_mode": 120,
                "ar_p95_ms": 100.0,
                "dflash2_p95_ms": 80.0,
            }
        )
    report = world.run("--inspect-only").report
    mode, reasons = report["decision"]["mode"], report["decision"]["reasons"]
    if requested == "autoregressive":
        assert (mode, reasons) == ("autoregressive", ["AR was explicitly requested"])
        return
    if requested == "dflash2_canary" and gate_passes:
        assert mode == "dflash2_canary"
        return
    expected = "native_mtp" if checkpoint_mtp and vllm_mtp else "autoregressive"
    assert mode == expected
    if requested == "dflash2_canary":
        assert any(
            "DFlash2 canary disabled: DFlash2 target-hardware benchmark gate has not passed" in r for r in reasons
        )
    if not checkpoint_mtp:
        assert "native MTP disabled: text_config.mtp_num_hidden_layers is not exactly 1" in reasons
    if not vllm_mtp:
        assert "native MTP disabled: installed vLLM capability probe failed" in reasons
    assert reasons[-1] == (
        "exact native MTP head and installed vLLM support were proven"
        if expected == "native_mtp"
        else "using the quality-baseline autoregressive fallback"
    )


def test_incomplete_mtp_weight_groups_fall_back(world: LauncherWorld) -> None:
    world.edit_index(lambda i: i["weight_map"].pop("mtp.fc.weight"))
    report = world.run("--inspect-only").report
    assert report["decision"]["mode"] == "autoregressive"
    assert (
        "native MTP disabled: weight index does not contain the complete mtp.layers/fc/norm groups"
        in report["decision"]["reasons"]
    )


def test_hardware_reports_rocm_and_nvidia_without_requiring_nvidia(world: LauncherWorld) -> None:
    make_fake_tool(world.bin, "nvidia-smi", "NVIDIA GB10, 12.1")
    world.env["QWEN_REQUIRE_GPU_ARCH"] = "GFX942"
    report = world.run("--inspect-only").report
    assert report["hardware_arches"] == ["gfx942"]
    assert report["nvidia_gpus"] == [{"name": "NVIDIA GB10", "compute_capability": "12.1"}]


def test_shard_digests_when_attested_are_verified(world: LauncherWorld) -> None:
    world.reattest(hash_shards=True)
    report = world.run("--inspect-only").report
    assert report["checkpoint"]["shards_hashed"] == 2


def _subprocess_env(world: LauncherWorld, extra_path: list[str]) -> dict[str, str]:
    env = dict(world.env)
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, *[p for p in sys.path if p]])
    return env


def test_real_process_never_imports_vllm_or_torch(world: LauncherWorld) -> None:
    # The fake vllm and torch on the path raise on import: any import would crash the launcher.
    probe = (
        "import runpy, sys, json\n"
        "sys.argv = ['launcher', '--inspect-only']\n"
        "try:\n    runpy.run_module('launcher', run_name='__main__')\n"
        "except SystemExit as exit:\n    code = exit.code\n"
        "print(json.dumps({'code': code, 'imported': sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch'))}), file=sys.stderr)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe],
        env=_subprocess_env(world, [str(world.site)]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    outcome = json.loads(completed.stderr.strip().splitlines()[-1])
    assert outcome == {"code": 0, "imported": []}, completed.stderr
    assert json.loads(completed.stdout)["decision"]["mode"] == "native_mtp"


def test_real_process_exits_2_with_json_on_refusal(world: LauncherWorld) -> None:
    world.env["MODEL_REVISION"] = "main"
    completed = subprocess.run(
        [sys.executable, "-m", "launcher"],
        env=_subprocess_env(world, [str(world.site)]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2 and completed.stdout == ""
    assert json.loads(completed.stderr) == {
        "ok": False,
        "field": "MODEL_REVISION",
        "error": "MODEL_REVISION must be an immutable 40-character commit SHA, got 'main'",
    }


def test_a_stop_signal_ends_the_launcher_at_once_before_vllm_runs(world: LauncherWorld, tmp_path: Path) -> None:
    """As PID 1 of its pod the launcher gets no default action for SIGTERM: without its handler a
    stop during checks waits out the pod's grace period. Here the engine's interpreter is slow to
    answer the probe; SIGTERM ends the launcher at once, exit 143, one JSON line naming it."""
    import signal
    import time

    slow, ready = tmp_path / "slow-python", tmp_path / "probing"
    # The launcher runs this once its checks (and long before them its handlers) are done.
    slow.write_text(f'#!/bin/sh\ntouch {ready}\nsleep 600\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    world.env["OMNI_ENGINE_PYTHON"] = str(slow)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "launcher", "--inspect-only"],
        env=_subprocess_env(world, [str(world.site)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_file(ready, launcher)  # the checkpoint checked: waiting for the engine's interpreter
        started = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        code = launcher.wait(timeout=120)
        took = time.monotonic() - started
        stderr = launcher.stderr.read() if launcher.stderr else ""
    finally:
        try:
            os.killpg(launcher.pid, signal.SIGKILL)  # the slow interpreter it left behind
        except ProcessLookupError:
            pass
    # Ended by the signal, long before the 600 s the interpreter would keep it waiting.
    assert code == 143, (code, took, stderr[-2000:])
    ended_long_before(took, 600, what="SIGTERM")
    assert json.loads(stderr.strip().splitlines()[-1]) == {
        "ok": False,
        "error": "launcher: stopped by SIGTERM",
        "field": "signal",
    }


def test_help_describes_the_flags() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "launcher", "--help"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "PATH": "/usr/bin:/bin"},
    )
    assert completed.returncode == 0
    assert "--inspect-only" in completed.stdout and "--explain" in completed.stdout


def test_attestation_builder_writes_atomically_and_prints_the_pin(world: LauncherWorld) -> None:
    from launcher import build_attestation

    (world.model / ".omni-checkpoint.json").unlink()
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.build_attestation",
            str(world.model),
            "--revision",
            TARGET_REVISION.upper(),
            "--hash-shards",
        ],
        env=_subprocess_env(world, []),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    digest = completed.stdout.strip()
    written = world.model / ".omni-checkpoint.json"
    assert digest == hashlib.sha256(written.read_bytes()).hexdigest()
    assert f"QWEN_CHECKPOINT_MANIFEST_SHA256={digest}" in completed.stderr
    doc = json.loads(written.read_text())
    assert doc["revision"] == TARGET_REVISION and len(doc["shards"]) == 2
    assert sorted(p.name for p in world.model.iterdir() if p.name.startswith(".")) == [".omni-checkpoint.json"]
    world.env["QWEN_CHECKPOINT_MANIFEST_SHA256"] = digest
    assert world.run("--inspect-only").report["checkpoint"]["shards_hashed"] == 2
    assert build_attestation.main([str(world.model), "--revision", "main"]) == 2


def test_attestation_builder_refuses_a_foreign_checkpoint(world: LauncherWorld, capsys) -> None:
    from launcher import build_attestation

    world.edit_config(lambda c: c.__setitem__("architectures", ["LlamaForCausalLM"]))
    before = (world.model / ".omni-checkpoint.json").read_bytes()
    assert build_attestation.main([str(world.model), "--revision", TARGET_REVISION]) == 2
    assert "exact Qwen3.8-27B architecture" in json.loads(capsys.readouterr().err)["error"]
    assert (world.model / ".omni-checkpoint.json").read_bytes() == before


def test_speculator_revision_is_case_insensitive(world: LauncherWorld) -> None:
    world.env.update(INFERENCE_MODE="dflash2_canary", DFLASH2_SPECULATOR_REVISION=SPECULATOR_REVISION.upper())
    assert world.run("--inspect-only").report["decision"]["mode"] == "dflash2_canary"


@pytest.mark.parametrize(
    "change, variable",
    [
        ("QWEN_API_KEY", "QWEN_API_KEY is unset: the server uses the built-in, publicly known API key"),
        (
            "QWEN_CHECKPOINT_MANIFEST_SHA256",
            "QWEN_CHECKPOINT_MANIFEST_SHA256 is unset: the checkpoint attestation is not pinned",
        ),
        ("API_KEY", "API_KEY is set but this launcher reads QWEN_API_KEY"),
    ],
)
def test_defaults_that_weaken_security_are_warned_about(world: LauncherWorld, change: str, variable: str) -> None:
    clean = world.run("--inspect-only")
    assert clean.code == 0 and "warnings" not in clean.report
    if change == "API_KEY":
        world.env["API_KEY"] = "boot-key"
    else:
        del world.env[change]
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    assert [warning for warning in result.report["warnings"] if warning.startswith(variable)], result.report
    assert f"launcher: warning: {variable}" in result.stderr


def test_a_refusal_says_when_the_variable_was_unset_and_its_default_used(world: LauncherWorld) -> None:
    del world.env["MODEL_PATH"]
    result = world.run("--inspect-only")
    refusal = json.loads(result.stderr.splitlines()[-1])
    assert result.code == 2 and refusal["field"] == "MODEL_PATH"
    assert refusal["error"] == (
        "MODEL_PATH does not exist: /models/qwen (MODEL_PATH is unset; its default /models/qwen was used)"
    )


@pytest.mark.parametrize(
    "argv, environment, field",
    [(["--revision", "main"], {}, "--revision"), ([], {"MODEL_REVISION": "main"}, "MODEL_REVISION")],
)
def test_attestation_builder_names_the_flag_or_the_variable(
    world: LauncherWorld, capsys, argv, environment, field
) -> None:
    from launcher import build_attestation

    with mock.patch.dict(os.environ, environment):
        assert build_attestation.main([str(world.model), *argv]) == 2
    refusal = json.loads(capsys.readouterr().err)
    assert refusal["field"] == field and refusal["error"].startswith(f"{field} must be an immutable")
    assert "got 'main'" in refusal["error"]


def test_attestation_builder_without_a_directory_names_model_path(capsys) -> None:
    from launcher import build_attestation

    with mock.patch.dict(os.environ, {}, clear=True):
        assert build_attestation.main([]) == 2
    assert json.loads(capsys.readouterr().err)["field"] == "MODEL_PATH"


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.pop("mtp_num_hidden_layers"),
        lambda t: t.__setitem__("mtp_num_hidden_layers", None),
        lambda t: t.__setitem__("mtp_num_hidden_layers", "one"),
        lambda t: t.__setitem__("mtp_num_hidden_layers", 2),
        lambda t: t.__setitem__("mtp_num_hidden_layers", 0),
        lambda t: t.__setitem__("mtp_num_hidden_layers", [1]),
        lambda t: t.__setitem__("mtp_num_hidden_layers", True),
        lambda t: t.__setitem__("mtp_num_hidden_layers", "1"),
        lambda t: t.__setitem__("mtp_num_hidden_layers", 1.0),
    ],
    ids=["missing", "null", "text", "two", "zero", "list", "true", "string one", "float one"],
)
def test_native_mtp_needs_exactly_one_declared_layer(world: LauncherWorld, change) -> None:
    world.edit_config(lambda c: change(c["text_config"]), reattest=True)
    report = world.run("--inspect-only").report
    assert report["checkpoint"]["native_mtp_head"] is False
    assert report["decision"]["mode"] == "autoregressive"
    assert "native MTP disabled: text_config.mtp_num_hidden_layers is not exactly 1" in report["decision"]["reasons"]


@pytest.mark.parametrize("group", ["mtp.layers.", "mtp.fc", "mtp.norm"])
def test_native_mtp_needs_every_indexed_weight_group(world: LauncherWorld, group: str) -> None:
    world.edit_index(
        lambda index: index.__setitem__(
            "weight_map", {name: shard for name, shard in index["weight_map"].items() if not name.startswith(group)}
        )
    )
    report = world.run("--inspect-only").report
    assert report["checkpoint"]["native_mtp_head"] is False and report["decision"]["mode"] == "autoregressive"
    assert (
        "native MTP disabled: weight index does not contain the complete mtp.layers/fc/norm groups"
        in report["decision"]["reasons"]
    )


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--model-id", "Qwen/Qwen3.8-27B-Instruct"], "MODEL_ID"),
        (["--model-id", ""], "MODEL_ID"),
        (["--revision", TARGET_REVISION[:-1]], "--revision"),
        (["--revision", TARGET_REVISION + "0"], "--revision"),
    ],
)
def test_attestation_builder_refuses_a_wrong_identity_and_writes_nothing(
    world: LauncherWorld, capsys, argv, field
) -> None:
    from launcher import build_attestation

    before = (world.model / ".omni-checkpoint.json").read_bytes()
    assert build_attestation.main([str(world.model), "--revision", TARGET_REVISION, *argv]) == 2
    assert json.loads(capsys.readouterr().err)["field"] == field
    assert (world.model / ".omni-checkpoint.json").read_bytes() == before


MTP_PROVEN = "exact native MTP head and installed vLLM support were proven"
AR_REQUESTED = "not selected: AR was explicitly requested"
NOT_CANARY_MODE = "not selected: INFERENCE_MODE is not dflash2_canary"
CANARY_PASSED = "explicit exact DFlash2 parity and target-hardware benchmark gates passed"


@pytest.mark.parametrize(
    "mode, mtp_head, gate_passes, expected",
    [
        ("auto", True, True, {"native_mtp": [MTP_PROVEN], "dflash2_canary": [CANARY_PASSED, NOT_CANARY_MODE]}),
        ("native_mtp", True, True, {"native_mtp": [MTP_PROVEN], "dflash2_canary": [CANARY_PASSED, NOT_CANARY_MODE]}),
        (
            "autoregressive",
            True,
            True,
            {"native_mtp": [MTP_PROVEN, AR_REQUESTED], "dflash2_canary": [CANARY_PASSED, AR_REQUESTED]},
        ),
        (
            "autoregressive",
            False,
            False,
            {
                "native_mtp": ["native MTP disabled: text_config.mtp_num_hidden_layers is not exactly 1"],
                "dflash2_canary": ["DFlash2 canary disabled: DFlash2 target-hardware benchmark gate has not passed"],
            },
        ),
        ("dflash2_canary", True, True, {"native_mtp": [MTP_PROVEN], "dflash2_canary": [CANARY_PASSED]}),
        (
            "auto",
            False,
            False,
            {
                "native_mtp": ["native MTP disabled: text_config.mtp_num_hidden_layers is not exactly 1"],
                "dflash2_canary": ["DFlash2 canary disabled: DFlash2 target-hardware benchmark gate has not passed"],
            },
        ),
    ],
)
def test_explain_gives_each_mode_exactly_its_reasons(
    world: LauncherWorld, mode: str, mtp_head: bool, gate_passes: bool, expected: dict
) -> None:
    world.env["INFERENCE_MODE"] = mode
    if not mtp_head:
        world.edit_config(lambda c: c["text_config"].__setitem__("mtp_num_hidden_layers", 0), reattest=True)
    if not gate_passes:
        world.edit_gate(
            benchmark={
                "passed": False,
                "concurrency": [1, 2],
                "samples_per_mode": 120,
                "ar_p95_ms": 100.0,
                "dflash2_p95_ms": 80.0,
            }
        )
    report = world.run("--explain").report
    verdicts = {item["mode"]: item for item in report["explain"]}
    for name, reasons in expected.items():
        assert verdicts[name]["reasons"] == reasons, (name, verdicts[name])
    assert verdicts["autoregressive"]["field"] is None and verdicts["native_mtp"]["field"] is None
    assert verdicts["dflash2_canary"]["field"] == (None if gate_passes else "DFlash2 gate.benchmark.passed")


def test_a_missing_required_gpu_architecture_names_what_was_found(world: LauncherWorld) -> None:
    world.env["QWEN_REQUIRE_GPU_ARCH"] = "gfx950"
    refusal = world.run("--inspect-only").refusal
    assert refusal["field"] == "QWEN_REQUIRE_GPU_ARCH"
    assert refusal["error"] == "required GPU architecture 'gfx950' was not found locally (found ['gfx942'])"
    (world.bin / "rocminfo").unlink()
    assert world.run("--inspect-only").refusal["error"].endswith("(found none)")


def test_a_checkpoint_without_a_shard_list_hashes_no_shard_and_the_attestation_defaults_to_the_model_dir(
    world: LauncherWorld,
) -> None:
    from launcher.checkpoint import inspect_target_checkpoint

    assert world.run("--inspect-only").report["checkpoint"]["shards_hashed"] == 0
    inspected = inspect_target_checkpoint(world.model, model_id="Qwen/Qwen3.8-27B", revision=TARGET_REVISION)
    assert inspected.shards_hashed == 0 and inspected.shard_count == 2


def test_the_builder_without_a_profile_describes_the_default_target(tmp_path: Path) -> None:
    from launcher.checkpoint import build_checkpoint_attestation
    from tests.fixtures.qwen import make_checkpoint, sha256

    model = tmp_path / "model"
    make_checkpoint(model, shards=3)
    attestation = build_checkpoint_attestation(
        model, model_id="Qwen/Qwen3.8-27B", revision=TARGET_REVISION, hash_shards=True
    )
    assert attestation.model_id == "Qwen/Qwen3.8-27B" and attestation.expected_shard_count == 3
    assert attestation.config_sha256 == sha256(model / "config.json")
    shards = sorted(path.name for path in model.glob("*.safetensors"))
    assert [(shard.path, shard.sha256) for shard in attestation.shards] == [
        (name, sha256(model / name)) for name in shards
    ]


def test_a_shard_list_mismatch_names_the_first_three_of_each_side(tmp_path: Path) -> None:
    from attest.documents import ShardDigest
    from launcher.checkpoint import _verify_shard_digests
    from launcher.errors import LauncherError

    listed = [ShardDigest(path=f"listed-{n}.safetensors", size=1, sha256="0" * 64) for n in range(5)]
    indexed = {f"indexed-{n}.safetensors": tmp_path / f"indexed-{n}" for n in range(4)}
    with pytest.raises(LauncherError) as refusal:
        _verify_shard_digests(listed, indexed, 0)
    assert refusal.value.field == "checkpoint attestation.shards"
    assert str(refusal.value).endswith(
        "must list each indexed shard once (unlisted: ['indexed-0.safetensors', 'indexed-1.safetensors', "
        "'indexed-2.safetensors'], not indexed: ['listed-0.safetensors', 'listed-1.safetensors', "
        "'listed-2.safetensors'])"
    )


@pytest.mark.parametrize("argument", [True, False], ids=["argument", "variable"])
def test_attestation_builder_names_the_argument_or_model_path(tmp_path: Path, capsys, argument: bool) -> None:
    from launcher import build_attestation

    missing = str(tmp_path / "no-such-checkpoint")
    environment = {name: value for name, value in os.environ.items() if name != "MODEL_PATH"}
    if not argument:
        environment["MODEL_PATH"] = missing
    with mock.patch.dict(os.environ, environment, clear=True):
        assert (
            build_attestation.main(
                [missing, "--revision", TARGET_REVISION] if argument else ["--revision", TARGET_REVISION]
            )
            == 2
        )
    refusal = json.loads(capsys.readouterr().err)
    assert refusal["field"] == ("MODEL_PATH argument" if argument else "MODEL_PATH")


def test_attestation_builder_writes_to_output_and_leaves_the_checkpoint_alone(
    world: LauncherWorld, tmp_path: Path, capsys
) -> None:
    from launcher import build_attestation

    before = (world.model / ".omni-checkpoint.json").read_bytes()
    output = tmp_path / "elsewhere.json"
    assert build_attestation.main([str(world.model), "--revision", TARGET_REVISION, "--output", str(output)]) == 0
    assert capsys.readouterr().out.strip() == hashlib.sha256(output.read_bytes()).hexdigest()
    assert (world.model / ".omni-checkpoint.json").read_bytes() == before
    output.write_text('{"something": "else"}')  # not an attestation: never overwritten
    assert build_attestation.main([str(world.model), "--revision", TARGET_REVISION, "--output", str(output)]) == 2
    assert json.loads(capsys.readouterr().err)["field"] == "--output"
    assert output.read_text() == '{"something": "else"}'


# --- vendor tools (launcher.hardware) --------------------------------------------------
def test_a_vendor_tool_is_found_on_path_or_at_its_fixed_location(tmp_path: Path, monkeypatch) -> None:
    from launcher import hardware

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    fallback = make_script(tmp_path / "opt", "rocminfo", "echo gfx942")
    assert hardware._tool("rocminfo", str(fallback)) == str(fallback)
    assert hardware._tool("rocminfo", str(tmp_path / "opt")) is None  # a directory is not the tool
    assert hardware._tool("rocminfo", str(tmp_path / "missing")) is None
    on_path = make_script(tmp_path / "bin", "rocminfo", "echo gfx90a")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert hardware._tool("rocminfo", str(fallback)) == str(on_path)  # PATH first


@pytest.mark.parametrize(
    "end, found", [(8_000_000, ("gfx942",)), (8_000_001, ("gfx94",))], ids=["ends at the limit", "one past the limit"]
)
def test_a_vendor_report_is_read_up_to_eight_million_characters(
    tmp_path: Path, monkeypatch, end: int, found: tuple
) -> None:
    from launcher import hardware

    # stdout + "\n" + stderr is what is read; "gfx942" ends at character `end`.
    padding = end - len("gfx942")
    make_script(tmp_path / "bin", "rocminfo", f"head -c {padding} /dev/zero | tr '\\0' ' '; echo gfx942")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert hardware.detect_rocm_architectures() == found


def test_a_hung_vendor_tool_is_given_eight_seconds_then_means_nothing_found(tmp_path: Path, monkeypatch) -> None:
    from launcher import hardware

    make_script(tmp_path / "bin", "rocminfo", "exec sleep 60")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    seen = recorded_timeouts(monkeypatch, "run")  # the same path, without waiting 8 s
    assert hardware.detect_rocm_architectures() == ()
    assert seen == [8]


def test_rocminfo_sees_the_first_device_unless_told_otherwise(tmp_path: Path, monkeypatch) -> None:
    from launcher import hardware

    make_script(tmp_path / "bin", "rocminfo", 'echo "gfx${ROCR_VISIBLE_DEVICES}42 GFX90A gfx90a"')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    assert hardware.detect_rocm_architectures() == ("gfx042", "gfx90a")
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "9")
    assert hardware.detect_rocm_architectures() == ("gfx90a", "gfx942")


def test_nvidia_smi_lines_need_a_name_and_a_compute_capability(tmp_path: Path, monkeypatch) -> None:
    from launcher import hardware

    make_fake_tool(
        tmp_path / "bin",
        "nvidia-smi",
        "\n".join(
            ["NVIDIA GB10, 12.1", ", 9.0", "NVIDIA A100, 8.0, extra", "NVIDIA H100, N/A", "NVIDIA H200,9.0", "garbage"]
        ),
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert hardware.detect_nvidia_gpus() == (
        {"name": "NVIDIA GB10", "compute_capability": "12.1"},
        {"name": "NVIDIA H200", "compute_capability": "9.0"},
    )
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    if not Path("/usr/bin/nvidia-smi").exists():
        assert hardware.detect_nvidia_gpus() == ()


def test_the_verdict_for_the_probes_is_written_only_when_vllm_is_about_to_start(
    world: LauncherWorld, tmp_path: Path
) -> None:
    from attest.edge.status import judge, read_status

    status = tmp_path / "run" / "omni-status.json"
    world.env["OMNI_STATUS_FILE"] = str(status)
    assert world.run("--inspect-only").code == 0 and not status.exists()  # never starts vLLM: no verdict
    result = world.run()
    assert result.code == 127 and result.exec_calls
    verdict = read_status(status)
    assert (verdict["program"], verdict["stage"], verdict["port"]) == ("launcher", "accepted", 8103)
    assert verdict["processes"][0][0] == os.getpid()  # the pid exec keeps: vLLM's
    assert judge(status, "live") == ""  # this process (vLLM after exec) runs
    assert judge(status, "ready").startswith("GET /health on port 8103")  # accepted, but no vLLM answers here
    world.env["MODEL_REVISION"] = "main"
    assert world.run().code == 2
    refused = read_status(status)
    assert refused["stage"] == "refused" and "MODEL_REVISION" in refused["reason"]
    assert "sk-test-secret-key-123" not in status.read_text()
    assert judge(status, "live").startswith("launcher is refused: MODEL_REVISION")


def test_an_unwritable_status_file_is_refused_before_any_check(world: LauncherWorld, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    world.env["OMNI_STATUS_FILE"] = str(tmp_path / "file" / "status.json")
    result = world.run()
    assert result.code == 2 and not result.exec_calls
    assert json.loads(result.stderr.strip().splitlines()[-1])["field"] == "OMNI_STATUS_FILE"
