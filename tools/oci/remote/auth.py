"""Where a registry's credential may go, and the Authorization its requests carry.

A credential goes only to the registry it was found for: Authorization is attached only to
requests whose origin (scheme, host, port) is the registry's own. A token realm on another host
gets the credential only over https and only within the registry's registrable domain (the
bundled Public Suffix List); otherwise the token is asked for anonymously, and a refusal says
why the credential was withheld. Every token is learned by attest.redact.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import re
import time

import httpx

from attest.redact import learn
from tools.oci.errors import OciError
from tools.oci.remote.bodies import json_object, read_bounded
from tools.oci.remote.credentials import Credential, lookup

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_TOKEN_BYTES = 64 << 10
LOOKUP = object()  # RegistryAuth's default: look the credential up when the registry asks


def is_loopback(registry: str) -> bool:
    """Loopback registries alone are spoken to over plain http."""
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin(url: httpx.URL) -> tuple[str, str, int]:
    """(scheme, host, port) of an absolute URL: where a credential may go."""
    return url.scheme, url.host, url.port or DEFAULT_PORTS.get(url.scheme, 0)


@functools.lru_cache(maxsize=1)
def _public_suffixes():
    from publicsuffixlist import PublicSuffixList  # the bundled list: no network

    return PublicSuffixList()


def _registrable_domain(host: str) -> str | None:
    """example.com for auth.example.com; None for an IP address or a public suffix itself."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return None
    except ValueError:
        pass
    return _public_suffixes().privatesuffix(host.lower().rstrip("."))


def realm_withholds(registry: httpx.URL, realm: httpx.URL) -> str:
    """Why the registry's credential may not go to its token realm ("" when it may)."""
    if origin(realm) == origin(registry):
        return ""
    if realm.scheme != "https":
        return f"the token realm {realm.scheme}://{realm.netloc.decode()} is another host over plain http"
    ours, theirs = _registrable_domain(registry.host), _registrable_domain(realm.host)
    if ours is None or ours != theirs:
        return f"the token realm {realm.host} is not in the registry's registrable domain ({ours or registry.host})"
    return ""


def _realm(registry: str, challenge: str) -> tuple[httpx.URL, dict[str, str]]:
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if "realm" not in fields:
        raise OciError(f"{registry}: unsupported auth challenge {challenge!r}", field="registry")
    try:
        realm = httpx.URL(fields["realm"])
    except httpx.InvalidURL:
        realm = None
    if realm is None or realm.scheme not in ("http", "https") or not realm.host:
        raise OciError(f"{registry}: the token realm {fields['realm']!r} is not an http(s) URL", field="registry")
    return realm, fields


class RegistryAuth:
    """One registry's credential (looked up when the registry first asks) and what it earned:
    a bearer token per scope, or the Basic header."""

    def __init__(self, registry: str, client: httpx.Client, credential: Credential | None | object = LOOKUP) -> None:
        self.registry = registry
        self._client = client
        self._credential = credential
        self._basic: str | None = None
        self._tokens: dict[str, str] = {}

    def credential(self) -> Credential | None:
        if self._credential is LOOKUP:
            self._credential = lookup(self.registry)
        return self._credential  # type: ignore[return-value]

    def refused(self, credential: Credential | None, status: int, scope: str) -> OciError:
        if credential is None:
            return OciError(
                f"{self.registry} requires credentials for {scope} (HTTP {status}) and none were found: "
                "`docker login`/`podman login`, a credential helper, or OMNI_REGISTRY_USERNAME, "
                "OMNI_REGISTRY_PASSWORD and OMNI_REGISTRY_HOST",
                field="registry",
            )
        return OciError(
            f"{self.registry} refused the credentials from {credential.source} for {scope} (HTTP {status})",
            field="registry",
        )

    def known(self, scope: str) -> str | None:
        """The Authorization already earned for `scope`, if any."""
        if scope in self._tokens:
            return f"Bearer {self._tokens[scope]}"
        return self._basic

    def answer(self, response: httpx.Response, scope: str, deadline_s: float) -> str | None:
        """The Authorization to send again with after a 401 challenge (the response is then
        closed), or None when there is nothing to answer."""
        challenge = response.headers.get("WWW-Authenticate", "")
        if response.status_code != 401:
            return None
        if challenge.lower().startswith("bearer") and scope not in self._tokens:
            response.close()
            self._tokens[scope] = self._token(challenge, scope, deadline_s)
            return f"Bearer {self._tokens[scope]}"
        if challenge.lower().startswith("basic"):
            response.close()
            credential = self.credential()
            sent = response.request.headers.get("Authorization") if response.request is not None else None
            if self._basic and sent != self._basic:
                return self._basic  # another thread earned it while this request went out bare
            if credential is None or self._basic:
                raise self.refused(credential, 401, scope)
            pair = f"{credential.username}:{credential.secret}".encode()
            self._basic = "Basic " + base64.b64encode(pair).decode()
            return self._basic
        return None

    def _token(self, challenge: str, scope: str, deadline_s: float) -> str:
        realm, fields = _realm(self.registry, challenge)
        params = {"scope": scope, **({"service": fields["service"]} if "service" in fields else {})}
        withheld = realm_withholds(self._client.base_url, realm)
        credential = self.credential() if not withheld else None
        deadline = time.monotonic() + deadline_s
        if credential is not None and credential.identity_token:
            # Docker's identity token is an OAuth2 refresh token (distribution's token spec).
            refresh = {"grant_type": "refresh_token", "refresh_token": credential.secret, "client_id": "omni"}
            ask = {"method": "POST", "data": {**params, **refresh}}
        else:
            basic = (credential.username, credential.secret) if credential is not None else None
            ask = {"method": "GET", "params": params, "auth": basic}
        try:
            with self._client.stream(url=realm, timeout=30, follow_redirects=False, **ask) as response:
                status = response.status_code
                data = read_bounded(response, MAX_TOKEN_BYTES, f"{self.registry} token", deadline=deadline)
        except httpx.TimeoutException as exc:
            raise OciError(f"{self.registry}: token service did not answer in time: {exc}", field="registry") from None
        except httpx.HTTPError as exc:
            raise OciError(
                f"{self.registry}: token service cannot be reached: {type(exc).__name__}", field="registry"
            ) from None
        if status in (401, 403):
            if withheld:
                raise OciError(
                    f"{self.registry}: the token service refused an anonymous request for {scope} "
                    f"(HTTP {status}); the registry's credential was withheld: {withheld}",
                    field="registry",
                )
            raise self.refused(credential, status, scope)
        if status != 200:
            raise OciError(f"{self.registry}: token service answered HTTP {status} for {scope}", field="registry")
        body = json_object(data, f"{self.registry} token response")
        token = body.get("token") or body.get("access_token") or ""
        token = token if isinstance(token, str) else ""
        learn(token)
        return token
