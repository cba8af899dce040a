"""A Debian suite's Release, authenticated: `InRelease` (or `Release` with `Release.gpg`)
verified by gpgv against the archive keyring, read only from the text the signature covers.

Threat model: the archive is fetched over plain HTTP from a mirror, so whoever is on the path
chooses every byte, and the lock's hashes are then reviewed and baked into images. Trust comes
from the keyring alone (Debian's `debian-archive-keyring`, or one a test passes): a signature
that does not verify, a Release without one, a signature by a key outside the keyring, a
revoked or expired key, a weak digest (SHA-1 and older, as apt refuses), a Release for another
suite, one dated in the future or past its `Valid-Until` are each refused, naming what failed.
The hashes (and the Date and Valid-Until) are taken from gpgv's `--output`, the signed text
itself, never from parsing the clear-signed file around it, so text outside the signature
cannot add or replace a hash. Residual: a validly signed but older Release without
`Valid-Until` (Debian's stable suites carry none) can be replayed; its `Date` is recorded in the
lock, for review, and a refresh that goes back in time is visible in the diff.
"""

from __future__ import annotations

import email.utils
import math
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx

from attest.edge.bodies import read_bounded
from attest.edge.data_plane import DataPlaneTransport, blob_extensions
from attest.edge.transport import answer_deadline
from tools.debian.control import stanzas

KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
MAX_RELEASE_BYTES = 4 << 20  # bookworm's InRelease is ~150 kB
MAX_SIGNATURE_BYTES = 64 << 10
GPGV_TIMEOUT_S = 60
READ_TIMEOUT_S = 60  # one read of the archive's socket; the whole run has its own deadline
ANSWER_S = 60  # an answer's status line and headers
# OpenPGP hash algorithm ids (RFC 4880 9.4) apt refuses in archive signatures: MD5, SHA-1, RIPEMD-160.
WEAK_DIGESTS = {"1": "MD5", "2": "SHA-1", "3": "RIPEMD-160"}
# Status keywords of a signature that does not count (gpg's doc/DETAILS); BADSIG refuses outright.
WORTHLESS = ("EXPSIG", "EXPKEYSIG", "REVKEYSIG", "ERRSIG", "NO_PUBKEY")
ARMOR_LINES = (b"-----BEGIN PGP SIGNED MESSAGE-----", b"-----BEGIN PGP SIGNATURE-----", b"-----END PGP SIGNATURE-----")


class ArchiveError(RuntimeError):
    """The archive's Release could not be authenticated; the message names what failed (and
    `field`, where a bounded read names one)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SignedRelease:
    suite: str
    date: str
    valid_until: str | None
    signed_by: tuple[str, ...]  # fingerprints of the primary keys whose signatures verified
    source: str  # the file(s) the signature came in
    sha256: dict[str, tuple[str, int]]  # path under dists/<suite>/ -> (hex digest, size)

    def listed(self, path: str) -> tuple[str, int]:
        """(sha256, size) the signed Release lists for `path`; refused when it lists none."""
        if path not in self.sha256:
            raise ArchiveError(f"{path} is not listed in the signed {self.source} of {self.suite}")
        return self.sha256[path]

    def check(self, path: str, data: bytes, digest: str) -> None:
        """`data` fetched from `path` must be what the signed Release lists."""
        listed = self.listed(path)
        if (digest, len(data)) != listed:
            raise ArchiveError(
                f"{path} does not match the signed {self.source} of {self.suite}: "
                f"sha256 {digest} and {len(data)} bytes, signed {listed[0]} and {listed[1]} bytes"
            )


def get_bounded(client: httpx.Client, url: str, limit: int, deadline: float = math.inf) -> bytes | None:
    """The body at `url`, at most `limit` bytes, every byte by `deadline` (time.monotonic()); None
    for a 404. With a client on the data plane (archive_client) the deadline also ends a stall; a
    body still arriving then (a mirror dripping one byte a second) is refused, naming it."""
    try:
        with answer_deadline(ANSWER_S, ends=deadline):
            response = client.send(client.build_request("GET", url, extensions=blob_extensions(deadline)), stream=True)
        try:
            return _body(response, url, limit, deadline)
        finally:
            response.close()
    except httpx.HTTPError as exc:
        if time.monotonic() >= deadline:
            raise ArchiveError(f"{url} was not read whole by the deadline ({exc})") from None
        raise


def _body(response: httpx.Response, url: str, limit: int, deadline: float) -> bytes | None:
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise ArchiveError(f"{url} answered HTTP {response.status_code}")
    return read_bounded(response, limit, url, deadline=deadline, error=ArchiveError)


def archive_client() -> httpx.Client:
    """A client for the archive whose every read is held to the caller's deadline (the data
    plane's watchdog ends a stalled or trickled body at it), honouring the proxy variables."""
    return httpx.Client(timeout=READ_TIMEOUT_S, follow_redirects=True, transport=DataPlaneTransport())


