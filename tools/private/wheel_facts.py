"""What a wheel says about itself, for the image's SBOM: its core metadata's license fields
(PEP 639 License-Expression, the older License field, the License classifiers), who made it
(Author, Maintainer and their e-mail fields) and the copyright lines of its license files.

Recorded as found, never concluded: the SBOM action (tools/oci/build/sbom_facts.py) maps them
to SPDX. Threat model: the wheel's bytes are pinned by sha256 in the lock, but its text is the
publisher's: every read is bounded, nothing is executed, a wheel without one `*.dist-info` is
refused by name. Standard library only: this runs in a repository rule, before any locked
package exists.
"""

from __future__ import annotations

import email.message
import email.parser
import re
import zipfile
from pathlib import Path
from typing import Any, Iterable

MAX_METADATA_BYTES = 1 << 20
MAX_LICENSE_FILE_BYTES = 1 << 20
MAX_FIELD_CHARS = 512  # a License field may hold the whole license text: only its start is kept
MAX_COPYRIGHT_LINES = 16
MAX_COPYRIGHT_CHARS = 200
# A holder's line, not the license's boilerplate about copyright ("copyright notice", "COPYRIGHT
# HOLDERS BE LIABLE", "copyright law", Apache's "(c) You must retain"): "Copyright" then (c), ©,
# a year or "by"; or (c)/© then a year.
COPYRIGHT_RE = re.compile(r"^\s*(?:copyright\s*(?:\(c\)|©|\d{4}|by\s)|(?:\(c\)|©)\s*\d{4})", re.IGNORECASE)
LICENSE_FILE_RE = re.compile(r"^[^/]+\.dist-info/(?:licenses/.+|(?:LICEN[CS]E|COPYING|NOTICE|AUTHORS)[^/]*)$")


class WheelFactsError(Exception):
    """A wheel whose facts cannot be read; the message names the wheel and what is wrong."""


def _read(wheel: zipfile.ZipFile, name: str, limit: int, where: str) -> str:
    info = wheel.getinfo(name)
    if info.file_size > limit:
        raise WheelFactsError(f"{where}: {name} is {info.file_size} bytes, more than the {limit} read")
    with wheel.open(info) as member:
        return member.read(limit + 1)[:limit].decode("utf-8", "replace")


def _dist_info(names: list[str], where: str) -> str:
    found = sorted({name.split("/", 1)[0] for name in names if name.split("/", 1)[0].endswith(".dist-info")})
    if len(found) != 1:
        raise WheelFactsError(f"{where}: expected one *.dist-info directory, found {found or 'none'}")
    return found[0]


def _field(value: str | None) -> str:
    return " ".join((value or "").split())[:MAX_FIELD_CHARS]


def copyright_lines(text: str) -> list[str]:
    """The holders' lines of a license file, in order, each once, bounded in count and length."""
    found: list[str] = []
    for line in text.splitlines():
        if COPYRIGHT_RE.match(line):
            kept = " ".join(line.split())[:MAX_COPYRIGHT_CHARS]
            if kept not in found:
                found.append(kept)
        if len(found) == MAX_COPYRIGHT_LINES:
            break
    return found


def core_metadata(text: str) -> email.message.Message:
    """The header fields of core metadata (METADATA, PKG-INFO); the body (the long description,
    often the whole README) is not parsed."""
    headers = re.split(r"\r?\n\r?\n", text, maxsplit=1)[0]
    return email.parser.HeaderParser().parsestr(headers + "\n")


def metadata_facts(metadata: email.message.Message, license_texts: Iterable[str]) -> dict[str, Any]:
    """The facts of core metadata (a wheel's METADATA, an installed dist-info's or egg-info's;
    core_metadata) and the texts of its license files. tools/pin reads a vendor base's
    distributions with it."""
    copyrights: list[str] = []
    for text in license_texts:
        for line in copyright_lines(text):
            if line not in copyrights and len(copyrights) < MAX_COPYRIGHT_LINES:
                copyrights.append(line)
    return {
        "license_expression": _field(metadata.get("License-Expression")),
        "license": _field(metadata.get("License")),
        "license_classifiers": sorted(
            {_field(c) for c in metadata.get_all("Classifier") or [] if c.strip().startswith("License ::")}
        ),
        "author": _field(metadata.get("Author")),
        "author_email": _field(metadata.get("Author-email")),
        "maintainer": _field(metadata.get("Maintainer")),
        "maintainer_email": _field(metadata.get("Maintainer-email")),
        "copyright": copyrights,
    }


def wheel_facts(path: Path) -> dict[str, Any]:
    """The facts of one wheel file (see the module's docstring)."""
    where = path.name
    try:
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
            dist_info = _dist_info(names, where)
            metadata = _read(wheel, f"{dist_info}/METADATA", MAX_METADATA_BYTES, where)
            licenses = (  # one file read at a time
                _read(wheel, name, MAX_LICENSE_FILE_BYTES, where)
                for name in sorted(n for n in names if LICENSE_FILE_RE.match(n) and not n.endswith("/"))
            )
            return metadata_facts(core_metadata(metadata), licenses)
    except KeyError as exc:
        raise WheelFactsError(f"{where}: {exc.args[0]}") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelFactsError(f"{where}: not a readable wheel ({exc})") from None
