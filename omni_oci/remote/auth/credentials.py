"""Registry credentials where the container ecosystem keeps them, first found wins:

1. `OMNI_REGISTRY_USERNAME` and `OMNI_REGISTRY_PASSWORD`, for the one registry named in
   `OMNI_REGISTRY_HOST` (never sent to another: a CI secret for one registry stays there);
2. `REGISTRY_AUTH_FILE`, else `$XDG_RUNTIME_DIR/containers/auth.json` (podman, skopeo, buildah);
3. Docker's `config.json` (`$DOCKER_CONFIG`, else `~/.docker`): `credHelpers[registry]`, then
   `auths[registry]` (`auth` = base64 user:password, or `username`/`password`,
   `identitytoken`), then `credsStore`. A helper is `docker-credential-<name> get`, given the
   registry on stdin, answering `{"Username", "Secret"}` (the docker-credential-helpers protocol).

Every file and every helper answer is untrusted input: read once, bounded, checked, and a
malformed one is refused naming the file or helper, never guessed around. Files go through
attest.reader (a FIFO or device is refused, not waited on). A helper has HELPER_DEADLINE_S in
all, its answer is capped at MAX_HELPER_OUTPUT bytes, it runs in a process group of its own
that is killed at the deadline (a child left holding its output cannot keep us waiting), and
a helper that failed is not asked again in the same run. A secret is never printed, logged or
put on a command line (helpers get the registry on stdin), and every secret found is learned
by attest.edge.redact, so no later line can print it.
"""

from __future__ import annotations

import base64
import binascii
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from attest.edge.redact import learn, learn_basic
from omni_oci.format.errors import OciError

MAX_CONFIG_BYTES = 1 << 20
HELPER_DEADLINE_S = 10.0
MAX_HELPER_OUTPUT = 64 << 10
# After the helper exits, how long a child it left holding its output may keep the pipe open.
HELPER_LINGER_S = 0.5
DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")


@dataclass(frozen=True)
class Credential:
    username: str
    secret: str = field(repr=False)
    source: str  # where it came from, for messages (never the secret)
    identity_token: bool = False  # Docker's identitytoken: an OAuth2 refresh token, not a password

    def __post_init__(self) -> None:
        learn_basic(self.username, self.secret)


