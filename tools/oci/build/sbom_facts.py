"""What the SBOM concludes from the facts packages state about themselves: a concluded license
as an SPDX expression, a supplier and a copyright text, each from the package's own metadata,
or NOASSERTION where no source says (counted by the caller).

Sources, in order (docs/release.md, "What the SBOM holds"):
- a wheel (tools/private/wheel_facts.py): PEP 639 License-Expression (validated and normalised
  with `packaging.licenses`, the SPDX list PyPI uses); else the License field when it is itself a
  valid SPDX expression or one of the unambiguous spellings below; else exactly one License
  classifier that names one license and version. Supplier: the Maintainer, else the Author
  (names, else their e-mail fields), else `Organization: PyPI` (the distribution). Copyright: the
  holders' lines of its license files.
- a Debian package (tools/debian/rootfs.py): the `License:` short names of its machine-readable
  copyright file (DEP-5), each mapped to SPDX below, or to a LicenseRef carrying the text the
  file gives for it, else NOASSERTION; the supplier is `Organization: Debian`; copyright: the
  `Copyright:` fields.
A license string that maps to no SPDX id is never guessed at: NOASSERTION.
"""

from __future__ import annotations

import re
from email.utils import getaddresses
from typing import Any

from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression

NOASSERTION = "NOASSERTION"
MAX_LICENSE_FIELD = 64  # longer License fields are license texts, not names
# The License field's common spellings that name exactly one SPDX license.
LICENSE_SPELLINGS = {
    "3-clause bsd license": "BSD-3-Clause",
    "apache 2.0": "Apache-2.0",
    "apache 2.0 license": "Apache-2.0",
    "apache license 2.0": "Apache-2.0",
    "apache license, version 2.0": "Apache-2.0",
    "apache software license 2.0": "Apache-2.0",
    "bsd 3-clause": "BSD-3-Clause",
    "bsd-3": "BSD-3-Clause",
    "mit license": "MIT",
    "the mit license": "MIT",
    "mpl 2.0": "MPL-2.0",
    "psf": "PSF-2.0",
    "psf license": "PSF-2.0",
}
# License classifiers that name one license and one version (the "BSD License" or "Apache
# Software License" classifiers do not: they are never concluded from).
CLASSIFIER_LICENSES = {
    "License :: OSI Approved :: MIT License": "MIT",
    "License :: OSI Approved :: Apache Software License 2.0": "Apache-2.0",
    "License :: OSI Approved :: ISC License (ISCL)": "ISC",
    "License :: OSI Approved :: Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "License :: OSI Approved :: Python Software Foundation License": "PSF-2.0",
    "License :: OSI Approved :: The Unlicense (Unlicense)": "Unlicense",
    "License :: OSI Approved :: zlib/libpng License": "Zlib",
    "License :: CC0 1.0 Universal (CC0 1.0) Public Domain Dedication": "CC0-1.0",
}
# Debian's copyright-format short names (https://www.debian.org/doc/packaging-manuals/
# copyright-format/1.0/#license-short-name) and their SPDX ids; "+" is "or later".
DEBIAN_LICENSES = {
    "apache-2": "Apache-2.0",
    "apache-2.0": "Apache-2.0",
    "artistic": "Artistic-1.0-Perl",
    "artistic-2.0": "Artistic-2.0",
    "bsd-2-clause": "BSD-2-Clause",
    "bsd-3-clause": "BSD-3-Clause",
    "bsd-4-clause": "BSD-4-Clause",
    "cc0-1.0": "CC0-1.0",
    "expat": "MIT",
    "gfdl-1.2+": "GFDL-1.2-or-later",
    "gfdl-1.3+": "GFDL-1.3-or-later",
    "gfdl-niv-1.3+": "GFDL-1.3-no-invariants-or-later",
    "gpl-1+": "GPL-1.0-or-later",
    "gpl-2": "GPL-2.0-only",
    "gpl-2+": "GPL-2.0-or-later",
    "gpl-3": "GPL-3.0-only",
    "gpl-3+": "GPL-3.0-or-later",
    "isc": "ISC",
    "lgpl-2": "LGPL-2.0-only",
    "lgpl-2+": "LGPL-2.0-or-later",
    "lgpl-2.1": "LGPL-2.1-only",
    "lgpl-2.1+": "LGPL-2.1-or-later",
    "lgpl-3": "LGPL-3.0-only",
    "lgpl-3+": "LGPL-3.0-or-later",
    "mit": "MIT",
    "mpl-1.1": "MPL-1.1",
    "mpl-2.0": "MPL-2.0",
    "ms-pl": "MS-PL",
    "openssl": "OpenSSL",
    "python-2.0": "Python-2.0",
    "sleepycat": "Sleepycat",
    "x11": "X11",
    "zlib": "Zlib",
}


