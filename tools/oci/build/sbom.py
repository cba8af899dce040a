"""An SPDX 2.3 JSON SBOM of an image: its Debian packages and Python distributions, each with
the license, supplier and copyright its own metadata states (sbom_facts.py says from where), or
NOASSERTION where none does, counted on the summary line.

    python -m tools.oci.build.sbom --name qwen_mi300x --digest-file D --output SBOM.spdx.json \
        [--debian PACKAGES.json ...] [--wheels WHEELS.json ...] \
        [--vendor-base-pins PINS [--base-contents IMAGE.base-contents.json]]

On a pinned vendor base (--vendor-base-pins: a release build) the base's own packages are listed
too, from the contents file tools/pin recorded (attest.base_contents): refused unless its bytes
have the pins' base.contents_sha256 and it describes the pinned base.digest, so a release's SBOM
never silently leaves the base out.

Deterministic: creation time from SOURCE_DATE_EPOCH, packages sorted, the document
namespace derived from the image digest.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from packaging.utils import canonicalize_name

from attest.base_contents import BaseContents
from attest.documents import read_document
from attest.errors import AttestError
from attest.pins import load_pins
from tools.oci.build import cyclonedx, spdx3
from tools.oci.build.layer import source_date_epoch
from tools.oci.build.sbom_facts import NOASSERTION, copyright_text, debian_license, wheel_license, wheel_supplier

TOOL = "omni-0.1.0"


def _spdx_id(*parts: str) -> str:
    return "SPDXRef-" + "-".join(re.sub(r"[^A-Za-z0-9.]+", "-", part) for part in parts)


MAX_CONTENTS_BYTES = 64 * 1024 * 1024


def _package(
    spdx_id: str, name: str, version: str, sha256: str, purl: str, download: str, stated: dict[str, str]
) -> dict[str, Any]:
    """`stated`: the supplier, license and copyright the package's own metadata gives (and a
    comment, for a vendor base's package); `sha256` "" where no file of the package is known."""
    package = {
        "SPDXID": spdx_id,
        "name": name,
        "versionInfo": version,
        "supplier": stated["supplier"],
        "downloadLocation": download or "NOASSERTION",
        "filesAnalyzed": False,
        "checksums": [{"algorithm": "SHA256", "checksumValue": sha256}] if sha256 else [],
        "licenseConcluded": stated["license"],
        "licenseDeclared": stated["license"],
        "copyrightText": stated["copyright"],
        "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}],
    }
    if stated.get("comment"):
        package["comment"] = stated["comment"]
    return {key: value for key, value in package.items() if value != []}


def _exact(name: str) -> str:
    return name  # Debian package names are compared as they are (lower case by policy)


def _distinct(items: list[dict[str, Any]], key: tuple[str, ...], name: Callable[[str], str]) -> list[dict[str, Any]]:
    """Each package once, in a stable order: two layers may install the same distribution (the
    engine's wheels and Omni's share anyio, certifi, ...), which the image holds once. `name`
    says when two names are one (PEP 503 for wheels: huggingface_hub is huggingface-hub)."""
    unique = {(name(item["name"]), *(str(item.get(field, "")) for field in key)): item for item in items}
    return [unique[k] for k in sorted(unique)]


def _twin(item: dict[str, Any], items: list[dict[str, Any]], name: Callable[[str], str], *same: str) -> tuple[str, ...]:
    """What tells `item` apart from another package of its name (SPDX ids are unique per
    document): its version, and its sha256 where even that is shared; nothing when alone."""
    others = {
        (other["version"], other["sha256"])
        for other in items
        if name(other["name"]) == name(item["name"]) and all(other.get(f) == item.get(f) for f in same)
    }
    if len(others) < 2:
        return ()
    versions = [version for version, _ in others]
    if versions.count(item["version"]) == 1:
        return (item["version"],)
    return (item["version"], item["sha256"][:12] or "base")  # a vendor base's install has no file hash


