"""What `tools/pin` shows and proposes: the pin document with upstream's values, the table (pin,
current, upstream) with the pins that moved, the diff, and the base contents against the
committed file. Pure functions over documents; tools/pin/cli.py resolves and writes."""

from __future__ import annotations

import copy
import difflib
import json
from pathlib import Path
from typing import Any

from attest.documents import parse_document
from attest.pins import ImagePins
from attest.reader import read_file
from tools.pin.artifact import ArtifactUpstream
from tools.pin.signature import PublisherSignature
from tools.pin.upstream import Upstream, engine_pins, lock_summary


def pins_text(document: dict[str, Any]) -> bytes:
    """The pin document as the repository keeps it: two-space indent, key order kept."""
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _leading(entry: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """`entry` with `values` set, those keys first (the document reads id/image, ref/tag, pin)."""
    return {**values, **{key: value for key, value in entry.items() if key not in values}}


def proposed_pins(
    current: dict[str, Any],
    upstream: Upstream,
    artifact: ArtifactUpstream | None,
    signature: PublisherSignature | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """(the pin document with upstream's values, notes on how they were found)."""
    document = copy.deepcopy(current)
    base = document["base"]
    document["base"] = _leading(
        base, {"image": base["image"], "tag": upstream.base.tag, "digest": upstream.base.digest}
    )
    document["base"]["contents_sha256"] = upstream.base.contents_sha256
    engine, note = engine_pins(upstream.base.engine)
    notes = [note]
    document["engine"].update(engine)
    for key, found in (("model", upstream.model), ("speculator", upstream.speculator)):
        if found is None:
            continue
        values = {"id": document[key]["id"], "ref": found.ref, "revision": found.revision}
        if found.lock is not None:
            values["lock_sha256"] = found.lock_sha256
            notes.append(f"{key} checkpoint lock: {lock_summary(found.lock)}")
        document[key] = _leading(document[key], values)
    if artifact is not None:
        document["model"]["artifact"] = {
            "repository": artifact.repository,
            "tag": artifact.tag,
            "digest": artifact.digest,
        }
        notes.append(f"model artifact: {artifact.repository}@{artifact.digest} holds the lock's {artifact.files} files")
    if signature is not None:
        document["model"]["signature"] = signature.pin()
        who = f"{signature.signer} ({signature.identity})" if signature.identity else signature.signer
        notes.append(
            f"model signature: publisher-signed by {who}, {signature.files} files"
            + (f"; not signed (its ignore_paths): {', '.join(signature.unsigned)}" if signature.unsigned else "")
        )
    parse_document(ImagePins, document, label="the proposed pins")  # what is written must load as pins
    return document, notes


PIN_ROWS = (
    "base.tag",
    "base.digest",
    "base.contents_sha256",
    "engine.commit",
    "engine.record_sha256",
    "model.ref",
    "model.revision",
    "model.lock_sha256",
    "model.artifact.tag",
    "model.artifact.digest",
    "model.signature.signer",
    "model.signature.sha256",
    "speculator.ref",
    "speculator.revision",
)


def _value(document: dict[str, Any], name: str) -> str | None:
    """The pin's value ("" when absent); None where the document has no such pin (no
    speculator, no checkpoint lock)."""
    *sections, key = name.split(".")
    section: Any = document
    for part in sections:
        section = section.get(part) if isinstance(section, dict) else None
    if not isinstance(section, dict):
        return None
    value = section.get(key, "")
    return None if value is None else str(value)


def _table(current: dict[str, Any], proposed: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(table lines, names of pins whose upstream differs)."""
    rows, moved = [("pin", "current", "upstream", "")], []
    for name in PIN_ROWS:
        ours, theirs = _value(current, name), _value(proposed, name)
        if theirs is None:
            continue
        differs = (ours or "") != theirs
        if differs and not name.endswith((".tag", ".ref")):
            moved.append(name)
        rows.append(
            (
                name,
                ours or "(empty)",
                theirs or "(empty)",
                "moved" if differs and ours else "unpinned" if differs else "",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip() for a, b, c, d in rows]
    return lines, moved


def shown(
    current: dict[str, Any], proposed: dict[str, Any], notes: list[str], name: str
) -> tuple[list[str], list[str], bytes]:
    """The table, the notes and the diff printed; (pins that moved, the diff, the new text)."""
    lines, moved = _table(current, proposed)
    print("\n".join(lines))
    for note in notes:
        print(f"note: {note}")
    before, after = pins_text(current), pins_text(proposed)
    diff = list(
        difflib.unified_diff(
            before.decode().splitlines(),
            after.decode().splitlines(),
            f"a/images/{name}",
            f"b/images/{name}",
            lineterm="",
        )
    )
    print("\n".join(diff) if diff else f"images/{name}: every pin matches upstream")
    return moved, diff, after


MAX_CONTENTS_BYTES = 64 * 1024 * 1024


def _packages(data: bytes) -> set[str]:
    """`kind name version` of each package a contents file lists (nothing for unreadable bytes)."""
    try:
        document = json.loads(data)
        return {f"deb {d['name']} {d['version']}" for d in document["dpkg"]} | {
            f"pypi {d['name']} {d['version']}" for d in document["python"]
        }
    except (ValueError, KeyError, TypeError):
        return set()


def contents_state(path: Path, pinned: str, found: bytes) -> tuple[list[str], str]:
    """(notes on the base's contents against the committed file, why that file is stale or "")."""
    committed = read_file(path, label=path.name, max_bytes=MAX_CONTENTS_BYTES) if path.is_file() else None
    document = json.loads(found)
    notes = [f"base contents: {len(document['dpkg'])} dpkg packages, {len(document['python'])} Python distributions"]
    if committed is not None and committed.data != found:
        before, after = _packages(committed.data), _packages(found)
        changes = [f"+{item}" for item in sorted(after - before)] + [f"-{item}" for item in sorted(before - after)]
        notes.append(f"{path.name} differs from upstream: {', '.join(changes[:20]) or 'package facts changed'}")
    if pinned and committed is None:
        return notes, f"{path.name} is missing; base.contents_sha256 pins {pinned}"
    if pinned and committed is not None and committed.sha256 != pinned:
        return notes, f"{path.name} has sha256 {committed.sha256}; base.contents_sha256 pins {pinned}"
    return notes, ""
