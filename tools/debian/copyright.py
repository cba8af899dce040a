"""A Debian package's copyright file as the SBOM reads it: the `License:` short names of its
`Files:` paragraphs, the holders of their `Copyright:` fields and each license's text, from a
machine-readable file (copyright-format 1.0, "DEP-5"). A free-form file gives its holders' lines
only (`Copyright (C) 1991-2023 Free Software Foundation, Inc.`, read as a wheel's license files
are: tools/private/wheel_facts.copyright_lines); a license is never concluded from prose (the
SBOM says NOASSERTION there, counted).
tools/oci/build/sbom_facts.py maps the short names to SPDX ids, and a name with none to a
LicenseRef carrying the text the file gives for it.

The file comes from a .deb pinned by sha256 in the Debian lock; it is still the packager's
text: read bounded, parsed as data, never trusted to name more than it holds.
"""

from __future__ import annotations

import re
from typing import Any

from tools.debian.control import stanzas
from tools.private.wheel_facts import copyright_lines

MAX_COPYRIGHT_FILE_BYTES = 1 << 20
MAX_HOLDERS = 16
MAX_HOLDER_CHARS = 200
MAX_LICENSE_TEXTS = 16
MAX_LICENSE_TEXT_CHARS = 32 << 10
FORMAT_RE = re.compile(r"^Format:\s*https?://www\.debian\.org/doc/packaging-manuals/copyright-format/1\.0/?\s*$", re.I)
HOLDER_PREFIX_RE = re.compile(r"^(?:copyright\b|©|\(c\))", re.I)


def _license_text(value: str) -> str:
    """A License field's text: its continuation lines, a lone "." being an empty line."""
    lines = [line.strip() for line in value.split("\n")[1:]]
    return "\n".join("" if line == "." else line for line in lines).strip()[:MAX_LICENSE_TEXT_CHARS]


def copyright_facts(data: bytes) -> dict[str, Any]:
    """{"licenses": [short name, ...], "copyright": [holder line, ...], "license_texts":
    {short name: text}}; all empty for a file past MAX_COPYRIGHT_FILE_BYTES, only the holders'
    lines for one that is not machine-readable."""
    nothing: dict[str, Any] = {"licenses": [], "copyright": [], "license_texts": {}}
    if len(data) > MAX_COPYRIGHT_FILE_BYTES:
        return nothing
    text = data.decode("utf-8", "replace")
    paragraphs = list(stanzas(text))
    if not paragraphs or not FORMAT_RE.match(f"Format: {paragraphs[0].get('Format', '')}"):
        return {**nothing, "copyright": copyright_lines(text)[:MAX_HOLDERS]}
    licenses: list[str] = []
    holders: list[str] = []
    texts: dict[str, str] = {}
    for paragraph in paragraphs[1:]:
        short = paragraph.get("License", "").split("\n", 1)[0].strip()
        body = _license_text(paragraph.get("License", ""))
        if short and body and short not in texts and len(texts) < MAX_LICENSE_TEXTS:
            texts[short] = body
        if "Files" not in paragraph:
            continue  # a stand-alone License paragraph holds a license's text, not a file's license
        if short and short not in licenses:
            licenses.append(short)
        for line in paragraph.get("Copyright", "").split("\n"):
            holder = " ".join(line.split())
            if holder in ("", "."):
                continue
            holder = holder if HOLDER_PREFIX_RE.match(holder) else f"Copyright {holder}"
            if holder[:MAX_HOLDER_CHARS] not in holders and len(holders) < MAX_HOLDERS:
                holders.append(holder[:MAX_HOLDER_CHARS])
    return {"licenses": licenses, "copyright": holders, "license_texts": texts}
