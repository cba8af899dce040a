"""Typed attestation, pin and gate documents and the shared checks behind them; the base every
other package builds on. It must not import `launcher`, `boot`, `tools` or `tests`.

`attest.primitives` holds the small reusable checks (pinned revisions, digests, safe
paths, bounded JSON); `attest.documents` the pydantic models; `attest.hashing` parallel
file hashing with progress; `attest.transport` the HTTP transport with one deadline per
answer that boot's hub traffic and the registry client share. No module here decides
policy: the launcher and boot do.
"""
