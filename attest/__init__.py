"""Typed attestation, pin and gate documents and the shared checks on untrusted input behind
them; the bottom floor every other package builds on.

`attest.primitives` holds the small reusable checks (pinned revisions, digests, safe
paths, bounded JSON); `attest.reader` the one bounded reader of untrusted files and JSON;
`attest.documents` the pydantic models; `attest.hashing` parallel file hashing with progress.
What a program needs at its edge (settings, redaction, the refusal line, the probe, HTTP)
lives in `attest.edge`. No module here decides policy: the launcher and boot do.
"""
