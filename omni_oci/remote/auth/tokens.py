"""Bearer tokens of the distribution token spec: the scopes a request needs, merged with those a
challenge asks for; a token's life from `expires_in`, used until shortly before it ends.

The spec: a token service answers `{"token": ..., "expires_in": seconds}` (an omitted
`expires_in` means 60 s), and a registry's 401 challenge names in `scope` (space-separated
`type:name:actions`) everything the request needs, e.g. pull on the source repository of a
cross-repository mount. Clients ask again on any challenge (go-containerregistry: "expired
tokens or insufficient scope"); Omni also asks before a token ends, so a request is not first
refused for a token it knew was ending.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from omni_oci.format.errors import OciError

DEFAULT_LIFETIME_S = 60  # the token spec's default when the answer has no expires_in
MAX_LIFETIME_S = 24 * 3600  # a longer promise is held to a day: asking again costs one request
REFRESH_AHEAD_S = 10.0  # a token is replaced this long before its end (half its life, when shorter)
MAX_SCOPES = 16  # a challenge asking for more resources than this is refused
# The token spec's scope grammar: resourcetype[(class)] ":" resourcename ":" action[,action]...
# (the name may hold ":" itself, e.g. a host:port prefix; it is split at the last ":").
SCOPE_RE = re.compile(r"([a-z0-9]+(?:\([a-z0-9]+\))?):(\S{1,255}):([a-z*]+(?:,[a-z*]+)*)")


def merged(scopes: tuple[str, ...] | list[str], where: str) -> tuple[str, ...]:
    """The union of `scopes` (each may hold several, space-separated): one per resource, its
    actions merged, sorted. A scope outside the spec's grammar is refused naming `where`."""
    actions: dict[str, set[str]] = {}
    for item in " ".join(scopes).split():
        found = SCOPE_RE.fullmatch(item)
        if found is None:
            raise OciError(f"{where}: scope {item[:120]!r} is not type:name:actions", field="registry")
        resource = f"{found.group(1)}:{found.group(2)}"
        actions.setdefault(resource, set()).update(found.group(3).split(","))
    if len(actions) > MAX_SCOPES:
        raise OciError(f"{where}: asks for {len(actions)} scopes; at most {MAX_SCOPES}", field="registry")
    return tuple(f"{resource}:{','.join(sorted(acts))}" for resource, acts in sorted(actions.items()))


def covers(granted: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    """Whether a token asked for `granted` was asked for everything in `wanted` (both merged)."""
    have = {scope.rpartition(":")[0]: set(scope.rpartition(":")[2].split(",")) for scope in granted}
    return all(
        set(scope.rpartition(":")[2].split(",")) <= have.get(scope.rpartition(":")[0], set()) for scope in wanted
    )


@dataclass(frozen=True)
class Token:
    value: str
    scopes: tuple[str, ...]
    issued: float  # time.monotonic() when it was asked for: its life counts from before the answer
    lifetime_s: float

    @property
    def authorization(self) -> str:
        return f"Bearer {self.value}"

    def fresh(self, now: float | None = None) -> bool:
        """Still to be used: not within REFRESH_AHEAD_S (or half its life) of its end."""
        ahead = min(REFRESH_AHEAD_S, self.lifetime_s / 2)
        return (time.monotonic() if now is None else now) < self.issued + self.lifetime_s - ahead


def lifetime(body: dict, where: str) -> float:
    """`expires_in` of a token answer: a positive integer of seconds (absent: the spec's 60)."""
    value = body.get("expires_in", DEFAULT_LIFETIME_S)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise OciError(f"{where}: expires_in must be a positive integer of seconds, not {value!r}", field="registry")
    return float(min(value, MAX_LIFETIME_S))
