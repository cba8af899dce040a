"""Assemble an OCI image layout from a base, layers and a config spec.

    python -m tools.oci.build.image --output DIR --config-spec SPEC.json \
        [--base DIR] --layer DESCRIPTOR.json=BLOB.tar.gz ...

--base is either a shallow base (manifest.json, config.json, base.json: only the base's
manifest and config were fetched; its layers are referenced by descriptor, never copied)
or another image's OCI layout (a locally built base: its blobs are linked in, so the
result is complete). Without --base the image starts from scratch (SPEC names os and
architecture). Timestamps come from SOURCE_DATE_EPOCH (default 0).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from attest.errors import AttestError
from omni_oci.format.errors import OciError
from omni_oci.format.image_contract import (
    BAKED_LOCK_PATH,
    BAKED_PATH,
    GROUPS_LABEL,
    ROOT_LABEL,
    USER_LABEL,
    VOLUMES_LABEL,
    WRITABLE_VARIABLES,
    pin_labels,
)
from omni_oci.format.layout import (
    BASE_SIDECAR,
    LAYER_TYPE_TO_OCI,
    OCI_CONFIG,
    OCI_MANIFEST,
    TITLE,
    blob_path,
    canonical,
    descriptor,
    link_blob,
    read_blob,
    read_layout,
    sha256_digest,
    write_blob,
    write_layout,
)
from omni_oci.format.statement import TOOLKIT_VERSION
from tools.oci.build.layer import source_date_epoch

CONFIG_KEYS = (
    "entrypoint",
    "cmd",
    "env",
    "workdir",
    "user",
    "volumes",
    "exposed_ports",
    "labels",
    "annotations",
    "os",
    "architecture",
    "variant",
    "layer_names",
)


def _rfc3339(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _load_base(base: Path | None) -> dict[str, Any]:
    """{"manifest", "config", "source", "layout"}: what the new image builds on."""
    if base is None:
        return {"manifest": {"layers": []}, "config": {}, "source": None, "layout": None}
    if (base / "index.json").is_file():
        digest, manifest, _ = read_layout(base)
        config = json.loads(read_blob(base, manifest["config"]["digest"]))
        source = None
        if (base / BASE_SIDECAR).is_file():
            source = json.loads((base / BASE_SIDECAR).read_text())
        return {"manifest": manifest, "config": config, "source": source, "layout": base, "digest": digest}
    try:
        manifest_bytes = (base / "manifest.json").read_bytes()
        config_bytes = (base / "config.json").read_bytes()
        source = json.loads((base / "base.json").read_text())
    except OSError as exc:
        raise OciError(f"shallow base {base} is incomplete: {exc}", field=str(base)) from None
    manifest = json.loads(manifest_bytes)
    if sha256_digest(manifest_bytes) != source["manifest_digest"]:
        raise OciError(f"shallow base manifest does not match its digest {source['manifest_digest']}", field="manifest")
    if sha256_digest(config_bytes) != manifest["config"]["digest"]:
        raise OciError("shallow base config does not match the digest its manifest names", field="config")
    return {
        "manifest": manifest,
        "config": json.loads(config_bytes),
        "source": source,
        "layout": None,
        "digest": source["digest"],
    }


def _platform(base_config: dict[str, Any], spec: dict[str, Any]) -> dict[str, str]:
    """os, architecture and variant: the base's, which `spec` may only repeat (an image never
    claims a platform its base's binaries are not for); `spec`'s own for an image without a base."""
    platform = {}
    for key in ("os", "architecture", "variant"):
        inherited, given = base_config.get(key), spec.get(key)
        if inherited and given and given != inherited:
            raise OciError(
                f"{key} {given!r} differs from the base's {inherited!r}: the base's binaries are for "
                f"{base_config.get('os')}/{base_config.get('architecture')}; build on a base of that "
                "platform instead",
                field=key,
            )
        if inherited or given:
            platform[key] = inherited or given
    return platform


def _build_config(
    base_config: dict[str, Any], spec: dict[str, Any], layers: list[dict[str, Any]], created: str
) -> dict[str, Any]:
    platform = _platform(base_config, spec)
    inherited = base_config.get("config") or {}
    env = {}
    for item in inherited.get("Env") or []:
        key, _, value = item.partition("=")
        env[key] = value
    env.update(spec.get("env") or {})
    runtime: dict[str, Any] = {k: v for k, v in inherited.items() if k not in ("Env", "Labels")}
    runtime["Env"] = [f"{k}={v}" for k, v in env.items()]
    labels = {**(inherited.get("Labels") or {}), **(spec.get("labels") or {})}
    if labels:
        runtime["Labels"] = dict(sorted(labels.items()))
    if "entrypoint" in spec:
        runtime["Entrypoint"] = list(spec["entrypoint"])
        runtime.pop("Cmd", None)  # a new entrypoint never inherits the base's arguments
    if "cmd" in spec:
        runtime["Cmd"] = list(spec["cmd"])
    if "workdir" in spec:
        runtime["WorkingDir"] = spec["workdir"]
    if "user" in spec:
        runtime["User"] = spec["user"]
    if spec.get("volumes"):
        runtime["Volumes"] = {**(inherited.get("Volumes") or {}), **{str(v): {} for v in spec["volumes"]}}
    if spec.get("exposed_ports"):
        runtime["ExposedPorts"] = {
            **(inherited.get("ExposedPorts") or {}),
            **{str(p): {} for p in spec["exposed_ports"]},
        }
    names = spec.get("layer_names") or [f"layer {i}" for i in range(len(layers))]
    return {
        "architecture": platform.get("architecture"),
        "os": platform.get("os"),
        **({"variant": platform["variant"]} if "variant" in platform else {}),
        "created": created,
        "config": runtime,
        "rootfs": {
            "type": "layers",
            "diff_ids": list((base_config.get("rootfs") or {}).get("diff_ids") or [])
            + [layer["diff_id"] for layer in layers],
        },
        "history": list(base_config.get("history") or [])
        + [{"created": created, "created_by": f"omni: {name}"} for name in names],
    }


def load_pins_checked(path: Path, release: bool) -> dict[str, Any]:
    from attest.pins import load_pins, release_refusal

    pins = load_pins(path)
    empty = pins.empty_pins()
    if release and empty:
        raise release_refusal(empty, path.name)
    return pins.model_dump(mode="json")


def _runtime_contract(spec: dict[str, Any], pins: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Who the image runs as and where it writes, from its own config spec: the spec (with
    User forced to root only where the pin document says the engine needs it) and the
    contract recorded in labels and /etc/omni/image.json."""
    needs_root = bool(pins["engine"].get("needs_root"))
    user = "0:0" if needs_root else spec.get("user", "")
    if not needs_root and user.split(":")[0] in ("", "0", "root"):
        raise OciError(
            f"{pins['image']}: the image would run as root (user {user!r}); set a non-root user, or "
            "declare engine.needs_root in the pin document",
            field="user",
        )
    env = spec.get("env") or {}
    contract = {
        "user": user,
        "root_because": "engine.needs_root in the pin document" if needs_root else "",
        "groups": [g for g in (spec.get("labels") or {}).get(GROUPS_LABEL, "").split(",") if g],
        "volumes": sorted(spec.get("volumes") or []),
        "writable_env": {name: env[name] for name in WRITABLE_VARIABLES if name in env},
    }
    labels = {
        USER_LABEL: user,
        VOLUMES_LABEL: ",".join(contract["volumes"]),
        **({ROOT_LABEL: contract["root_because"]} if needs_root else {}),
    }
    return {**spec, "user": user, "labels": {**(spec.get("labels") or {}), **labels}}, contract


