"""Image pin documents (images/<image>.pins.json) and the file baked from them into every
image (/etc/omni/image.json), with the start-up checks both the launcher and boot run.

A pin may be empty in a development build (never invented); a release build refuses
any empty pin, naming it. At start, every pinned value is compared with what is really
there, and a difference refuses the start naming the pin and both values.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from attest.documents import Document, load_document
from attest.engine import InstalledDistribution, commit_matches
from attest.errors import AttestError
from attest.primitives import REVISION_RE
from attest.profile import ProfileName

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def _optional(pattern: re.Pattern[str], what: str):
    def check(value: str) -> str:
        if value and not pattern.fullmatch(value):
            raise ValueError(f"must be empty (not pinned yet) or {what}")
        return value.lower()

    return AfterValidator(check)


OptionalRevision = Annotated[str, _optional(REVISION_RE, "a full 40-hex commit")]
OptionalDigest = Annotated[str, _optional(DIGEST_RE, "sha256:<64 hex>")]
OptionalSha256 = Annotated[str, _optional(re.compile(r"^[0-9a-fA-F]{64}$"), "a 64-hex sha256")]


# A tag or hub ref `tools/pin` follows: printable ASCII without spaces, as registries and the
# hub spell them (refs/pr/1 has slashes).
OptionalRef = Annotated[str, Field(max_length=128, pattern=r"^[A-Za-z0-9_.\-/]*$")]


class BasePin(Document):
    image: str = Field(min_length=1)
    # The tag `tools/pin` resolved the digest from ("" : only by `--base-tag`).
    tag: OptionalRef = ""
    digest: OptionalDigest
    platform: Literal["linux/amd64", "linux/arm64"]
    # The sha256 of images/IMAGE.base-contents.json (attest.base_contents): the base's packages,
    # recorded by `tools/pin` with the digest; a release's SBOM lists them.
    contents_sha256: OptionalSha256 = ""


class EnginePin(Document):
    """The engine by commit and/or by its canonical RECORD digest (attest.record): PyPI wheels
    often record no commit or only an abbreviated one, and the RECORD names every file exactly."""

    name: Literal["vllm", "sglang"]
    repository: str = Field(min_length=1)
    commit: OptionalRevision
    record_sha256: OptionalSha256 = ""
    # Only where the engine cannot run otherwise: the image then runs as root and its labels say why.
    needs_root: bool = False


class ArtifactPin(Document):
    """The model as an OCI artifact (tools/model): the plain image manifest that image volumes
    mount. `tools/pin` fills the digest from the tag, refusing an artifact whose lock is not
    the pinned one."""

    # REGISTRY/REPO, as Omni's reference grammar reads it (checked where it is used).
    repository: str = Field(min_length=1, max_length=255, pattern=r"^[a-z0-9][a-z0-9._:/-]*$")
    tag: OptionalRef = ""
    digest: OptionalDigest = ""


class ModelSignaturePin(Document):
    """A publisher's OpenSSF Model Signing signature that `tools/pin --model-signature` verified
    and found to name exactly the lock's files (docs/models.md#a-publishers-signature)."""

    # key:<hex sha256 of the signer's PEM public key> (the OMS key method's hint), or
    # cert:<hex sha256 of the signing certificate's DER> (the certificate method).
    signer: str = Field(pattern=r"^(key|cert):[0-9a-f]{64}$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # the signature file's own bytes
    # The certificate method: who the signing certificate names (its subject, SAN e-mails, URIs).
    identity: str = Field(default="", max_length=1024)


class ModelPin(Document):
    id: str = Field(min_length=1)
    # The hub branch or tag `tools/pin` resolved the revision from ("": main).
    ref: OptionalRef = ""
    revision: OptionalRevision
    # The checkpoint lock's sha256 (images whose start-up downloads the checkpoint, boot);
    # None where the image verifies an attestation instead (the launcher).
    lock_sha256: OptionalSha256 | None = None
    # Where the model is also published as a signed OCI artifact (docs/models.md); None: it is not.
    artifact: ArtifactPin | None = None
    # The publisher's model signature the lock was checked against; None: none was.
    signature: ModelSignaturePin | None = None


class HardwarePin(Document):
    # cpu_x86_64: the test-only CPU image of the engine lane (//images:qwen_cpu_tiny).
    profile: Literal["mi300x_single", "dgx_spark_x3", "cpu_x86_64"]
    gpu_arch: str

    @field_validator("gpu_arch")
    @classmethod
    def _gpu_arch_for_gpus(cls, value: str, info: ValidationInfo) -> str:
        profile = info.data.get("profile")
        if profile is not None and (profile == "cpu_x86_64") != (not value):
            raise ValueError(
                f"must be empty for the CPU profile and at least 1 character for a GPU profile (profile {profile})"
            )
        return value


class ImagePins(Document):
    schema_version: Literal["1"]
    image: str = Field(min_length=1)
    # The launcher's target profile (launcher/profiles/<name>.json); None for images without the launcher.
    target_profile: ProfileName | None = None
    base: BasePin
    engine: EnginePin
    model: ModelPin
    speculator: ModelPin | None
    hardware: HardwarePin

    def empty_pins(self) -> list[str]:
        """The pins a release build needs and this document leaves empty."""
        empty = [
            name
            for name, value in (
                ("base.digest", self.base.digest),
                ("base.contents_sha256", self.base.contents_sha256),
                ("engine.commit or engine.record_sha256", self.engine.commit or self.engine.record_sha256),
                ("model.revision", self.model.revision),
            )
            if not value
        ]
        if self.model.lock_sha256 == "":
            empty.append("model.lock_sha256")
        if self.model.artifact is not None and not self.model.artifact.digest:
            empty.append("model.artifact.digest")
        if self.speculator is not None and not self.speculator.revision:
            empty.append("speculator.revision")
        return empty


class RuntimeContract(Document):
    """Who the image runs as and what it writes: the user (uid:gid), the supplementary groups
    a deployment must add, the declared volumes and the variables that point at them."""

    user: str
    root_because: str = ""
    groups: list[str] = []
    volumes: list[str] = []
    writable_env: dict[str, str] = {}


class BakedImage(Document):
    """/etc/omni/image.json: the pins, the layers built before this file, the toolkit, and
    the runtime contract."""

    schema_version: Literal["1"]
    toolkit_version: str
    image: str
    pins: ImagePins
    base_digest: str
    layers: list[str]
    runtime: RuntimeContract | None = None


def release_refusal(empty: list[str], source: str) -> AttestError:
    """What a release build (and anything else that needs every pin) says about empty pins."""
    one = len(empty) == 1
    return AttestError(
        f"release build refused: {', '.join(empty)} {'is' if one else 'are'} empty in {source}; "
        f"fill {'it' if one else 'them'} with the real value (a digest or full commit); Omni never "
        "invents one",
        field=empty[0],
    )


def load_pins(path: Path) -> ImagePins:
    return load_document(ImagePins, path, label=path.name)


def mismatch(pin: str, pinned: str, actual: str, what: str) -> AttestError:
    return AttestError(
        f"{what} differs from the image pin {pin}: pinned {pinned}, found {actual or 'nothing'}", field=pin
    )


def check_engine_identity(baked: BakedImage, engine: str, installed: InstalledDistribution | None) -> list[str]:
    """Refuse unless the installed engine is the pinned one: its RECORD digest and/or commit
    (an abbreviated commit matches by prefix, and the note says so), and, whenever either is
    pinned, every installed file matches its RECORD."""
    pins = baked.pins
    if pins.engine.name != engine:
        raise mismatch("engine.name", pins.engine.name, engine, "the engine this program starts")
    if not pins.engine.commit and not pins.engine.record_sha256:
        return [
            f"engine.commit and engine.record_sha256 not pinned in this development image: "
            f"{engine} identity not checked"
        ]
    if installed is None:
        raise AttestError(f"the pinned engine {engine} is not installed", field="engine.name")
    notes = []
    if pins.engine.record_sha256:
        if installed.record_sha256 != pins.engine.record_sha256:
            raise mismatch(
                "engine.record_sha256",
                pins.engine.record_sha256,
                installed.record_sha256,
                f"the installed {installed.name} {installed.version} RECORD digest",
            )
        notes.append(f"engine.record_sha256 matches the installed {installed.name} {installed.version}")
    if pins.engine.commit:
        matches, how = commit_matches(pins.engine.commit, installed)
        if not matches:
            found = f"{installed.commit} ({how})" if installed.commit else how
            raise mismatch("engine.commit", pins.engine.commit, found, f"the installed {engine} commit")
        notes.append(f"engine.commit {pins.engine.commit} matches the installed {engine} ({how})")
    check = installed.verify_files()
    notes.append(f"{check.files} installed {installed.name} files ({check.bytes} bytes) match its RECORD")
    return notes


def check_model_revision(baked: BakedImage, revision: str, source: str) -> str:
    pinned = baked.pins.model.revision
    if not pinned:
        return "model.revision not pinned in this development image: not checked"
    if revision.lower() != pinned:
        raise mismatch("model.revision", pinned, revision, source)
    return f"model.revision {pinned} matches {source}"
