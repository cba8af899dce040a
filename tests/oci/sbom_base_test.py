"""A release's SBOM lists the vendor base's packages (issue 69, point 1): the SBOM action merges
the contents file tools/pin recorded (images/IMAGE.base-contents.json) with the image's own
package lists, as SPDX and CycloneDX that the users' checkers accept; and it refuses, naming the
pin or the file, a contents file that is missing, not the pinned bytes, or about another base."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tools.oci.build.sbom import main as sbom

BASE_DIGEST = "sha256:" + "b" * 64
IMAGE_DIGEST = "sha256:" + "d" * 64
ZLIB_COPYRIGHT = ["Copyright 1995-2013 Jean-loup Gailly and Mark Adler"]


def _facts(**values: Any) -> dict[str, Any]:
    empty = {"license_expression": "", "license": "", "license_classifiers": [], "author": "", "copyright": []}
    return {**empty, "author_email": "", "maintainer": "", "maintainer_email": "", **values}


def _contents(**changes: Any) -> dict[str, Any]:
    document = {
        "schema_version": "1",
        "image": "qwen_cpu_tiny",
        "base": {"image": "localhost:5000/vendor/vllm-cpu", "digest": BASE_DIGEST, "platform": "linux/amd64"},
        "os": {"id": "ubuntu", "version_id": "22.04", "name": "Ubuntu"},
        "dpkg": [
            {
                "name": "zlib1g",
                "version": "1:1.2.11.dfsg-2ubuntu9.2",
                "architecture": "amd64",
                "database": "var/lib/dpkg/status",
                "licenses": ["Zlib"],
                "copyright": ZLIB_COPYRIGHT,
                "license_texts": {},
            },
            {
                "name": "libc6",
                "version": "2.35-0ubuntu3.8",
                "architecture": "amd64",
                "database": "var/lib/dpkg/status",
                "licenses": [],
                "copyright": [],
                "license_texts": {},
            },
        ],
        "python": [
            {
                "name": "torch",
                "version": "2.13.0+cpu",
                "path": "/usr/local/lib/python3.11/dist-packages/torch-2.13.0+cpu.dist-info",
                "record_sha256": "c" * 64,
                "facts": _facts(license_expression="BSD-3-Clause", author="PyTorch Team"),
            },
            {
                "name": "vendored-thing",
                "version": "0.1",
                "path": "/usr/local/lib/python3.11/dist-packages/vendored_thing-0.1.dist-info",
                "record_sha256": "",
                "facts": _facts(license="Proprietary-ish, see vendor"),  # maps to no SPDX id
            },
            {
                "name": "certifi",
                "version": "2026.1.1",
                "path": "/usr/local/lib/python3.11/dist-packages/certifi-2026.1.1.dist-info",
                "record_sha256": "e" * 64,
                "facts": _facts(license="MPL-2.0"),
            },
        ],
    }
    document.update(changes)
    return document


def _pins(contents_sha256: str, digest: str = BASE_DIGEST) -> dict[str, Any]:
    return {
        "schema_version": "1",
        "image": "qwen_cpu_tiny",
        "base": {
            "image": "localhost:5000/vendor/vllm-cpu",
            "digest": digest,
            "platform": "linux/amd64",
            "contents_sha256": contents_sha256,
        },
        "engine": {"name": "vllm", "repository": "https://github.com/vllm-project/vllm", "commit": ""},
        "model": {"id": "omni-test/Qwen3.5-tiny", "revision": "8" * 40},
        "speculator": None,
        "hardware": {"profile": "cpu_x86_64", "gpu_arch": ""},
    }


def _run(tmp_path: Path, contents: bytes | None, pins: dict[str, Any]) -> tuple[int, Path]:
    (tmp_path / "digest").write_text(IMAGE_DIGEST + "\n")
    # One of Omni's wheels, the same distribution as one the base installs (another file).
    wheel = {"name": "certifi", "version": "2026.1.1", "sha256": "f" * 64, "facts": _facts(license="MPL-2.0")}
    (tmp_path / "wheels.json").write_text(json.dumps([wheel]))
    (tmp_path / "qwen_cpu_tiny.pins.json").write_text(json.dumps(pins))
    args = ["--name", "qwen_cpu_tiny", "--digest-file", str(tmp_path / "digest"), "--output", str(tmp_path / "s.json")]
    args += ["--cyclonedx", str(tmp_path / "c.json"), "--spdx3", str(tmp_path / "s3.json")]
    args += ["--wheels", str(tmp_path / "wheels.json")]
    args += ["--vendor-base-pins", str(tmp_path / "qwen_cpu_tiny.pins.json")]
    if contents is not None:
        (tmp_path / "qwen_cpu_tiny.base-contents.json").write_bytes(contents)
        args += ["--base-contents", str(tmp_path / "qwen_cpu_tiny.base-contents.json")]
    return sbom(args), tmp_path / "s.json"


def _bytes(document: dict[str, Any]) -> bytes:
    return json.dumps(document, indent=2).encode()


def test_the_release_sbom_lists_the_vendor_base_and_the_checkers_accept_it(tmp_path: Path, capsys) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    from ntia_conformance_checker import SbomChecker
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    contents = _bytes(_contents())
    code, path = _run(tmp_path, contents, _pins(hashlib.sha256(contents).hexdigest()))
    assert code == 0, capsys.readouterr().err
    packages = {p["SPDXID"]: p for p in json.loads(path.read_text())["packages"]}
    zlib = packages["SPDXRef-deb-zlib1g-amd64"]
    assert zlib["versionInfo"] == "1:1.2.11.dfsg-2ubuntu9.2" and zlib["licenseConcluded"] == "Zlib"
    assert zlib["supplier"] == "Organization: Ubuntu" and zlib["copyrightText"] == ZLIB_COPYRIGHT[0]
    purl = zlib["externalRefs"][0]["referenceLocator"]
    assert purl == "pkg:deb/ubuntu/zlib1g@1%3A1.2.11.dfsg-2ubuntu9.2?arch=amd64&distro=ubuntu-22.04"
    assert "checksums" not in zlib and BASE_DIGEST in zlib["comment"]
    assert packages["SPDXRef-deb-libc6-amd64"]["licenseConcluded"] == "NOASSERTION"  # free-form copyright file
    torch = packages["SPDXRef-pypi-torch"]
    assert (torch["licenseConcluded"], torch["supplier"]) == ("BSD-3-Clause", "Organization: PyTorch Team")
    assert "RECORD sha256 " + "c" * 64 in torch["comment"]
    assert packages["SPDXRef-pypi-vendored-thing"]["licenseConcluded"] == "NOASSERTION"  # never guessed
    # The base's certifi and Omni's wheel of it are two installs: two packages, ids unique.
    certifi = sorted(i for i in packages if i.startswith("SPDXRef-pypi-certifi"))
    assert certifi == ["SPDXRef-pypi-certifi-2026.1.1-base", "SPDXRef-pypi-certifi-2026.1.1-ffffffffffff"]
    assert "2 license" in capsys.readouterr().err  # libc6 and vendored-thing, counted on the summary line
    assert SbomChecker(str(path), compliance="ntia").compliant
    assert validate_full_spdx_document(parse_file(str(path))) == []
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str((tmp_path / "c.json").read_text()) is None
    spdx3 = SbomChecker(str(tmp_path / "s3.json"), compliance="fsct3-min", sbom_spec="spdx3")
    assert spdx3.get_total_number_components() == len(packages) and spdx3.validation_messages == []
    missing = {name for name, _ in spdx3.components_without_concluded_licenses}
    assert missing == {"qwen_cpu_tiny", "libc6", "vendored-thing"}  # the image itself, and no source says


BAD = [
    # (what, contents, contents_sha256 of the pins ("" / "right" / a value), field, message)
    ("no pin", _bytes(_contents()), "", "base.contents_sha256", "base.contents_sha256 is empty"),
    ("no file", None, "right", "images/qwen_cpu_tiny.base-contents.json", "is missing; qwen_cpu_tiny.pins.json pins"),
    ("edited", _bytes(_contents()), "0" * 64, "base.contents_sha256", "does not match its pin"),
    (
        "another base",
        _bytes(_contents(base={**_contents()["base"], "digest": "sha256:" + "9" * 64})),
        "right",
        "base.digest",
        "describes linux/amd64 sha256:9999",
    ),
    (
        "another platform",
        _bytes(_contents(base={**_contents()["base"], "platform": "linux/arm64"})),
        "right",
        "base.digest",
        "describes linux/arm64",
    ),
    (
        "a name outside Debian's grammar",
        _bytes(_contents(dpkg=[{**_contents()["dpkg"][0], "name": "../zlib"}])),
        "right",
        "dpkg.0.name",
        "String should match pattern",
    ),
    ("not JSON", b"{not json", "right", "images/qwen_cpu_tiny.base-contents.json", "not valid JSON"),
]


@pytest.mark.parametrize(("what", "contents", "pinned", "field", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_release_sbom_refuses_base_contents_that_are_not_the_pinned_ones(
    tmp_path: Path, capsys, what, contents, pinned, field, message
) -> None:
    pin = hashlib.sha256(contents or b"").hexdigest() if pinned == "right" else pinned
    code, path = _run(tmp_path, contents, _pins(pin))
    err = capsys.readouterr().err
    assert code == 2 and message in err and field in err, err
    assert not path.exists() and not (tmp_path / "c.json").exists()  # nothing half-written
    assert not (tmp_path / "s3.json").exists()
