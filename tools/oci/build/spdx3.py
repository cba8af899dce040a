"""The image's SBOM as SPDX 3.0.1 JSON-LD, from the SPDX 2.3 document the same action just wrote:
the same packages, versions, purls, hashes, suppliers, concluded licenses and copyright texts,
and what only SPDX 3 can say: the SBOM type (`software_sbomType: build`), which CISA's 2024 FSCT
minimum asks for and ntia-conformance-checker reads from SPDX 3 alone.

Written as plain JSON rather than with spdx-python-model, for the reason tools/oci/build/
cyclonedx.py gives (a direct mapping; the action needs only the standard library); the suite
reads every built document back with spdx-python-model's JSON-LD deserializer and checks it
with ntia-conformance-checker (tests/oci/sbom_test.py). A NOASSERTION license or copyright is
left out (SPDX 3 has no such value for a copyright text; the checkers count either as missing).
"""

from __future__ import annotations

from typing import Any

SPEC_VERSION = "3.0.1"
CONTEXT = f"https://spdx.org/rdf/{SPEC_VERSION}/spdx-context.jsonld"
CREATION = "_:creation"
NOASSERTION = "NOASSERTION"


def _purl(package: dict[str, Any]) -> str:
    refs = package.get("externalRefs", [])
    return next((ref["referenceLocator"] for ref in refs if ref.get("referenceType") == "purl"), "")


class _Graph:
    """The document's elements, each with an IRI under the SPDX 2.3 document's namespace."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.elements: list[dict[str, Any]] = []
        self.agents: dict[str, str] = {}

    def iri(self, local: str) -> str:
        return f"{self.namespace}#{local}"

    def add(self, kind: str, local: str, **fields: Any) -> str:
        element = {"type": kind, "spdxId": self.iri(local), "creationInfo": CREATION, **fields}
        self.elements.append(element)
        return element["spdxId"]

    def agent(self, supplier: str) -> str:
        """The Organization or Person an SPDX 2.3 `Kind: name` supplier names, once each."""
        kind, _, name = supplier.partition(": ")
        if supplier not in self.agents:
            local = f"Agent-{len(self.agents)}"
            self.agents[supplier] = self.add("Person" if kind == "Person" else "Organization", local, name=name)
        return self.agents[supplier]


def _package(graph: _Graph, package: dict[str, Any], purpose: str) -> str:
    fields: dict[str, Any] = {"name": package["name"], "software_primaryPurpose": purpose}
    if package.get("versionInfo"):
        fields["software_packageVersion"] = package["versionInfo"]
    if package.get("supplier", NOASSERTION) != NOASSERTION:
        fields["suppliedBy"] = graph.agent(package["supplier"])
    if package.get("copyrightText", NOASSERTION) != NOASSERTION:
        fields["software_copyrightText"] = package["copyrightText"]
    if _purl(package):
        fields["software_packageUrl"] = _purl(package)
    if package.get("checksums"):
        fields["verifiedUsing"] = [
            {"type": "Hash", "algorithm": "sha256", "hashValue": c["checksumValue"]} for c in package["checksums"]
        ]
    if package.get("comment"):
        fields["comment"] = package["comment"]
    element = graph.add("software_Package", package["SPDXID"], **fields)
    concluded = package.get("licenseConcluded", NOASSERTION)
    if concluded not in (NOASSERTION, "NONE", ""):
        license_ = graph.add(
            "simplelicensing_LicenseExpression",
            f"{package['SPDXID']}-license",
            simplelicensing_licenseExpression=concluded,
        )
        graph.add(
            "Relationship",
            f"{package['SPDXID']}-concluded",
            relationshipType="hasConcludedLicense",
            to=[license_],
            **{"from": element},
        )
    return element


def from_spdx(spdx: dict[str, Any]) -> dict[str, Any]:
    """The SPDX 3.0.1 JSON-LD document of the image the SPDX 2.3 document describes."""
    graph = _Graph(spdx["documentNamespace"])
    tool = spdx["creationInfo"]["creators"][0].removeprefix("Tool: ")
    creator = graph.add("Organization", "Omni", name="Omni")
    using = graph.add("Tool", "Tool", name=tool)
    image, *packages = spdx["packages"]
    root = _package(graph, image, "container")
    contained = [_package(graph, package, "library") for package in packages]
    if contained:
        graph.add("Relationship", "Image-contains", relationshipType="contains", to=contained, **{"from": root})
    members = [element["spdxId"] for element in graph.elements]
    sbom = graph.add("software_Sbom", "SBOM", rootElement=[root], element=members, software_sbomType=["build"])
    document = {
        "type": "SpdxDocument",
        "spdxId": graph.iri("DOCUMENT"),
        "creationInfo": CREATION,
        "name": spdx["name"],
        "rootElement": [sbom],
        "element": members + [sbom],
        "profileConformance": ["core", "software", "simpleLicensing"],
    }
    creation = {
        "type": "CreationInfo",
        "@id": CREATION,
        "specVersion": SPEC_VERSION,
        "created": spdx["creationInfo"]["created"],
        "createdBy": [creator],
        "createdUsing": [using],
    }
    return {"@context": CONTEXT, "@graph": [creation, document, *graph.elements]}