def checked_lock(path: Path | None, pins: dict[str, Any]) -> bytes | None:
    """The checkpoint lock's bytes, which must have the sha256 the pin document names."""
    pinned = pins["model"].get("lock_sha256")
    if path is None:
        if pinned:
            raise OciError(
                f"{pins['image']}: model.lock_sha256 is pinned ({pinned}) but no checkpoint lock is "
                f"given; commit it as images/{pins['image']}.checkpoint.lock.json",
                field="checkpoint_lock",
            )
        return None
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if pinned is None or actual != pinned:
        raise OciError(
            f"{path.name} has sha256 {actual}; model.lock_sha256 pins {pinned or 'nothing'}: pin it after review",
            field="model.lock_sha256",
        )
    return data


def _baked_layer(
    output: Path,
    pins: dict[str, Any],
    base_digest: str,
    layer_digests: list[str],
    checkpoint_lock: bytes | None = None,
    runtime: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Path]:
    from tools.oci.build.layer import write_layer

    baked = {
        "schema_version": "1",
        "toolkit_version": TOOLKIT_VERSION,
        "image": pins["image"],
        "pins": pins,
        "base_digest": base_digest,
        "layers": layer_digests,
        **({"runtime": runtime} if runtime else {}),
    }
    data = json.dumps(baked, indent=2, sort_keys=True).encode() + b"\n"
    entries = [{"dest": BAKED_PATH, "data": data, "mode": 0o644}]
    if checkpoint_lock is not None:
        entries.append({"dest": BAKED_LOCK_PATH, "data": checkpoint_lock, "mode": 0o644})
    blob = output / "baked-image-json.tar.gz"
    desc = write_layer(entries, blob, mtime=source_date_epoch())
    return desc, blob


def _with_baked_layer(
    output: Path,
    spec: dict[str, Any],
    layers: list[tuple[dict[str, Any], Path]],
    base: dict[str, Any],
    pins: dict[str, Any],
    checkpoint_lock: bytes | None,
) -> dict[str, Any]:
    """The spec with the pins' labels and runtime contract; the baked layer (the pins, the layers
    built before it, the lock) appended to `layers`."""
    spec, runtime = _runtime_contract(spec, pins)
    spec = {
        **spec,
        "labels": {**(spec.get("labels") or {}), **pin_labels(pins)},
        "layer_names": [*(spec.get("layer_names") or [f"layer {i}" for i in range(len(layers))]), BAKED_PATH],
    }
    built = [layer["digest"] for layer in base["manifest"]["layers"]] + [desc["digest"] for desc, _ in layers]
    output.mkdir(parents=True, exist_ok=True)
    layers.append(_baked_layer(output, pins, base.get("digest", ""), built, checkpoint_lock, runtime))
    return spec


