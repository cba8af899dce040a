"""The registry client against a token-authenticated registry on loopback (a scripted token
front before a real docker-registry, tests/fixtures/token_registry.py): pushes and pulls that
outlive two token lifetimes, tokens rotated early, a cross-repository mount that the challenge's
scope makes a mount, a token service that keeps refusing; the referrers API over three pages
and hostile pages; Retry-After on 429 and 503."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from omni_oci.format.errors import OciError
from omni_oci.format.layout import OCI_MANIFEST, read_layout
from omni_oci.remote import referrers as referrers_module
from omni_oci.remote.push import push
from omni_oci.remote.referrers import push_referrer, referrers
from omni_oci.remote.registry import RegistryClient
from omni_oci.remote.shallow_base import fetch_base
from omni_oci.signing.bundles import SIGN_PREDICATE, push_bundle, signed_statements, statement
from omni_oci.signing.keys import load_private_key
from tests.fixtures.bounds import ended_long_before
from tests.fixtures.oci import make_image, make_layer
from tests.fixtures.pins import key_pair
from tests.fixtures.registry import no_credentials
from tests.fixtures.token_registry import TokenRegistry

USER, PASSWORD = "omni-ci", "t0ken-Pa55"


@pytest.fixture
def login(tmp_path: Path, monkeypatch):
    """A TokenRegistry whose token service wants USER's password, and that credential in the
    environment for its host alone."""
    no_credentials(tmp_path / "home", monkeypatch)

    @contextmanager
    def running(**options) -> Iterator[TokenRegistry]:
        with TokenRegistry(users={USER: PASSWORD}, **options) as front:
            for name, value in (("USERNAME", USER), ("PASSWORD", PASSWORD), ("HOST", front.host)):
                monkeypatch.setenv(f"OMNI_REGISTRY_{name}", value)
            yield front

    return running


def _image(work: Path, name: str, layers: int = 3, size: int = 40_000) -> Path:
    made = [
        make_layer(work, f"{name}-{i}", {f"/opt/{name}/{i}.bin": bytes([i]) * size + name.encode()})
        for i in range(layers)
    ]
    make_image(work / name, made, entrypoint=["/bin/true"])
    return work / name


def _pull(client: RegistryClient, repository: str, digest: str) -> int:
    """Every blob of the image, as the tools read them (documents whole, layers streamed and
    verified); how many layers arrived whole."""
    manifest = json.loads(client.manifest(repository, digest)[0])
    client.blob(repository, manifest["config"]["digest"], size=manifest["config"]["size"])
    whole = 0
    for layer in manifest["layers"]:
        whole += sum(len(c) for c in client.stream_blob(repository, layer["digest"], layer["size"])) == layer["size"]
    return whole


def test_a_push_and_a_pull_outlive_two_token_lifetimes(tmp_path: Path, login) -> None:
    with login(lifetime_s=1, delay_s=0.15) as front:
        layout = _image(tmp_path, "app", layers=4)
        started = time.monotonic()
        report = push(layout, f"{front.host}/omni/app:1")
        pushed_in = time.monotonic() - started
        assert len(report.uploaded) == 5 and pushed_in > 2 * front.lifetime_s
        started = time.monotonic()
        with RegistryClient(front.host) as client:
            for _ in range(2):
                assert _pull(client, "omni/app", report.digest) == 4
        assert time.monotonic() - started > 2 * front.lifetime_s
        # Each token was replaced before it ended: the registry never saw an expired one.
        assert front.refusals["expired"] == 0, front.refusals
        assert len(front.issued) >= 4, front.issued


def test_tokens_revoked_before_their_promised_end_are_asked_for_again(tmp_path: Path, login) -> None:
    with login(lifetime_s=300, revoke_after_s=0.6, delay_s=0.1) as front:
        report = push(_image(tmp_path, "app", layers=4), f"{front.host}/omni/app:1")
        with RegistryClient(front.host) as client:
            assert _pull(client, "omni/app", report.digest) == 4
        assert front.refusals["expired"] >= 1 and len(front.issued) >= 2, (front.refusals, front.issued)


def test_a_mount_across_repositories_is_a_mount(tmp_path: Path, login) -> None:
    with login() as front:
        base = _image(tmp_path, "vendor", layers=1, size=300_000)
        base_digest = push(base, f"{front.host}/vendor/base:1").digest
        fetch_base(f"{front.host}/vendor/base", base_digest, "linux/amd64", tmp_path / "shallow")
        make_image(tmp_path / "app", [make_layer(tmp_path, "app", {"/opt/x": "x"})], base=tmp_path / "shallow")
        report = push(tmp_path / "app", f"{front.host}/omni/app:1")
        base_layer = json.loads((tmp_path / "shallow" / "manifest.json").read_text())["layers"][0]["digest"]
        assert report.mounted == [base_layer] and base_layer not in report.uploaded
        # The mount was refused for scope once, and the token then asked covered the source too.
        assert front.refusals["insufficient scope"] >= 1
        assert any("repository:vendor/base:pull" in scopes for scopes in front.issued), front.issued


def test_a_token_service_that_keeps_refusing_is_refused_naming_the_scope(login) -> None:
    with login(refuse_tokens=True) as front, RegistryClient(front.host) as client:
        with pytest.raises(OciError) as refused:
            client.manifest("omni/app", "latest")
    message = str(refused.value)
    assert front.host in message and "repository:omni/app:pull" in message and "HTTP 401" in message
    assert PASSWORD not in message


def test_a_registry_that_refuses_a_fresh_token_is_refused_naming_registry_and_scope(login, monkeypatch) -> None:
    with login() as front, RegistryClient(front.host) as client:
        listing = client.request("GET", "/v2/omni/app/tags/list", repository="omni/app")
        assert listing.status_code == 404  # a token earned and taken: the repository is empty
        monkeypatch.setattr(front, "admit", lambda authorization, needs: "insufficient scope")
        with pytest.raises(OciError, match="refused a fresh token for repository:omni/app:pull") as refused:
            client.manifest("omni/app", "latest")
        # The cached token dropped, one new one asked for and refused: no third ask, no retry.
        assert front.host in str(refused.value) and len(front.issued) == 2


# --- referrers, every page ----------------------------------------------------------------


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    """An image with four filler referrers and then its signature bundle, behind the front."""
    work = tmp_path_factory.mktemp("paged")
    with TokenRegistry() as front:
        layout = _image(work, "app", layers=1)
        digest = push(layout, f"{front.host}/omni/app:1").digest
        subject = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(read_layout(layout)[2])}
        private, public = key_pair(work, "signer")
        key = load_private_key(private)
        with RegistryClient(front.host) as client:
            for i in range(4):
                push_referrer(client, "omni/app", subject, "application/vnd.example.note", b"%d" % i, "text/plain")
            signature = push_bundle(client, "omni/app", subject, key, statement(digest, SIGN_PREDICATE, {}))
        yield front, digest, signature, public


def _public(path: Path):
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    return load_pem_public_key(path.read_bytes())


def test_referrers_over_three_pages_verify_with_the_signature_on_the_last(paged) -> None:
    front, digest, signature, public = paged
    front.referrer_pages, front.page_hook = 3, None
    front.pages_served.clear()
    with RegistryClient(front.host) as client:
        listed, how = referrers(client, "omni/app", digest)
        statements = signed_statements(client, "omni/app", digest, _public(public))
    assert how == "api" and [item["digest"] for item in listed][-1] == signature and len(listed) == 5
    assert len(front.pages_served) == 6 and signature in front.pages_served[2]  # twice three pages
    assert statements is not None and SIGN_PREDICATE in statements


def _replace(page: int, body: bytes = b"", status: int = 200, **headers: str):
    def hook(number: int, answer):
        if number != page:
            return answer
        return status, {**answer[1], **headers}, body or answer[2]

    return hook


def _link(target: str):
    def hook(number: int, answer):
        return answer[0], {**answer[1], "Link": f'<{target}>; rel="next"'}, answer[2]

    return hook


HOSTILE_PAGES = [
    ("a list, not an index", _replace(2, b"[1]"), "page 2"),
    ("not JSON", _replace(2, b"{not json"), "page 2"),
    ("a duplicate key", _replace(3, b'{"manifests": [], "manifests": []}'), "page 3"),
    ("descriptors without a digest", _replace(2, b'{"manifests": [{"size": 1}]}'), "page 2"),
    ("another media type", _replace(2, **{"Content-Type": "text/html"}), "page 2"),
    ("a next page on another host", _link("http://127.0.0.2:9/v2/omni/app/referrers/x"), "page 1"),
    ("a next page on another path", _link("/v2/other/referrers/x"), "page 1"),
]


@pytest.mark.parametrize("name, hook, page", HOSTILE_PAGES, ids=[row[0] for row in HOSTILE_PAGES])
def test_a_malformed_referrers_page_is_refused_naming_it(paged, name, hook, page) -> None:
    front, digest, _, _ = paged
    front.referrer_pages, front.page_hook = 3, hook
    with RegistryClient(front.host) as client, pytest.raises(OciError) as refused:
        referrers(client, "omni/app", digest)
    assert f"the referrers of {digest} (referrers API, {page})" in str(refused.value), str(refused.value)


def test_a_page_loop_and_too_many_pages_are_refused(paged, monkeypatch) -> None:
    front, digest, _, _ = paged
    front.referrer_pages = 5
    front.page_hook = _link(f"/v2/omni/app/referrers/{digest}?page=1")
    with RegistryClient(front.host) as client, pytest.raises(OciError, match="read already"):
        referrers(client, "omni/app", digest)
    front.page_hook = None
    monkeypatch.setattr(referrers_module, "MAX_REFERRERS_PAGES", 2)
    with RegistryClient(front.host) as client, pytest.raises(OciError, match="run past 2 pages"):
        referrers(client, "omni/app", digest)


# --- Retry-After ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_waited_for(login, status: int) -> None:
    with login() as front, RegistryClient(front.host) as client:
        front.throttle = [(status, "1")]
        with pytest.raises(OciError, match="HTTP 404"):
            client.manifest("omni/app", "latest")  # answered at last: no such manifest
        (throttled_at, throttled), (again_at, _) = front.arrivals[:2]
        assert throttled and again_at - throttled_at >= 1.0


def test_a_429_is_retried_for_a_write_whose_body_can_be_sent_again(login) -> None:
    with login() as front, RegistryClient(front.host) as client:
        front.throttle = [(429, "0")]
        assert client.mount("omni/app", "sha256:" + "0" * 64, "vendor/base") is False  # a POST, tried again
        assert front.arrivals[0][1] and not front.arrivals[1][1]


RETRY_AFTER_REFUSED = [
    ("past the operation's deadline", "100", 50.0, "the operation's deadline"),
    ("past one answer's budget", "3600", None, "the 120 s one wait may take"),
    ("an HTTP-date a day ahead", "Wed, 21 Oct 2099 07:28:00 GMT", None, "the 120 s one wait may take"),
]


@pytest.mark.parametrize("name, value, deadline_s, bound", RETRY_AFTER_REFUSED, ids=[r[0] for r in RETRY_AFTER_REFUSED])
def test_a_retry_after_past_the_deadline_is_refused_naming_it(login, name, value, deadline_s, bound) -> None:
    with login() as front, RegistryClient(front.host) as client:
        if deadline_s is not None:
            client.operation_deadline = time.monotonic() + deadline_s
        front.throttle = [(429, value)]
        started = time.monotonic()
        with pytest.raises(OciError) as refused:
            client.manifest("omni/app", "latest")
    assert refused.value.field == "Retry-After" and "(Retry-After)" in str(refused.value)
    assert bound in str(refused.value)
    # Refused at once, not after waiting the Retry-After (100 s or more in every row).
    ended_long_before(time.monotonic() - started, 100, what="the refusal of a Retry-After past the deadline")