def _verified_text(signed: bytes, detached: bytes | None, keyring: Path, what: str) -> tuple[bytes, list[str]]:
    """(the signed text, the fingerprints of the good signatures) per gpgv; else ArchiveError."""
    if detached is None and not _one_clearsigned_message(signed):
        raise ArchiveError(f"{what} is not one clear-signed message (text outside or around the signature)")
    with tempfile.TemporaryDirectory(prefix="omni-gpgv-") as home:
        data = Path(home, "data")
        data.write_bytes(signed)
        output = Path(home, "verified")
        command = ["gpgv", "--homedir", home, "--status-fd", "1", "--keyring", str(keyring.resolve())]
        if detached is None:
            command += ["--output", str(output), str(data)]
        else:
            Path(home, "signature").write_bytes(detached)
            command += [str(Path(home, "signature")), str(data)]
        try:
            done = subprocess.run(command, capture_output=True, timeout=GPGV_TIMEOUT_S, check=False)
        except FileNotFoundError:
            raise ArchiveError("gpgv is not installed: run tools/setup (it installs gpgv)") from None
        except subprocess.TimeoutExpired:
            raise ArchiveError(f"gpgv did not finish verifying {what} in {GPGV_TIMEOUT_S} s") from None
        good = _good_signers(done.stdout.decode("utf-8", "replace"), done.stderr, what)
        text = signed if detached is not None else (output.read_bytes() if output.exists() else b"")
    if not text:
        raise ArchiveError(f"{what}: gpgv wrote no signed text")
    return text, good


def _one_clearsigned_message(data: bytes) -> bool:
    """Exactly one clear-signed message, nothing before or after it: each armor line once, in
    order, the first at the start and the last at the end (as apt's SplitClearSignedFile)."""
    lines = [line.rstrip(b"\r") for line in data.strip().split(b"\n")]
    marks = [line for line in lines if line.startswith(b"-----")]
    return marks == list(ARMOR_LINES) and lines[0] == ARMOR_LINES[0] and lines[-1] == ARMOR_LINES[2]


def _good_signers(status: str, stderr: bytes, what: str) -> list[str]:
    """The primary-key fingerprints of signatures that are good (GOODSIG then VALIDSIG with a
    strong digest). Any BADSIG refuses; signatures by unknown, expired or revoked keys do not
    count (as apt: one good signature is needed, a bad one is fatal)."""
    lines = [line.split()[1:] for line in status.splitlines() if line.startswith("[GNUPG:] ") and len(line.split()) > 1]
    if any(words[0] == "BADSIG" for words in lines):
        raise ArchiveError(f"{what}: a signature does not verify (BADSIG): the file was altered after signing")
    good, reasons = [], []
    for words in lines:
        # VALIDSIG <fpr> <date> <timestamp> <expires> <version> <reserved> <pubkey-algo> <hash-algo> <class> <primary-fpr>
        if words[0] == "VALIDSIG" and len(words) >= 11:
            if words[8] in WEAK_DIGESTS:
                reasons.append(f"a signature by {words[10]} uses {WEAK_DIGESTS[words[8]]}")
            else:
                good.append(words[10])
        elif words[0] in WORTHLESS:
            reasons.append(f"{words[0]} {' '.join(words[1:2])}".strip())
    if not any(words[0] == "GOODSIG" for words in lines) or not good:
        detail = "; ".join(reasons) or stderr.decode("utf-8", "replace").strip()[-300:] or "no signature"
        raise ArchiveError(f"{what} has no good signature by a key in the keyring ({detail})")
    return sorted(set(good))


