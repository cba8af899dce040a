"""tools/debian:lock against a Debian archive on loopback whose Release a test key signs: a good
InRelease (and a Release with Release.gpg) locks, recording who signed it, its Date and
Valid-Until; every way the archive's trust can fail is refused, naming what failed, and writes
nothing."""

from __future__ import annotations

import hashlib
import json
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.fixtures.bounds import ended_by_deadline
from tests.fixtures.debian_archive import DebianArchive, SigningKey, packages_index
from tools.debian import lock

SUITE = lock.RELEASE


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    work = tmp_path_factory.mktemp("keys")
    made = {name: SigningKey(name, work) for name in ("archive", "stranger")}
    yield made
    for key in made.values():
        key.close()


@pytest.fixture(scope="module")
def archive():
    with DebianArchive() as running:
        yield running


def _lock(archive: DebianArchive, keyring: Path, output: Path) -> dict:
    argv = ["--archive", archive.archive, "--keyring", str(keyring), "--output", str(output)]
    lock.main([*argv, "--roots", "python3-minimal", "--no-data-only"])
    return json.loads(output.read_text())


@pytest.mark.parametrize("inline", [True, False], ids=["InRelease", "Release and Release.gpg"])
def test_a_release_signed_by_the_keyring_locks(archive, keys, tmp_path: Path, inline: bool) -> None:
    archive.publish(SUITE, keys["archive"], inline=inline)
    locked = _lock(archive, keys["archive"].keyring, tmp_path / "lock.json")
    assert locked["release_signed_by"] == [keys["archive"].fingerprint]
    assert locked["release_date"].endswith("GMT") and locked["release_valid_until"].endswith("GMT")
    for arch in ("amd64", "arm64"):
        names = [entry["name"] for entry in locked["packages"][arch]]
        assert names == ["libpython3.11-minimal", "python3-minimal"]
        for entry in locked["packages"][arch]:
            served = archive.files[entry["urls"][0].removeprefix(archive.archive + "/")]
            assert entry["size"] == len(served) and entry["sha256"] == hashlib.sha256(served).hexdigest()


def _altered_after_signing(archive: DebianArchive) -> None:
    path = f"dists/{SUITE}/InRelease"
    text = archive.files[path]
    archive.files[path] = re.sub(rb"Origin: Debian", b"Origin: Debiaz", text, count=1)


def _text_around_the_signature(archive: DebianArchive) -> None:
    path = f"dists/{SUITE}/InRelease"
    archive.files[path] = archive.files[path] + b"\nSHA256:\n 00 1 main/binary-amd64/Packages.xz\n"


REFUSED = [
    ("a tampered Packages hash", {"tamper": packages_index([])}, None, "does not match the signed InRelease"),
    ("a signature that does not verify", {}, _altered_after_signing, "does not verify (BADSIG)"),
    ("a key outside the keyring", {"signer": "stranger"}, None, "no good signature by a key in the keyring"),
    ("an unsigned Release", {"signer": None}, None, "is unsigned (no InRelease, no Release.gpg)"),
    ("an expired Valid-Until", {"age": timedelta(days=8)}, None, "expired: Valid-Until"),
    ("a Date in the future", {"age": -timedelta(days=1)}, None, "in the future: not valid yet"),
    ("text around the signature", {}, _text_around_the_signature, "not one clear-signed message"),
    ("another suite", {"suite": "trixie-lookalike"}, None, f"not {SUITE}"),
]


@pytest.mark.parametrize("name, options, change, message", REFUSED, ids=[row[0] for row in REFUSED])
def test_an_archive_that_cannot_be_trusted_is_refused(archive, keys, tmp_path, name, options, change, message) -> None:
    options = dict(options)
    signer = options.pop("signer", "archive")
    suite = options.pop("suite", SUITE)
    archive.publish(suite, keys[signer] if signer else None, **options)
    if suite != SUITE:  # a Release for another suite, served where bookworm's belongs
        archive.files = {p.replace(f"dists/{suite}/", f"dists/{SUITE}/"): d for p, d in archive.files.items()}
    if change is not None:
        change(archive)
    output = tmp_path / "lock.json"
    with pytest.raises(SystemExit) as refused:
        _lock(archive, keys["archive"].keyring, output)
    assert message in str(refused.value) and "nothing written" in str(refused.value), str(refused.value)
    assert not output.exists()


def test_the_default_keyring_is_debians_and_gpgv_is_there() -> None:
    # tools/setup installs both; the lock refuses (names gpgv) where either is missing.
    assert lock.KEYRING == Path("/usr/share/keyrings/debian-archive-keyring.gpg") and lock.KEYRING.is_file()


def test_a_dripping_release_ends_at_the_deadline_with_a_named_refusal(archive, keys, tmp_path: Path) -> None:
    """A mirror sending one byte every 0.2 s would take minutes for InRelease: the run's total
    deadline (2 s) ends it, not the per-read timeout, which every byte resets (issue #68)."""
    archive.publish(SUITE, keys["archive"])
    archive.drip_s = 0.2
    argv = ["--archive", archive.archive, "--keyring", str(keys["archive"].keyring), "--output", str(tmp_path / "l")]
    started = time.monotonic()
    try:
        with pytest.raises(
            SystemExit, match=r"refused: .*/InRelease was (still arriving at its|not read whole by the) deadline"
        ):
            lock.main([*argv, "--deadline", "2"])
    finally:
        archive.drip_s = None
    took = time.monotonic() - started
    size = len(archive.files[f"dists/{SUITE}/InRelease"])
    ended_by_deadline(took, 2, size * 0.2)  # not the InRelease's last byte, minutes away
    assert not (tmp_path / "l").exists()


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan"])
def test_a_deadline_that_is_no_positive_time_is_refused(value: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        lock.main(["--output", str(tmp_path / "l"), "--deadline", value])
    assert refused.value.code == 2
