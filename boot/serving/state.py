"""State files under STATE_PATH: JSON written atomically, the API key file at 0600."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attest.files import write_atomic

API_KEY_FILE = "api-key"


def save(state: Path, name: str, value: Any) -> Path:
    path = state / name
    write_atomic(path, (json.dumps(value, indent=2) + "\n").encode("utf-8"))
    return path


def load(state: Path, name: str) -> Any:
    path = state / name
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def store_api_key(state: Path, key: str) -> Path:
    """The key file is 0600 from its first byte (never briefly world-readable)."""
    path = state / API_KEY_FILE
    write_atomic(path, key.encode("utf-8"), mode=0o600)
    return path