def spdx_expression(text: str) -> str | None:
    """`text` as a normalised SPDX expression, or None when it is not one."""
    try:
        return canonicalize_license_expression(text) if text.strip() else None
    except InvalidLicenseExpression:
        return None


def wheel_license(facts: dict[str, Any]) -> str:
    if facts.get("license_expression"):
        return spdx_expression(facts["license_expression"]) or NOASSERTION  # a wrong PEP 639 field is not skipped
    field = " ".join(str(facts.get("license") or "").split())
    if field and len(field) <= MAX_LICENSE_FIELD:
        found = LICENSE_SPELLINGS.get(field.lower()) or spdx_expression(field)
        if found:
            return found
    named = {CLASSIFIER_LICENSES[c] for c in facts.get("license_classifiers") or () if c in CLASSIFIER_LICENSES}
    return named.pop() if len(named) == 1 else NOASSERTION


def _people(name: str, email: str) -> str:
    """The names a metadata field pair gives: the Name field, else the display names of the
    e-mail field's addresses, else the addresses."""
    if name.strip():
        return name.strip()
    return ", ".join(name or address for name, address in getaddresses([email]) if name or address)


def wheel_supplier(facts: dict[str, Any]) -> str:
    who = _people(facts.get("maintainer", ""), facts.get("maintainer_email", "")) or _people(
        facts.get("author", ""), facts.get("author_email", "")
    )
    # SPDX's supplier is "Person:" or "Organization:"; metadata does not say which, and a name
    # holding parentheses would read as an e-mail part.
    return f"Organization: {who.replace('(', '[').replace(')', ']')}" if who else "Organization: PyPI"


def copyright_text(lines: list[str] | None) -> str:
    return "\n".join(lines) if lines else NOASSERTION


def license_ref(package: str, short_name: str) -> str:
    """The document-wide id of a license SPDX does not list, as one package's file names it
    (two packages' "public-domain" texts differ)."""
    return "LicenseRef-" + re.sub(r"[^A-Za-z0-9.]+", "-", f"{package}-{short_name}").strip("-")


def debian_license(
    short_names: list[str] | None, texts: dict[str, str] | None = None, package: str = ""
) -> tuple[str, dict[str, dict[str, str]]]:
    """The SPDX expression of a Debian package's License: short names (AND: every file's license
    applies to the package) and the licenses it names that SPDX does not list, by LicenseRef
    ({id: {"name", "text"}}): a name SPDX does not list and the file gives no text for makes the
    whole NOASSERTION."""
    if not short_names:
        return NOASSERTION, {}
    mapped, refs = [], {}
    for entry in short_names:
        for conjunct in re.split(r"\s+and\s+", entry, flags=re.I):  # "Sleepycat and BSD-3-clause"
            alternatives = []
            parts = [p.strip() for p in re.split(r"\s+or\s+", conjunct, flags=re.I)]
            if not all(p.lower() in DEBIAN_LICENSES or (texts or {}).get(p) for p in parts):
                parts = [conjunct.strip()]  # "GPL or MIT-US-export": one text for the whole choice
            for part in parts:
                known = DEBIAN_LICENSES.get(part.lower())
                if known is None and (texts or {}).get(part):
                    known = license_ref(package, part)
                    refs[known] = {"name": part, "text": texts[part]}
                if known is None:
                    return NOASSERTION, {}
                alternatives.append(known)
            mapped.append(" OR ".join(dict.fromkeys(alternatives)))
    mapped = list(dict.fromkeys(mapped))
    expression = spdx_expression(" AND ".join(f"({m})" if " OR " in m and len(mapped) > 1 else m for m in mapped))
    return (expression, refs) if expression else (NOASSERTION, {})
