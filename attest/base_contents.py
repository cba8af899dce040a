"""A vendor base's installed packages (images/IMAGE.base-contents.json): recorded by tools/pin
from the base's layers when it pins base.digest, reviewed and committed beside the pins, which
hold its sha256 (base.contents_sha256); the SBOM action of a release build reads it.

Each entry says what the package's own records say, as found: dpkg's database entry and the
package's /usr/share/doc/NAME/copyright (tools.debian.copyright's facts), or a Python
distribution's core metadata and license files (tools.private.wheel_facts' facts) with the
sha256 of its RECORD. Nothing here is concluded: tools/oci/build/sbom_facts.py concludes.

Threat model: the base is the vendor's, so every string came from an untrusted image. Names
and versions are held to their grammars here (they become purls and SPDX ids); free text is
bounded where it is read. The build trusts the file only through its pinned sha256 and refuses
one that describes another base digest than the pinned one.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from attest.documents import Document
from attest.primitives import Sha256

# Debian Policy 5.6.1 (names) and 5.6.12 (versions, epoch and revision included); dpkg's
# architecture names. What a status entry outside them says is refused by tools/pin, naming it.
DEB_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,127}$")
DEB_VERSION_RE = re.compile(r"^(?:[0-9]+:)?[A-Za-z0-9][A-Za-z0-9.+~-]{0,127}$")
DEB_ARCHITECTURE_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
# Core metadata's Name (PEP 508) and a Version as installers write them: PEP 440 with local
# labels (2.13.0+cpu), and the legacy versions older installs carry, without spaces.
PYTHON_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$")
PYTHON_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]{0,127}$")
OS_ID_RE = re.compile(r"^[a-z0-9._-]{0,64}$")

Text = str  # bounded where read (tools.debian.copyright, tools.private.wheel_facts)


class InstalledDeb(Document):
    """One dpkg database entry whose files are installed, and its copyright file's facts."""

    name: str = Field(pattern=DEB_NAME_RE.pattern)
    version: str = Field(pattern=DEB_VERSION_RE.pattern)
    architecture: str = Field(pattern=DEB_ARCHITECTURE_RE.pattern)
    # The database file the entry is in: var/lib/dpkg/status or var/lib/dpkg/status.d/NAME.
    database: str = Field(min_length=1, max_length=4096)
    licenses: list[Text] = []
    copyright: list[Text] = []
    license_texts: dict[str, Text] = {}


class PythonFacts(Document):
    """tools.private.wheel_facts.metadata_facts's fields."""

    license_expression: Text = ""
    license: Text = ""
    license_classifiers: list[Text] = []
    author: Text = ""
    author_email: Text = ""
    maintainer: Text = ""
    maintainer_email: Text = ""
    copyright: list[Text] = []


class InstalledPython(Document):
    """One installed distribution: its *.dist-info (or *.egg-info) in the image."""

    name: str = Field(pattern=PYTHON_NAME_RE.pattern)
    version: str = Field(pattern=PYTHON_VERSION_RE.pattern)
    path: str = Field(min_length=1, max_length=4096)
    # The sha256 of its RECORD's bytes ("": an egg-info, or a dist-info without one).
    record_sha256: Sha256 | Literal[""] = ""
    facts: PythonFacts


class OsRelease(Document):
    """/etc/os-release's ID, VERSION_ID and NAME ("" where the base has none)."""

    id: str = Field(pattern=OS_ID_RE.pattern)
    version_id: str = Field(pattern=OS_ID_RE.pattern)
    name: str = Field(max_length=128)


class ContentsBase(Document):
    image: str = Field(min_length=1)
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    platform: Literal["linux/amd64", "linux/arm64"]


class BaseContents(Document):
    schema_version: Literal["1"]
    image: str = Field(min_length=1)
    base: ContentsBase
    os: OsRelease
    dpkg: list[InstalledDeb]
    python: list[InstalledPython]
