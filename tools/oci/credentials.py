"""Registry credentials where the container ecosystem keeps them, first found wins:

1. `OMNI_REGISTRY_USERNAME` and `OMNI_REGISTRY_PASSWORD`, for the one registry named in
   `OMNI_REGISTRY_HOST` (never sent to another: a CI secret for one registry stays there);
2. `REGISTRY_AUTH_FILE`, else `$XDG_RUNTIME_DIR/containers/auth.json` (podman, skopeo, buildah);
3. Docker's `config.json` (`$DOCKER_CONFIG`, else `~/.docker`): `credHelpers[registry]`, then
   `auths[registry]` (`auth` = base64 user:password, or `username`/`password`,
   `identitytoken`), then `credsStore`. A helper is `docker-credential-<name> get`, given the
   registry on stdin, answering `{"Username", "Secret"}` (the docker-credential-helpers protocol).

Every file and every helper answer is untrusted input: read once, bounded, checked, and a
malformed one is refused naming the file or helper, never guessed around. A secret is never
printed, logged or put on a command line (helpers get the registry on stdin).
"""
from __future__ import annotations

import base64
import binascii
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from tools.oci.errors import OciError

MAX_CONFIG_BYTES = 1 << 20
HELPER_TIMEOUT_S = 30
DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")


@dataclass(frozen=True)
class Credential:
    username: str
    secret: str = field(repr=False)
    source: str  # where it came from, for messages (never the secret)
    identity_token: bool = False  # Docker's identitytoken: an OAuth2 refresh token, not a password


def _keys(registry: str) -> list[str]:
    keys = [registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v1/", f"https://{registry}/v2/"]
    if registry in DOCKER_HUB_KEYS:
        keys += list(DOCKER_HUB_KEYS)
    return keys


def _read_json(path: Path, what: str) -> dict | None:
    from attest.errors import AttestError
    from attest.reader import loads_object

    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OciError(f"{what} {path} cannot be read: {exc.strerror}", field=str(path)) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise OciError(f"{what} {path} is larger than {MAX_CONFIG_BYTES} bytes", field=str(path))
    try:
        return loads_object(data, label=f"{what} {path}")
    except AttestError as exc:
        raise OciError(str(exc), field=str(path)) from None


def _from_entry(entry: object, where: str) -> Credential | None:
    if not isinstance(entry, dict):
        raise OciError(f"{where} is not an object", field=where)
    token = entry.get("identitytoken")
    if "auth" in entry and entry["auth"]:
        try:
            decoded = base64.b64decode(str(entry["auth"]), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
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


def _helper(name: str, registry: str, env: Mapping[str, str]) -> Credential | None:
    from attest.errors import AttestError
    from attest.reader import loads_object

    if not name or "/" in name or name.startswith("."):
        raise OciError(f"credential helper name {name!r} is not a plain name", field="credHelpers")
    program = shutil.which(f"docker-credential-{name}", path=env.get("PATH", os.defpath))
    where = f"docker-credential-{name}"
    if program is None:
        raise OciError(f"{where} (named for {registry} in Docker's config.json) is not on PATH", field=where)
    try:
        done = subprocess.run([program, "get"], input=registry.encode(), capture_output=True,
                              timeout=HELPER_TIMEOUT_S, env=dict(env))
    except subprocess.TimeoutExpired:
        raise OciError(f"{where} did not answer within {HELPER_TIMEOUT_S} s", field=where) from None
    if done.returncode != 0:
        if b"credentials not found" in done.stdout.lower() + done.stderr.lower():
            return None
        # The helper's own words may hold a secret: only the status is reported.
        raise OciError(f"{where} get failed with exit status {done.returncode}", field=where)
    try:
        answer = loads_object(done.stdout[:MAX_CONFIG_BYTES], label=where)
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
    user, password, host = (env.get(name, "") for name in
                            ("OMNI_REGISTRY_USERNAME", "OMNI_REGISTRY_PASSWORD", "OMNI_REGISTRY_HOST"))
    if user or password:
        if not (user and password and host):
            raise OciError("OMNI_REGISTRY_USERNAME and OMNI_REGISTRY_PASSWORD need each other and "
                           "OMNI_REGISTRY_HOST (the one registry they are for)", field="OMNI_REGISTRY_HOST")
        if host == registry:
            return Credential(user, password, "OMNI_REGISTRY_USERNAME/OMNI_REGISTRY_PASSWORD")
    containers = env.get("REGISTRY_AUTH_FILE") or (
        str(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json") if env.get("XDG_RUNTIME_DIR") else "")
    if containers:
        document = _read_json(Path(containers), "registry auth file")
        if document is not None:
            found = _auths(document, registry, Path(containers))
            if found is not None:
                return found
    docker_dir = Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else \
        Path(env.get("HOME", str(Path.home()))) / ".docker"
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
