"""Where an engine is installed and which commit it was built from, without importing it."""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys

from attest.primitives import REVISION_RE

VERSION_COMMIT_RE = re.compile(r"\+g?([0-9a-f]{40})\b", re.IGNORECASE)


def source_commit(distribution: importlib.metadata.Distribution) -> str:
    """The full commit the wheel was built from: direct_url.json's vcs_info, else a
    40-hex commit embedded in the version's local part (``0.18.0+g<sha>``)."""
    try:
        text = distribution.read_text("direct_url.json")
        if text:
            commit = str(json.loads(text).get("vcs_info", {}).get("commit_id", ""))
            if REVISION_RE.fullmatch(commit):
                return commit.lower()
    except (OSError, json.JSONDecodeError, AttributeError, TypeError):
        pass
    match = VERSION_COMMIT_RE.search(distribution.version or "")
    return match.group(1).lower() if match else ""


def engine_search_path(engine_python: str) -> list[str]:
    """sys.path of the engine's interpreter (ours when it is the same one and we run with
    its site-packages; in images we run with -I -S, isolated from the engine's packages)."""
    if os.path.realpath(engine_python) == os.path.realpath(sys.executable) and not sys.flags.no_site:
        return list(sys.path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        completed = subprocess.run(
            [engine_python, "-c", "import json, sys; print(json.dumps(sys.path))"],
            capture_output=True, text=True, timeout=20, check=True, env=env,
        )
        return [str(item) for item in json.loads(completed.stdout)]
    except (OSError, subprocess.SubprocessError, ValueError):
        return []


def find_distribution(name: str, search_path: list[str]) -> importlib.metadata.Distribution | None:
    found = list(importlib.metadata.distributions(name=name, path=search_path))
    return found[0] if found else None
