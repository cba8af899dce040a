"""Typed attestation, pin and gate documents and the shared checks behind them.

`attest.primitives` holds the small reusable checks (pinned revisions, digests, safe
paths, bounded JSON); `attest.documents` the pydantic models; `attest.hashing` parallel
file hashing with progress. No module here decides policy: the launcher and boot do.
"""
