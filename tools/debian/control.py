"""Debian control-file stanzas (Packages indexes, package control files) and dependency
fields. Written by hand because the standard library has no deb822 parser and the
python-debian package pulls in more than these 40 lines do."""

from __future__ import annotations

import re
from typing import Iterator

DEPENDENCY_RE = re.compile(r"^\s*([a-z0-9][a-z0-9+.-]+)(?::[a-z0-9]+)?\s*(?:\(([<>=]+)\s*([^)]+)\))?")


def stanzas(text: str) -> Iterator[dict[str, str]]:
    """Each paragraph as {field: value}; continuation lines are kept with their newlines."""
    fields: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields, key = {}, None
        elif line[0] in " \t" and key:
            fields[key] += "\n" + line
        else:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    if fields:
        yield fields


def alternatives(field: str) -> list[list[str]]:
    """`a (>= 1) | b, c` -> [["a", "b"], ["c"]] (names only; the lock pins exact versions)."""
    groups = []
    for group in field.split(","):
        names = []
        for choice in group.split("|"):
            match = DEPENDENCY_RE.match(choice)
            if match:
                names.append(match.group(1))
        if names:
            groups.append(names)
    return groups