def _link_blobs(
    output: Path, base: dict[str, Any], base_layers: list[dict[str, Any]], layers: list[tuple[dict[str, Any], Path]]
) -> None:
    """Every layer's blob into the layout: the base's (when it is a local layout) and ours."""
    if base["layout"] is not None:
        for layer in base_layers:
            link_blob(output, blob_path(base["layout"], layer["digest"]), layer["digest"])
    for desc, blob in layers:
        if not blob.is_file():
            raise OciError(f"layer blob {blob} is missing", field=str(blob))
        link_blob(output, blob, desc["digest"])


def assemble(
    output: Path,
    spec: dict[str, Any],
    layers: list[tuple[dict[str, Any], Path]],
    base_dir: Path | None,
    pins: dict[str, Any] | None = None,
    checkpoint_lock: bytes | None = None,
) -> dict[str, Any]:
    unknown = sorted(set(spec) - set(CONFIG_KEYS))
    if unknown:
        raise OciError(f"unknown image config keys: {unknown}", field="config")
    base = _load_base(base_dir)
    created = _rfc3339(source_date_epoch())
    layers = list(layers)
    if pins is not None:
        spec = _with_baked_layer(output, spec, layers, base, pins, checkpoint_lock)
    descriptors = [desc for desc, _ in layers]
    config = _build_config(base["config"], spec, descriptors, created)
    if not config.get("os") or not config.get("architecture"):
        raise OciError("the image has no os/architecture: name them, or build on a base", field="platform")
    config_bytes = canonical(config)
    output.mkdir(parents=True, exist_ok=True)
    write_blob(output, config_bytes)
    base_layers = [
        {
            "mediaType": LAYER_TYPE_TO_OCI.get(layer["mediaType"], layer["mediaType"]),
            "digest": layer["digest"],
            "size": layer["size"],
        }
        for layer in base["manifest"]["layers"]
    ]
    _link_blobs(output, base, base_layers, layers)
    annotations = {"org.opencontainers.image.created": created, **(spec.get("annotations") or {})}
    if base.get("digest"):
        annotations["org.opencontainers.image.base.digest"] = base["digest"]
        if base["source"] and base["source"].get("image"):
            annotations["org.opencontainers.image.base.name"] = base["source"]["image"]
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": descriptor(OCI_CONFIG, config_bytes),
        "layers": base_layers
        + [{"mediaType": d["mediaType"], "digest": d["digest"], "size": d["size"]} for d in descriptors],
        "annotations": dict(sorted(annotations.items())),
    }
    if pins is not None:
        manifest["layers"][-1]["annotations"] = {TITLE: BAKED_PATH}
        (output / "baked-image-json.tar.gz").unlink()  # linked into blobs/ above
    manifest_bytes = canonical(manifest)
    digest = write_layout(output, manifest_bytes)
    shallow = base["layout"] is None and base["source"] is not None
    if base["source"] is not None:
        sidecar = dict(base["source"])
        sidecar["shallow_layers"] = (
            [layer["digest"] for layer in base_layers] if shallow else list(base["source"].get("shallow_layers") or [])
        )
        (output / BASE_SIDECAR).write_bytes(canonical(sidecar))
    return {"digest": digest, "manifest": manifest, "config": config}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="image", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--config-spec", type=Path, required=True)
    parser.add_argument("--base", type=Path)
    parser.add_argument("--layer", action="append", default=[], help="DESCRIPTOR.json=BLOB")
    parser.add_argument("--digest-file", type=Path, help="also write the manifest digest here")
    parser.add_argument("--pins", type=Path, help="the image's pin document: labels and /etc/omni/image.json")
    parser.add_argument("--release", action="store_true", help="refuse empty pins")
    parser.add_argument("--checkpoint-lock", type=Path, help=f"baked at {BAKED_LOCK_PATH}; must match the pin")
    args = parser.parse_args(argv)
    try:
        layers = []
        for item in args.layer:
            desc_path, _, blob = item.partition("=")
            layers.append((json.loads(Path(desc_path).read_text()), Path(blob)))
        pins = load_pins_checked(args.pins, args.release) if args.pins else None
        lock = checked_lock(args.checkpoint_lock, pins) if pins else None
        result = assemble(args.output, json.loads(args.config_spec.read_text()), layers, args.base, pins, lock)
    except AttestError as exc:  # OciError and the pins' refusals alike
        print(f"image: {exc}", file=sys.stderr)
        return 2
    if args.digest_file:
        args.digest_file.write_text(result["digest"] + "\n")
    return 0


if __name__ == "__main__":
    from tools.oci.build.worker import run  # a persistent worker under Bazel, a command line otherwise

    raise SystemExit(run(main))