def _date(fields: dict[str, str], name: str, what: str) -> datetime | None:
    value = fields.get(name)
    if value is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        when = None
    if when is None or when.tzinfo is None:
        raise ArchiveError(f"{what}: {name} {value[:80]!r} is not an RFC 2822 date with a zone")
    return when


def _sha256_list(field: str, what: str) -> dict[str, tuple[str, int]]:
    listed: dict[str, tuple[str, int]] = {}
    for line in field.splitlines():
        words = line.split()
        if not words:
            continue
        if len(words) != 3 or not re.fullmatch(r"[0-9a-f]{64}", words[0]) or not words[1].isdigit():
            raise ArchiveError(f"{what}: SHA256 line {line.strip()[:120]!r} is not '<sha256> <size> <path>'")
        listed[words[2]] = (words[0], int(words[1]))
    return listed


def signed_release(
    client: httpx.Client,
    dists: str,
    suite: str,
    keyring: Path = KEYRING,
    now: float | None = None,
    deadline: float = math.inf,
) -> SignedRelease:
    """The Release of `suite` under `dists` (an archive's …/dists URL), authenticated, read by
    `deadline` (time.monotonic())."""
    base = f"{dists}/{suite}"
    inline = get_bounded(client, f"{base}/InRelease", MAX_RELEASE_BYTES, deadline)
    if inline is not None:
        source, (text, signers) = "InRelease", _verified_text(inline, None, keyring, f"{base}/InRelease")
    else:
        release = get_bounded(client, f"{base}/Release", MAX_RELEASE_BYTES, deadline)
        signature = get_bounded(client, f"{base}/Release.gpg", MAX_SIGNATURE_BYTES, deadline)
        if release is None:
            raise ArchiveError(f"{base} has neither InRelease nor Release")
        if signature is None:
            raise ArchiveError(f"{base}/Release is unsigned (no InRelease, no Release.gpg): refusing its hashes")
        source = "Release + Release.gpg"
        text, signers = _verified_text(release, signature, keyring, f"{base}/Release")
    what = f"the signed {source} of {suite}"
    fields = next(stanzas(text.decode("utf-8", "replace")), {})
    if suite not in (fields.get("Suite"), fields.get("Codename")):
        raise ArchiveError(
            f"{what} is for Suite {fields.get('Suite')!r}, Codename {fields.get('Codename')!r}, not {suite}"
        )
    moment = time.time() if now is None else now
    date, valid_until = _date(fields, "Date", what), _date(fields, "Valid-Until", what)
    if date is None:
        raise ArchiveError(f"{what} has no Date")
    if date.timestamp() > moment:
        raise ArchiveError(f"{what} is dated {fields['Date']}, in the future: not valid yet")
    if valid_until is not None and valid_until.timestamp() < moment:
        raise ArchiveError(f"{what} expired: Valid-Until {fields['Valid-Until']} has passed")
    if "SHA256" not in fields:
        raise ArchiveError(f"{what} lists no SHA256 hashes")
    return SignedRelease(
        suite, fields["Date"], fields.get("Valid-Until"), tuple(signers), source, _sha256_list(fields["SHA256"], what)
    )