def _keys(registry: str) -> list[str]:
    keys = [registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v1/", f"https://{registry}/v2/"]
    if registry in DOCKER_HUB_KEYS:
        keys += list(DOCKER_HUB_KEYS)
    return keys


def _read_json(path: Path, what: str) -> dict | None:
    from attest.errors import AttestError
    from attest.reader import loads_object, read_file

    if not os.path.lexists(path):
        return None
    try:
        read = read_file(path, label=f"{what} {path}", max_bytes=MAX_CONFIG_BYTES)
        return loads_object(read.data, label=f"{what} {path}")
    except AttestError as exc:
        raise OciError(str(exc), field=str(path)) from None


def _from_entry(entry: object, where: str) -> Credential | None:
    if not isinstance(entry, dict):
        raise OciError(f"{where} is not an object", field=where)
    token = entry.get("identitytoken")
    if "auth" in entry and entry["auth"]:
        auth = entry["auth"]
        if not isinstance(auth, str) or not auth.isascii():
            raise OciError(f"{where}.auth is not base64 of user:password (expected an ASCII string)", field=where)
        learn(auth)
        try:
            decoded = base64.b64decode(auth, validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise OciError(f"{where}.auth is not base64 of user:password", field=where) from None
        username, colon, secret = decoded.partition(":")
        if not colon:
            raise OciError(f"{where}.auth is not base64 of user:password", field=where)
        if token:
            return Credential(username, str(token), where, identity_token=True)
        return Credential(username, secret, where)
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return Credential(entry["username"], entry["password"], where)
    if isinstance(token, str) and token:
        return Credential("<token>", token, where, identity_token=True)
    return None  # an entry that only names the registry (credentials elsewhere)


def _entry_for(document: dict, section: str, registry: str, path: Path) -> tuple[str, object] | None:
    """The (key, value) of `document[section]` for `registry` under any of its spellings."""
    table = document.get(section)
    table = {} if table is None else table
    if not isinstance(table, dict):
        raise OciError(f"{path}: {section} is not an object", field=str(path))
    return next(((key, table[key]) for key in _keys(registry) if key in table), None)


def _auths(document: dict, registry: str, path: Path) -> Credential | None:
    found = _entry_for(document, "auths", registry, path)
    return _from_entry(found[1], f"{path} auths[{found[0]!r}]") if found else None


_helper_answers: dict[tuple, Credential | None | OciError] = {}
_helper_lock = threading.Lock()


def _run_helper(program: str, registry: str, env: Mapping[str, str], where: str) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of `program get`, within HELPER_DEADLINE_S in all and
    MAX_HELPER_OUTPUT bytes per stream; its whole process group is killed when it is done.
    By hand, not subprocess.run: run's timeout waits for every holder of the pipes to close
    them and reads without a cap."""
    process = subprocess.Popen(
        [program, "get"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
    )
    ends = time.monotonic() + HELPER_DEADLINE_S
    output = {process.stdout: bytearray(), process.stderr: bytearray()}
    try:
        try:
            process.stdin.write(registry.encode())  # type: ignore[union-attr]
            process.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass
        with selectors.DefaultSelector() as selector:
            for stream in output:
                os.set_blocking(stream.fileno(), False)  # type: ignore[union-attr]
                selector.register(stream, selectors.EVENT_READ)
            exited_at = None
            while selector.get_map():
                now = time.monotonic()
                if process.poll() is not None:
                    exited_at = exited_at or now
                    if now - exited_at > HELPER_LINGER_S:
                        break  # a child of the helper holds the pipe: the answer is what came
                if now > ends:
                    raise OciError(f"{where} did not answer within {HELPER_DEADLINE_S:g} s", field=where)
                for key, _ in selector.select(timeout=min(0.1, max(ends - now, 0.01))):
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    output[key.fileobj] += chunk
                    if len(output[key.fileobj]) > MAX_HELPER_OUTPUT:
                        raise OciError(f"{where} answered more than {MAX_HELPER_OUTPUT} bytes", field=where)
        remaining = max(ends - time.monotonic(), 0.01)
        try:
            status = process.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            raise OciError(f"{where} did not exit within {HELPER_DEADLINE_S:g} s", field=where) from None
        return status, bytes(output[process.stdout]), bytes(output[process.stderr])
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the helper's children too
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
        for stream in output:
            stream.close()  # type: ignore[union-attr]


def _helper(name: str, registry: str, env: Mapping[str, str]) -> Credential | None:
    """The helper's answer for `registry`, asked at most once per run (a failure is kept too).
    A helper is the program found on PATH as it is now: another file is another helper."""
    if not name or "/" in name or name.startswith("."):
        raise OciError(f"credential helper name {name!r} is not a plain name", field="credHelpers")
    program = shutil.which(f"docker-credential-{name}", path=env.get("PATH", os.defpath))
    try:
        identity = os.stat(program) if program else None
    except OSError:
        identity = None
    key = (name, program, identity and (identity.st_ino, identity.st_mtime_ns, identity.st_size), registry)
    with _helper_lock:
        if key not in _helper_answers:
            try:
                _helper_answers[key] = _ask_helper(name, program, registry, env)
            except OciError as exc:
                _helper_answers[key] = exc
        answer = _helper_answers[key]
    if isinstance(answer, OciError):
        raise answer
    return answer


def _ask_helper(name: str, program: str | None, registry: str, env: Mapping[str, str]) -> Credential | None:
    from attest.errors import AttestError
    from attest.reader import loads_object

    where = f"docker-credential-{name}"
    if program is None:
        raise OciError(f"{where} (named for {registry} in Docker's config.json) is not on PATH", field=where)
    status, stdout, stderr = _run_helper(program, registry, env, where)
    if status != 0:
        if b"credentials not found" in stdout.lower() + stderr.lower():
            return None
        # The helper's own words may hold a secret: only the status is reported.
        raise OciError(f"{where} get failed with exit status {status}", field=where)
    try:
        answer = loads_object(stdout, label=where)
    except AttestError:
        raise OciError(f"{where} answered something that is not a JSON object", field=where) from None
    username, secret = answer.get("Username"), answer.get("Secret")
    if not isinstance(username, str) or not isinstance(secret, str) or not secret:
        raise OciError(f"{where} answered without a Username and Secret", field=where)
    if username == "<token>":
        return Credential(username, secret, where, identity_token=True)
    return Credential(username, secret, where)


def lookup(registry: str, env: Mapping[str, str] | None = None) -> Credential | None:
    """The credential for `registry` (host[:port]), or None for anonymous access."""
    env = os.environ if env is None else env
    user, password, host = (
        env.get(name, "") for name in ("OMNI_REGISTRY_USERNAME", "OMNI_REGISTRY_PASSWORD", "OMNI_REGISTRY_HOST")
    )
    if user or password:
        if not (user and password and host):
            raise OciError(
                "OMNI_REGISTRY_USERNAME and OMNI_REGISTRY_PASSWORD need each other and "
                "OMNI_REGISTRY_HOST (the one registry they are for)",
                field="OMNI_REGISTRY_HOST",
            )
        if host == registry:
            return Credential(user, password, "OMNI_REGISTRY_USERNAME/OMNI_REGISTRY_PASSWORD")
    containers = env.get("REGISTRY_AUTH_FILE") or (
        str(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json") if env.get("XDG_RUNTIME_DIR") else ""
    )
    if containers:
        document = _read_json(Path(containers), "registry auth file")
        if document is not None:
            found = _auths(document, registry, Path(containers))
            if found is not None:
                return found
    docker_dir = (
        Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else Path(env.get("HOME", str(Path.home()))) / ".docker"
    )
    document = _read_json(docker_dir / "config.json", "Docker config")
    if document is None:
        return None
    helper = _entry_for(document, "credHelpers", registry, docker_dir / "config.json")
    if helper is not None:
        return _helper(str(helper[1]), registry, env)
    found = _auths(document, registry, docker_dir / "config.json")
    if found is not None:
        return found
    store = document.get("credsStore")
    return _helper(str(store), registry, env) if store else None