def _dependency_packages(
    debian: list[dict[str, Any]], wheels: list[dict[str, Any]], refs: dict[str, dict[str, str]]
) -> list[dict]:
    """One SPDX package per Debian package and per wheel, in a stable order."""
    packages = []
    for deb in _distinct(debian, ("architecture", "version", "sha256"), _exact):
        license_, named = debian_license(deb.get("licenses"), deb.get("license_texts"), deb["name"])
        refs.update(named)
        purl = (
            f"pkg:deb/{deb['vendor']}/{deb['name']}@{quote(deb['version'], safe='')}"
            f"?arch={deb['architecture']}&distro={deb['distro']}"
        )
        packages.append(
            _package(
                _spdx_id("deb", deb["name"], deb["architecture"], *_twin(deb, debian, _exact, "architecture")),
                deb["name"],
                deb["version"],
                deb["sha256"],
                purl,
                deb.get("url", ""),
                {
                    "supplier": deb.get("supplier", "Organization: Debian"),
                    "license": license_,
                    "copyright": copyright_text(deb.get("copyright")),
                    "comment": deb.get("comment", ""),
                },
            )
        )
    for wheel in _distinct(wheels, ("version", "sha256"), canonicalize_name):
        purl = f"pkg:pypi/{wheel['name'].lower()}@{quote(wheel['version'], safe='')}"
        packages.append(
            _package(
                _spdx_id("pypi", wheel["name"], *_twin(wheel, wheels, canonicalize_name)),
                wheel["name"],
                wheel["version"],
                wheel["sha256"],
                purl,
                wheel.get("url", ""),
                {
                    "supplier": wheel_supplier(wheel.get("facts") or {}),
                    "license": wheel_license(wheel.get("facts") or {}),
                    "copyright": copyright_text((wheel.get("facts") or {}).get("copyright")),
                    "comment": wheel.get("comment", ""),
                },
            )
        )
    return packages


def base_packages(contents: BaseContents) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Debian packages, Python distributions) of a vendor base, as the package lists of the
    build's own layers give them: no file hash (the base's packages were installed, not
    fetched), the distribution as supplier and purl vendor (attest.base_contents says why)."""
    base = f"{contents.base.image}@{contents.base.digest}"
    os_release = contents.os
    debian = [
        {
            **deb.model_dump(mode="json"),
            "sha256": "",
            "vendor": os_release.id,
            "distro": f"{os_release.id}-{os_release.version_id}" if os_release.version_id else os_release.id,
            "supplier": f"Organization: {os_release.name or os_release.id}",
            "comment": f"installed in the vendor base {base} (dpkg: /{deb.database})",
        }
        for deb in contents.dpkg
    ]
    python = [
        {
            "name": dist.name,
            "version": dist.version,
            "sha256": "",
            "facts": dist.facts.model_dump(mode="json"),
            "comment": f"installed in the vendor base {base} at {dist.path}"
            + (f" (RECORD sha256 {dist.record_sha256})" if dist.record_sha256 else ""),
        }
        for dist in contents.python
    ]
    return debian, python


def read_base_contents(pins_path: Path, contents_path: Path | None) -> BaseContents:
    """The vendor base's contents file, refused unless it is the pinned one for the pinned base."""
    pins = load_pins(pins_path)
    where = f"images/{pins.image}.base-contents.json"
    if not pins.base.contents_sha256:
        raise AttestError(
            f"base.contents_sha256 is empty in {pins_path.name}: a release's SBOM lists the vendor base's packages "
            f"from {where}; run `bazel run //tools/pin -- {pins.image} --write` and commit both files",
            field="base.contents_sha256",
        )
    if contents_path is None:
        raise AttestError(
            f"{where} is missing; {pins_path.name} pins base.contents_sha256 {pins.base.contents_sha256}", field=where
        )
    contents, _ = read_document(
        BaseContents,
        contents_path,
        label=where,
        max_bytes=MAX_CONTENTS_BYTES,
        pinned_sha256=pins.base.contents_sha256,
        pin_field="base.contents_sha256",
    )
    if (contents.base.digest, contents.base.platform) != (pins.base.digest, pins.base.platform):
        raise AttestError(
            f"{where} describes {contents.base.platform} {contents.base.digest}; the pins name "
            f"{pins.base.platform} {pins.base.digest or '(empty)'}: pin the base again (tools/pin --write)",
            field="base.digest",
        )
    return contents


