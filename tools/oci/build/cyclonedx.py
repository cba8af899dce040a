"""The image's SBOM as CycloneDX 1.6 JSON, from the SPDX document the same action just wrote:
the same packages, versions, purls, hashes, suppliers, licenses and copyright texts, so the two
can never say different things; for Dependency-Track and Trivy users.

Written as plain JSON rather than with cyclonedx-python-lib: the document is a direct mapping of
data the SPDX writer already holds, and the build action then needs nothing beyond the standard
library; the suite validates every built document with cyclonedx-python-lib's own JSON schema
validator (tests/oci/sbom_test.py). Deterministic: the serial number is a UUID derived from the
image digest, the timestamp is the SPDX document's creation time.
"""

from __future__ import annotations

import uuid
from typing import Any

SPEC_VERSION = "1.6"
NOASSERTION = "NOASSERTION"
TOOL = {"type": "application", "name": "omni", "version": "0.1.0"}


def _purl(package: dict[str, Any]) -> str:
    return next(
        (ref["referenceLocator"] for ref in package.get("externalRefs", []) if ref.get("referenceType") == "purl"), ""
    )


def _licenses(expression: str) -> list[dict[str, Any]]:
    return [] if expression in ("", NOASSERTION, "NONE") else [{"expression": expression}]


def _component(package: dict[str, Any]) -> dict[str, Any]:
    purl = _purl(package)
    component: dict[str, Any] = {
        "type": "library",
        "bom-ref": package["SPDXID"],  # unique in the document, as a purl may not be
        "name": package["name"],
        "version": package["versionInfo"],
        "hashes": [{"alg": "SHA-256", "content": c["checksumValue"]} for c in package.get("checksums", [])],
        "licenses": _licenses(package.get("licenseConcluded", NOASSERTION)),
    }
    if package.get("supplier", NOASSERTION) != NOASSERTION:
        component["supplier"] = {"name": package["supplier"].split(": ", 1)[-1]}
    if package.get("copyrightText", NOASSERTION) != NOASSERTION:
        component["copyright"] = package["copyrightText"]
    if purl:
        component["purl"] = purl
    return {key: value for key, value in component.items() if value != []}


def from_spdx(spdx: dict[str, Any]) -> dict[str, Any]:
    """The CycloneDX document of the image the SPDX document describes."""
    image, *packages = spdx["packages"]
    digest = image["versionInfo"]
    components = [_component(package) for package in packages]
    return {
        "$schema": "http://cyclonedx.org/schema/bom-1.6.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, spdx['documentNamespace'])}",
        "version": 1,
        "metadata": {
            "timestamp": spdx["creationInfo"]["created"],
            "lifecycles": [{"phase": "build"}],  # the SBOM type: made from what the build put in
            "tools": {"components": [TOOL]},
            "component": {
                "type": "container",
                "bom-ref": "image",
                "name": image["name"],
                "version": digest,
                "hashes": [{"alg": "SHA-256", "content": digest.split(":", 1)[-1]}],
                "supplier": {"name": image["supplier"].split(": ", 1)[-1]},
            },
        },
        "components": components,
        "dependencies": [{"ref": "image", "dependsOn": [c["bom-ref"] for c in components]}]
        + [{"ref": c["bom-ref"]} for c in components],
    }
