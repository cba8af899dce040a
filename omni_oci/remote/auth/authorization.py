"""Where a registry's credential may go, and the Authorization its requests carry.

A credential goes only to the registry it was found for: Authorization is attached only to
requests whose origin (scheme, host, port) is the registry's own. A token realm on another host
gets the credential only over https and only within the registry's registrable domain (the
bundled Public Suffix List); otherwise the token is asked for anonymously, and a refusal says
why the credential was withheld. Every token is learned by attest.edge.redact.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import re
import threading
import time

import httpx

from attest.edge.bodies import read_bounded
from attest.edge.redact import learn
from omni_oci.format.errors import OciError, refusing_object
from omni_oci.remote.auth.credentials import Credential, lookup
from omni_oci.remote.auth.tokens import Token, covers, lifetime, merged

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


def parameters(challenge: str) -> dict[str, str]:
    """The quoted parameters of a WWW-Authenticate challenge (realm, service, scope)."""
    return dict(re.findall(r'(\w+)="([^"]*)"', challenge))


def _realm(registry: str, challenge: str) -> tuple[httpx.URL, dict[str, str]]:
    """The token realm (an http(s) URL) and the parameters of a Bearer challenge."""
    fields = parameters(challenge)
    if "realm" not in fields:
        raise OciError(f"{registry}: unsupported auth challenge {challenge[:200]!r}", field="registry")
    try:
        realm = httpx.URL(fields["realm"])
    except httpx.InvalidURL:
        realm = None
    if realm is None or realm.scheme not in ("http", "https") or not realm.host:
        raise OciError(f"{registry}: the token realm {fields['realm']!r} is not an http(s) URL", field="registry")
    return realm, fields


class RegistryAuth:
    """One registry's credential (looked up when the registry first asks) and what it earned:
    bearer tokens per request scope (each with its life, omni_oci.remote.auth.tokens), or the Basic
    header. Upload threads share it: a token ending is asked for again once, not per thread."""

    def __init__(self, registry: str, client: httpx.Client, credential: Credential | None | object = LOOKUP) -> None:
        self.registry = registry
        self._client = client
        self._credential = credential
        self._basic: str | None = None
        self._tokens: dict[tuple[str, ...], Token] = {}
        self._challenge = ""  # the last Bearer challenge: where a token ending is asked for again
        self._lock = threading.Lock()
        self.tokens_issued = 0  # for tests and summaries

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
                final=True,
            )
        return OciError(
            f"{self.registry} refused the credentials from {credential.source} for {scope} (HTTP {status})",
            field="registry",
            final=True,
        )

    def refused_token(self, response: httpx.Response, scopes: tuple[str, ...]) -> OciError:
        """A 401 to a request that carried a token just issued for it: the registry will not have it."""
        fields = parameters(response.headers.get("WWW-Authenticate", ""))
        asked = f"; it asks for {fields['scope'][:200]!r}" if fields.get("scope") else ""
        return OciError(
            f"{self.registry} refused a fresh token for {' '.join(scopes)} (HTTP 401 again){asked}",
            field="registry",
            final=True,
        )

    def known(self, scopes: tuple[str, ...], deadline_s: float) -> str | None:
        """The Authorization to send with a request needing `scopes`: its token (asked for again
        when it is about to end), else the Basic header, else None."""
        with self._lock:
            token = self._tokens.get(scopes)
            if token is None:
                # A token earned for more (pull and push) serves a request needing less (pull).
                wider = (t for t in self._tokens.values() if t.fresh() and covers(t.scopes, scopes))
                token = next(wider, None)
                return token.authorization if token else self._basic
            if not token.fresh():
                token = self._tokens[scopes] = self._token(self._challenge, token.scopes, deadline_s)
            return token.authorization

    def answer(self, response: httpx.Response, scopes: tuple[str, ...], deadline_s: float) -> str | None:
        """The Authorization to send again with after a 401 challenge (the response is then
        closed), or None when there is nothing to answer. A Bearer challenge always earns a new
        token, for the union of the request's scopes and the challenge's: an expired, rotated or
        too narrow token is replaced (unless another thread already replaced it)."""
        challenge = response.headers.get("WWW-Authenticate", "")
        if response.status_code != 401:
            return None
        sent = response.request.headers.get("Authorization") if response.request is not None else None
        if challenge.lower().startswith("bearer"):
            response.close()
            _, fields = _realm(self.registry, challenge)
            wanted = merged((*scopes, fields.get("scope", "")), f"{self.registry}: the auth challenge")
            with self._lock:
                self._challenge = challenge
                current = self._tokens.get(scopes)
                if current and current.authorization != sent and current.fresh() and covers(current.scopes, wanted):
                    return current.authorization  # another thread earned it while this request was out
                self._tokens[scopes] = self._token(challenge, wanted, deadline_s)
                return self._tokens[scopes].authorization
        if challenge.lower().startswith("basic"):
            response.close()
            credential = self.credential()
            if self._basic and sent != self._basic:
                return self._basic  # another thread earned it while this request went out bare
            if credential is None or self._basic:
                raise self.refused(credential, 401, " ".join(scopes))
            pair = f"{credential.username}:{credential.secret}".encode()
            self._basic = "Basic " + base64.b64encode(pair).decode()
            return self._basic
        return None

    def _token(self, challenge: str, scopes: tuple[str, ...], deadline_s: float) -> Token:
        realm, fields = _realm(self.registry, challenge)
        scope = " ".join(scopes)
        params = {"scope": list(scopes), **({"service": fields["service"]} if "service" in fields else {})}
        withheld = realm_withholds(self._client.base_url, realm)
        credential = self.credential() if not withheld else None
        asked = time.monotonic()
        deadline = asked + deadline_s
        if credential is not None and credential.identity_token:
            # Docker's identity token is an OAuth2 refresh token (distribution's token spec),
            # whose POST form takes the scopes space-separated.
            refresh = {"grant_type": "refresh_token", "refresh_token": credential.secret, "client_id": "omni"}
            ask = {"method": "POST", "data": {**params, "scope": scope, **refresh}}
        else:
            basic = (credential.username, credential.secret) if credential is not None else None
            ask = {"method": "GET", "params": params, "auth": basic}
        try:
            with self._client.stream(url=realm, timeout=30, follow_redirects=False, **ask) as response:
                status = response.status_code
                data = read_bounded(
                    response, MAX_TOKEN_BYTES, f"{self.registry} token", deadline=deadline, error=OciError
                )
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
                    final=True,
                )
            raise self.refused(credential, status, scope)
        if status != 200:
            raise OciError(f"{self.registry}: token service answered HTTP {status} for {scope}", field="registry")
        where = f"{self.registry} token response"
        body = refusing_object(data, where)
        value = body.get("token") or body.get("access_token")
        if not isinstance(value, str) or not value:
            raise OciError(f"{where}: no token for {scope} (neither token nor access_token)", field="registry")
        learn(value)
        self.tokens_issued += 1
        return Token(value, scopes, asked, lifetime(body, where))
