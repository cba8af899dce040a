"""The Python toolchain and the locked packages agree: tests run on the interpreter the
wheels were installed for, native wheels load, and the packages come from the lock."""

from __future__ import annotations

import http.server
import os
import re
import sys
import threading
from pathlib import Path

import httpx
import pydantic
import pydantic_core


def _locked_versions() -> dict[str, str]:
    lock = Path("requirements.lock")
    pairs = re.findall(r"^([A-Za-z0-9._-]+)==(\S+) \\$", lock.read_text(), flags=re.M)
    return {name.lower().replace("_", "-"): version for name, version in pairs}


def test_runs_on_the_interpreter_the_wheels_were_installed_for():
    recorded = Path(os.environ["PYPI_INTERPRETER_RECORD"]).read_text().strip()
    assert os.path.realpath(sys.executable) == recorded


def test_packages_are_the_locked_versions():
    locked = _locked_versions()
    assert pydantic.VERSION == locked["pydantic"]
    assert pydantic_core.__version__ == locked["pydantic-core"]
    assert httpx.__version__ == locked["httpx"]


def test_pydantic_rejects_unknown_fields_strictly():
    class Doc(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", strict=True)
        revision: str

    assert Doc(revision="a").revision == "a"
    for bad in ({"revision": 1}, {"revision": "a", "extra": 1}, {}):
        try:
            Doc.model_validate(bad)
        except pydantic.ValidationError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_httpx_reaches_a_loopback_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        response = httpx.get(f"http://127.0.0.1:{server.server_port}/", timeout=5)
        assert response.json() == {"ok": True}
    finally:
        server.shutdown()
