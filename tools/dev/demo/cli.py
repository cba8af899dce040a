"""Everything the no-GPU quick start needs, made under DIR (README: "Quick start without a GPU").

    bazel run //tools/dev/demo -- DIR [--rootfs ROOTFS] [--registry-port PORT] [--force]

DIR receives:
  models/qwen/                 a synthetic checkpoint shaped exactly like Qwen3.8-27B (tiny
                               shards of a few bytes: nothing can be served from it) and its
                               .omni-checkpoint.json, made by launcher.build_attestation
  engine/dist-packages/        a FAKE vLLM distribution: the files the launcher's probe reads
                               (it serves nothing; importing it fails on purpose)
  launcher.env                 the launcher's settings for them, one VAR=value per line
  signing.key, signing.pub     an ECDSA P-256 key pair for signed pushes and `verify`
  registry.yml                 a docker-registry configuration on 127.0.0.1:PORT (default 5000)
With --rootfs, the checkpoint and the fake engine are also copied into an unpacked image's
root file system (models/qwen, usr/local/lib/python3.11/dist-packages).

DIR must be empty or absent, or hold an earlier demo (then --force replaces it); nothing
else is ever deleted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shutil
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attest.documents import CHECKPOINT_ATTESTATION_FILE
from attest.files import canonical_json, write_atomic
from launcher.checkpoint import build_checkpoint_attestation
from launcher.target import DEFAULT_PROFILE, load_target_profile
from tests.fixtures.qwen import TARGET_REVISION, make_checkpoint, make_fake_vllm

MARKER = ".omni-demo"
IMAGE_MODEL_PATH = "/models/qwen"
IMAGE_ENGINE_SITE = "usr/local/lib/python3.11/dist-packages"


class DemoError(Exception):
    pass


def _prepare_dir(target: Path, force: bool) -> Path:
    if target.exists() and not target.is_dir():
        raise DemoError(f"{target} exists and is not a directory; choose another DIR")
    if target.is_dir() and any(target.iterdir()):
        if not (target / MARKER).is_file():
            raise DemoError(
                f"{target} is not empty and holds no earlier demo ({MARKER}); nothing was changed. "
                "Choose an empty or new DIR"
            )
        if not force:
            raise DemoError(f"{target} holds an earlier demo; add --force to replace it")
    staged = target.with_name(target.name + ".partial")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    return staged


def _write_keys(directory: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    (directory / "signing.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    os.chmod(directory / "signing.key", 0o600)
    (directory / "signing.pub").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _make_demo(target: Path, *, rootfs: Path | None, registry_port: int, force: bool) -> dict[str, str]:
    staged = _prepare_dir(target, force)
    model = staged / "models" / "qwen"
    make_checkpoint(model, shards=2, mtp=True)
    model_id = load_target_profile(DEFAULT_PROFILE).model_id
    attestation = build_checkpoint_attestation(model, model_id=model_id, revision=TARGET_REVISION, hash_shards=True)
    data = canonical_json(attestation.model_dump(mode="json", exclude_none=True))
    write_atomic(model / CHECKPOINT_ATTESTATION_FILE, data)
    engine = staged / "engine" / "dist-packages"
    make_fake_vllm(engine)
    settings = {
        "MODEL_PATH": IMAGE_MODEL_PATH,
        "MODEL_ID": model_id,
        "MODEL_REVISION": TARGET_REVISION,
        "QWEN_CHECKPOINT_MANIFEST_SHA256": hashlib.sha256(data).hexdigest(),
        "QWEN_API_KEY": "demo-" + secrets.token_hex(16),
    }
    (staged / "launcher.env").write_text("".join(f"{k}={v}\n" for k, v in settings.items()), encoding="utf-8")
    os.chmod(staged / "launcher.env", 0o600)
    _write_keys(staged)
    (staged / "registry.yml").write_text(
        f"""version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: {target.resolve() / "registry-storage"}
http:
  addr: 127.0.0.1:{registry_port}
""",
        encoding="utf-8",
    )
    (staged / MARKER).write_text("made by bazel run //tools/dev/demo\n", encoding="utf-8")
    if target.exists():
        shutil.rmtree(target)
    staged.rename(target)
    if rootfs is not None:
        _place_in_rootfs(target, rootfs)
    return settings


def _place_in_rootfs(demo: Path, rootfs: Path) -> None:
    if not (rootfs / "opt" / "omni" / "bin" / "omni-run").is_file():
        raise DemoError(
            f"{rootfs} is not an unpacked Omni image root (no opt/omni/bin/omni-run); unpack it with "
            "`umoci unpack --rootless --image LAYOUT:latest BUNDLE` and pass BUNDLE/rootfs"
        )
    model = rootfs / IMAGE_MODEL_PATH.lstrip("/")
    if model.exists() and any(model.iterdir()) and not (model / CHECKPOINT_ATTESTATION_FILE).is_file():
        raise DemoError(f"{model} already holds files that are not a demo checkpoint; nothing was changed")
    shutil.rmtree(model, ignore_errors=True)
    shutil.copytree(demo / "models" / "qwen", model)
    shutil.copytree(demo / "engine" / "dist-packages", rootfs / IMAGE_ENGINE_SITE, dirs_exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="demo",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", type=Path, help="where to write the demo (relative: to where `bazel run` started)")
    parser.add_argument("--rootfs", type=Path, help="an unpacked image's rootfs to place the checkpoint and engine in")
    parser.add_argument("--registry-port", type=int, default=5000)
    parser.add_argument("--force", action="store_true", help="replace an earlier demo in DIR")
    args = parser.parse_args(argv)
    base = Path(os.environ.get("BUILD_WORKING_DIRECTORY", "."))
    target = base / args.dir
    rootfs = base / args.rootfs if args.rootfs else None
    try:
        settings = _make_demo(target, rootfs=rootfs, registry_port=args.registry_port, force=args.force)
    except (DemoError, OSError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    print(
        f"demo: wrote {target.resolve()}: synthetic checkpoint (attestation pinned by "
        f"QWEN_CHECKPOINT_MANIFEST_SHA256={settings['QWEN_CHECKPOINT_MANIFEST_SHA256']}), FAKE vLLM for the probe, "
        f"launcher.env, signing.key/signing.pub, registry.yml" + (f"; placed in {rootfs}" if rootfs else ""),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