def _build_sbom(name: str, digest: str, debian: list[dict[str, Any]], wheels: list[dict[str, Any]]) -> dict[str, Any]:
    created = datetime.datetime.fromtimestamp(source_date_epoch(), datetime.timezone.utc)
    image_id = "SPDXRef-Image"
    packages = [
        {
            "SPDXID": image_id,
            "name": name,
            "versionInfo": digest,
            "downloadLocation": "NOASSERTION",
            "primaryPackagePurpose": "CONTAINER",
            "filesAnalyzed": False,
            "supplier": "Organization: Omni",
            "checksums": [{"algorithm": "SHA256", "checksumValue": digest.split(":", 1)[1]}],
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
        }
    ]
    refs: dict[str, dict[str, str]] = {}
    packages += _dependency_packages(debian, wheels, refs)
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"omni-{name}",
        "documentNamespace": f"https://spdx.org/spdxdocs/omni-{name}-{digest.split(':', 1)[1]}",
        "creationInfo": {"created": created.strftime("%Y-%m-%dT%H:%M:%SZ"), "creators": [f"Tool: {TOOL}"]},
        "packages": packages,
        # The licenses SPDX does not list, each with the text its package's copyright file gives.
        **(
            {
                "hasExtractedLicensingInfos": [
                    {"licenseId": ref, "name": named["name"], "extractedText": named["text"]}
                    for ref, named in sorted(refs.items())
                ]
            }
            if refs
            else {}
        ),
        "relationships": [
            {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": image_id}
        ]
        + [
            {"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": p["SPDXID"]}
            for p in packages[1:]
        ],
    }


def unstated(sbom: dict[str, Any]) -> str:
    """How many packages no source gave a license, a supplier or a copyright (NOASSERTION)."""
    parts = sbom["packages"][1:]
    counts = {
        field: sum(1 for package in parts if package[key] == NOASSERTION)
        for field, key in (("license", "licenseConcluded"), ("supplier", "supplier"), ("copyright", "copyrightText"))
    }
    return "NOASSERTION: " + ", ".join(f"{count} {field}" for field, count in counts.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sbom", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", required=True)
    parser.add_argument("--digest-file", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--debian", type=Path, action="append", default=[])
    parser.add_argument("--wheels", type=Path, action="append", default=[])
    parser.add_argument("--debian-lock", type=Path, help="adds each package's download URL")
    parser.add_argument("--cyclonedx", type=Path, help="also the same SBOM as CycloneDX 1.6 JSON")
    parser.add_argument("--spdx3", type=Path, help="also the same SBOM as SPDX 3.0.1 JSON-LD (with its SBOM type)")
    parser.add_argument("--vendor-base-pins", type=Path, help="the pins of the vendor base the image is built on")
    parser.add_argument("--base-contents", type=Path, help="that base's contents, as tools/pin recorded them")
    args = parser.parse_args(argv)
    debian = [item for path in args.debian for item in json.loads(path.read_text())]
    if args.debian_lock:
        lock = json.loads(args.debian_lock.read_text())
        urls = {(p["name"], p["architecture"]): p["urls"][0] for arch in lock["packages"].values() for p in arch}
        for item in debian:
            item["url"] = urls.get((item["name"], item["architecture"]), "")
    wheels = [item for path in args.wheels for item in json.loads(path.read_text())]
    if args.vendor_base_pins:
        try:
            base_debian, base_python = base_packages(read_base_contents(args.vendor_base_pins, args.base_contents))
        except AttestError as exc:
            print(f"sbom: refused ({exc.field}): {exc}", file=sys.stderr)
            return 2
        debian, wheels = debian + base_debian, wheels + base_python
    sbom = _build_sbom(args.name, args.digest_file.read_text().strip(), debian, wheels)
    args.output.write_text(json.dumps(sbom, indent=2, sort_keys=True) + "\n")
    if args.cyclonedx:
        args.cyclonedx.write_text(json.dumps(cyclonedx.from_spdx(sbom), indent=2, sort_keys=True) + "\n")
    if args.spdx3:
        args.spdx3.write_text(json.dumps(spdx3.from_spdx(sbom), indent=2, sort_keys=True) + "\n")
    print(f"sbom: {len(debian)} Debian packages, {len(wheels)} Python distributions; {unstated(sbom)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
