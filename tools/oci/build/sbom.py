"""An SPDX 2.3 JSON SBOM of an image: its Debian packages and Python distributions, each with
the license, supplier and copyright its own metadata states (sbom_facts.py says from where), or
NOASSERTION where none does, counted on the summary line.

    python -m tools.oci.build.sbom --name qwen_mi300x --digest-file D --output SBOM.spdx.json \
        [--debian PACKAGES.json ...] [--wheels WHEELS.json ...]

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

from tools.oci.build.cyclonedx import from_spdx
from tools.oci.build.layer import source_date_epoch
from tools.oci.build.sbom_facts import NOASSERTION, copyright_text, debian_license, wheel_license, wheel_supplier

TOOL = "omni-0.1.0"
DEBIAN_DISTRO = {"bookworm": "debian-12", "trixie": "debian-13"}


def _spdx_id(*parts: str) -> str:
    return "SPDXRef-" + "-".join(re.sub(r"[^A-Za-z0-9.]+", "-", part) for part in parts)


def _package(
    spdx_id: str, name: str, version: str, sha256: str, purl: str, download: str, stated: dict[str, str]
) -> dict[str, Any]:
    """`stated`: the supplier, license and copyright the package's own metadata gives."""
    return {
        "SPDXID": spdx_id,
        "name": name,
        "versionInfo": version,
        "supplier": stated["supplier"],
        "downloadLocation": download or "NOASSERTION",
        "filesAnalyzed": False,
        "checksums": [{"algorithm": "SHA256", "checksumValue": sha256}],
        "licenseConcluded": stated["license"],
        "licenseDeclared": stated["license"],
        "copyrightText": stated["copyright"],
        "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}],
    }


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
    return (item["version"],) if versions.count(item["version"]) == 1 else (item["version"], item["sha256"][:12])


def _dependency_packages(
    debian: list[dict[str, Any]], wheels: list[dict[str, Any]], release: str, refs: dict[str, dict[str, str]]
) -> list[dict]:
    """One SPDX package per Debian package and per wheel, in a stable order."""
    packages = []
    for deb in _distinct(debian, ("architecture", "version", "sha256"), _exact):
        license_, named = debian_license(deb.get("licenses"), deb.get("license_texts"), deb["name"])
        refs.update(named)
        purl = (
            f"pkg:deb/debian/{deb['name']}@{quote(deb['version'], safe='')}"
            f"?arch={deb['architecture']}&distro={DEBIAN_DISTRO.get(release, release)}"
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
                    "supplier": "Organization: Debian",
                    "license": license_,
                    "copyright": copyright_text(deb.get("copyright")),
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
                },
            )
        )
    return packages


def _build_sbom(
    name: str, digest: str, debian: list[dict[str, Any]], wheels: list[dict[str, Any]], release: str = "bookworm"
) -> dict[str, Any]:
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
    packages += _dependency_packages(debian, wheels, release, refs)
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
    args = parser.parse_args(argv)
    debian = [item for path in args.debian for item in json.loads(path.read_text())]
    if args.debian_lock:
        lock = json.loads(args.debian_lock.read_text())
        urls = {(p["name"], p["architecture"]): p["urls"][0] for arch in lock["packages"].values() for p in arch}
        for item in debian:
            item["url"] = urls.get((item["name"], item["architecture"]), "")
    wheels = [item for path in args.wheels for item in json.loads(path.read_text())]
    sbom = _build_sbom(args.name, args.digest_file.read_text().strip(), debian, wheels)
    args.output.write_text(json.dumps(sbom, indent=2, sort_keys=True) + "\n")
    if args.cyclonedx:
        args.cyclonedx.write_text(json.dumps(from_spdx(sbom), indent=2, sort_keys=True) + "\n")
    print(f"sbom: {len(debian)} Debian packages, {len(wheels)} Python distributions; {unstated(sbom)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
