"""What a deployment needs to know about an image, read from the image itself (its OCI layout):
the digest, the config (user, variables, volumes, ports, labels) and the pin document baked
at /etc/omni/image.json. Nothing here is typed twice: the manifests are generated from it."""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attest.documents import parse_document
from attest.errors import AttestError
from attest.pins import BakedImage
from omni_oci.format.errors import OciError
from omni_oci.format.image_contract import BAKED_MEMBER, BAKED_PATH, GROUPS_LABEL, ROOT_LABEL, TEST_ONLY_LABEL
from omni_oci.format.layout import TITLE, read_blob, read_layout
from omni_oci.format.tar_members import clean_name
from omni_oci.format.tar_reader import TarStream, read_members
from tools.deploy.errors import DeployError

# The baked layer holds two small documents; anything bigger is not ours.
MAX_BAKED_LAYER = 8 << 20


@dataclass(frozen=True)
class ImageContract:
    digest: str
    name: str
    uid: int
    gid: int
    groups: tuple[tuple[str, int], ...]
    env: dict[str, str]
    volumes: tuple[str, ...]
    ports: tuple[int, ...]
    labels: dict[str, str]
    baked: BakedImage
    entrypoint: tuple[str, ...] = ()


def _baked_layer(layout: Path, manifest: dict[str, Any]) -> bytes:
    layers = [
        layer for layer in manifest.get("layers") or [] if (layer.get("annotations") or {}).get(TITLE) == BAKED_PATH
    ]
    if not layers:
        raise DeployError(
            f"{layout} has no layer titled /{BAKED_MEMBER}: only an omni_image carries the pins and "
            "runtime contract the manifests are generated from",
            field=BAKED_MEMBER,
        )
    layer = layers[-1]  # an image built on another omni_image: its own document is the one that shows
    if int(layer.get("size", 0)) > MAX_BAKED_LAYER:
        raise DeployError(
            f"the /{BAKED_MEMBER} layer is {layer.get('size')} bytes (at most {MAX_BAKED_LAYER})", field=BAKED_MEMBER
        )
    found = None
    try:
        data = read_blob(layout, layer["digest"])
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as plain:
            for member, content in read_members(TarStream.of_file(plain), f"the /{BAKED_MEMBER} layer"):
                if clean_name(layout, member.name) == BAKED_MEMBER and member.kind == "file":
                    found = content.read(min(member.size, MAX_BAKED_LAYER))  # the last one wins, as unpacked
    except (OciError, OSError, EOFError) as exc:
        raise DeployError(f"cannot read /{BAKED_MEMBER} from {layout}: {exc}", field=BAKED_MEMBER) from None
    if found is None:
        raise DeployError(f"cannot read /{BAKED_MEMBER} from {layout}: the layer does not hold it", field=BAKED_MEMBER)
    return found


def _user(value: str) -> tuple[int, int]:
    uid, _, gid = value.partition(":")
    if not (uid.isascii() and uid.isdigit() and gid.isascii() and gid.isdigit()):
        raise DeployError(
            f"the image's user is {value!r}; Kubernetes runAsUser/runAsGroup need numeric uid:gid", field="config.User"
        )
    if int(uid) == 0:
        raise DeployError(
            "the image runs as root (uid 0); the manifests set runAsNonRoot and would never start it",
            field="config.User",
        )
    return int(uid), int(gid)


def _groups(text: str) -> tuple[tuple[str, int], ...]:
    groups = []
    for item in filter(None, text.split(",")):
        name, _, gid = item.partition(":")
        if not (gid.isascii() and gid.isdigit()):
            raise DeployError(f"label {GROUPS_LABEL} has {item!r}; expected name:gid", field=GROUPS_LABEL)
        groups.append((name, int(gid)))
    return tuple(groups)


def _ports(exposed: dict[str, Any]) -> tuple[int, ...]:
    ports = []
    for key in sorted(exposed):
        number, _, protocol = key.partition("/")
        if protocol not in ("", "tcp") or not (number.isascii() and number.isdigit()):
            raise DeployError(f"exposed port {key!r} is not a TCP port", field="config.ExposedPorts")
        ports.append(int(number))
    return tuple(ports)


def read_contract(layout: Path, *, test_image: bool = False) -> ImageContract:
    """The image's contract, refused when it cannot be deployed as Omni deploys images. An image
    labelled omni.test_only is refused unless `test_image` (--test-image: a local try-out)."""
    try:
        digest, manifest, _ = read_layout(layout)
        config = json.loads(read_blob(layout, manifest["config"]["digest"]))
    except (OciError, ValueError, KeyError, TypeError) as exc:
        raise DeployError(f"{layout} is not a readable image layout: {exc}", field=str(layout)) from None
    runtime = config.get("config") or {}
    labels = dict(runtime.get("Labels") or {})
    if TEST_ONLY_LABEL in labels and not test_image:
        raise DeployError(
            f"this image is labelled {TEST_ONLY_LABEL}: {labels[TEST_ONLY_LABEL]} (--test-image generates its "
            "manifests for a local try-out, e.g. with podman)",
            field=TEST_ONLY_LABEL,
        )
    if ROOT_LABEL in labels:
        raise DeployError(
            f"this image runs as root ({labels[ROOT_LABEL]}); the generated manifests run only non-root images",
            field="engine.needs_root",
        )
    try:
        baked = parse_document(BakedImage, json.loads(_baked_layer(layout, manifest)), label="/" + BAKED_MEMBER)
    except (AttestError, ValueError) as exc:
        raise DeployError(str(exc), field=getattr(exc, "field", "") or BAKED_MEMBER) from None
    env = dict(item.partition("=")[::2] for item in runtime.get("Env") or [])
    uid, gid = _user(runtime.get("User") or "")
    return ImageContract(
        digest=digest,
        name=baked.image,
        uid=uid,
        gid=gid,
        groups=_groups(labels.get(GROUPS_LABEL, "")),
        env=env,
        volumes=tuple(sorted(runtime.get("Volumes") or {})),
        ports=_ports(runtime.get("ExposedPorts") or {}),
        labels=labels,
        baked=baked,
        entrypoint=tuple(str(item) for item in runtime.get("Entrypoint") or ()),
    )
