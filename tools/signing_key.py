"""The release signing key the programs sign with: --signing-key, else OMNI_SIGNING_KEY_FILE,
else OMNI_SIGNING_KEY (PEM text), with OMNI_SIGNING_KEY_PASSWORD; the variables are read here,
never in the library (omni_oci.signing.keys parses the key).
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from omni_oci.format.errors import OciError
from omni_oci.signing.keys import load_private_key, private_key_from_pem
from tools.settings import SIGNING_KEY, SIGNING_KEY_FILE, SIGNING_KEY_PASSWORD


def release_signing_key(path: Path | None = None) -> ec.EllipticCurvePrivateKey:
    """The key `path` names (--signing-key), else the one the variables give; refused when none."""
    password = os.environ.get(SIGNING_KEY_PASSWORD, "").encode() or None
    if path is not None or os.environ.get(SIGNING_KEY_FILE):
        source = str(path) if path is not None else os.environ[SIGNING_KEY_FILE]
        field = "--signing-key" if path is not None else SIGNING_KEY_FILE
        # A relative path means what it meant where the user typed it (`bazel run` changes directory).
        where = Path(os.environ.get("BUILD_WORKING_DIRECTORY", ".")) / source
        return load_private_key(where, password, field)
    if os.environ.get(SIGNING_KEY):
        return private_key_from_pem(os.environ[SIGNING_KEY].encode(), SIGNING_KEY, password)
    raise OciError(
        "no signing key: set OMNI_SIGNING_KEY_FILE (or OMNI_SIGNING_KEY, or --signing-key), or push with --unsigned",
        field="OMNI_SIGNING_KEY_FILE",
    )
