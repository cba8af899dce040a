"""Registry credentials as the ecosystem stores them, against a real private registry on
loopback (Debian's docker-registry with htpasswd): push and pull with each source (the env
override, containers' auth.json, Docker's config.json auths, credHelpers and credsStore through
the docker-credential-* protocol); wrong or missing credentials are refused naming the registry
and the source, and no secret ever appears in a message."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from omni_oci.format.errors import OciError
from omni_oci.remote.auth.credentials import lookup
from omni_oci.remote.push import push
from omni_oci.remote.shallow_base import fetch_base
from tests.fixtures.oci import make_image, make_layer
from tests.fixtures.registry import LoopbackRegistry, credential_helper, no_credentials

USER, PASSWORD = "omni-ci", "s3cret-Pa55-word"


@pytest.fixture(scope="module")
def private():
    with LoopbackRegistry(users={USER: PASSWORD}) as running:
        yield running


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch) -> Path:
    return no_credentials(tmp_path / "home", monkeypatch)


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("image")
    layer = make_layer(work, "app", {"/opt/app/x.py": "x = 1\n"})
    make_image(work / "layout", [layer], entrypoint=["/bin/true"])
    return work / "layout"


def _docker_config(home: Path, document: dict) -> Path:
    (home / ".docker").mkdir(exist_ok=True)
    path = home / ".docker" / "config.json"
    path.write_text(json.dumps(document))
    return path


def _auth(user: str = USER, password: str = PASSWORD) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def _sources(home: Path, tmp_path: Path, host: str, monkeypatch, password: str = PASSWORD) -> dict:
    def env_override() -> None:
        monkeypatch.setenv("OMNI_REGISTRY_USERNAME", USER)
        monkeypatch.setenv("OMNI_REGISTRY_PASSWORD", password)
        monkeypatch.setenv("OMNI_REGISTRY_HOST", host)

    def containers_auth() -> None:
        path = tmp_path / "auth.json"
        path.write_text(json.dumps({"auths": {host: {"auth": _auth(password=password)}}}))
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(path))

    def docker_auths() -> None:
        _docker_config(home, {"auths": {f"https://{host}": {"auth": _auth(password=password)}}})

    def cred_helper() -> None:
        credential_helper(
            tmp_path / "bin",
            "omnitest",
            f'[ "$registry" = {host} ] || exit 1\n'
            f'printf \'{{"ServerURL":"%s","Username":"{USER}","Secret":"{password}"}}\' "$registry"\n',
        )
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
        _docker_config(home, {"credHelpers": {host: "omnitest"}, "auths": {host: {"auth": _auth(password="x")}}})

    def creds_store() -> None:
        credential_helper(tmp_path / "bin", "omnistore", f'echo \'{{"Username":"{USER}","Secret":"{password}"}}\'\n')
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
        _docker_config(home, {"credsStore": "omnistore"})

    return {
        "env override": env_override,
        "containers auth.json": containers_auth,
        "docker config auths": docker_auths,
        "credHelpers": cred_helper,
        "credsStore": creds_store,
    }


SOURCES = ["env override", "containers auth.json", "docker config auths", "credHelpers", "credsStore"]


@pytest.mark.parametrize("source", SOURCES)
def test_push_and_pull_a_private_registry_with_each_credential_source(
    tmp_path: Path, private, layout, clean_env, monkeypatch, source: str
) -> None:
    _sources(clean_env, tmp_path, private.host, monkeypatch)[source]()
    repository = f"{private.host}/omni/{source.replace(' ', '-').replace('.', '-').lower()}"
    report = push(layout, repository + ":1")
    assert report.uploaded  # the blobs went up behind the credentials
    # The pushed image as a private base: its manifest and config are fetched with the same credentials.
    base = fetch_base(repository, report.digest, "linux/amd64", tmp_path / "base")
    assert base["digest"] == report.digest


def test_without_credentials_the_refusal_names_the_registry_and_where_to_put_them(private, layout, clean_env) -> None:
    with pytest.raises(OciError, match=f"{private.host} requires credentials .* none were found") as refused:
        push(layout, f"{private.host}/omni/anonymous:1")
    assert refused.value.field == "registry" and "OMNI_REGISTRY_USERNAME" in str(refused.value)


@pytest.mark.parametrize("source", SOURCES)
def test_wrong_credentials_are_refused_naming_the_registry_and_never_the_secret(
    tmp_path: Path, private, layout, clean_env, monkeypatch, source: str, capsys
) -> None:
    wrong = "Wr0ng-pa55-" + source.replace(" ", "")
    _sources(clean_env, tmp_path, private.host, monkeypatch, password=wrong)[source]()
    with pytest.raises(OciError, match=f"{private.host} refused the credentials from") as refused:
        push(layout, f"{private.host}/omni/wrong:1")
    printed = capsys.readouterr()
    for text in (str(refused.value), refused.value.field, printed.out, printed.err):
        assert wrong not in text and _auth(password=wrong) not in text


def test_env_credentials_for_another_registry_are_never_sent(private, layout, clean_env, monkeypatch) -> None:
    monkeypatch.setenv("OMNI_REGISTRY_USERNAME", USER)
    monkeypatch.setenv("OMNI_REGISTRY_PASSWORD", PASSWORD)
    monkeypatch.setenv("OMNI_REGISTRY_HOST", "registry.example:5000")
    with pytest.raises(OciError, match="none were found"):
        push(layout, f"{private.host}/omni/elsewhere:1")


@pytest.mark.parametrize(
    "document, message",
    [
        ({"auths": []}, "auths is not an object"),
        ({"auths": {"REG": "user:pass"}}, "is not an object"),
        ({"auths": {"REG": {"auth": "not base64!"}}}, "auth is not base64 of user:password"),
        ({"auths": {"REG": {"auth": base64.b64encode(b"no-colon").decode()}}}, "auth is not base64 of user:password"),
        ({"credHelpers": ["x"]}, "credHelpers is not an object"),
        ({"credHelpers": {"REG": "absent-helper"}}, "docker-credential-absent-helper (named for REG"),
        ({"credHelpers": {"REG": "../evil"}}, "is not a plain name"),
        ({"credsStore": "failing"}, "docker-credential-failing get failed with exit status 7"),
        ({"credsStore": "garbled"}, "answered something that is not a JSON object"),
        ({"credsStore": "halfway"}, "answered without a Username and Secret"),
    ],
)
def test_malformed_credential_sources_are_refused_naming_them(
    tmp_path: Path, clean_env, monkeypatch, document: dict, message: str
) -> None:
    registry = "127.0.0.1:5999"
    credential_helper(tmp_path / "bin", "failing", f"echo 'token {PASSWORD} expired' >&2\nexit 7\n")
    credential_helper(tmp_path / "bin", "garbled", "echo not json\n")
    credential_helper(tmp_path / "bin", "halfway", 'echo \'{"Username": "u"}\'\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    _docker_config(clean_env, json.loads(json.dumps(document).replace("REG", registry)))
    with pytest.raises(OciError) as refused:
        lookup(registry)
    assert message.replace("REG", registry) in str(refused.value)
    assert PASSWORD not in str(refused.value)


def test_a_helper_without_the_registry_means_anonymous_and_a_huge_config_is_refused(
    tmp_path: Path, clean_env, monkeypatch
) -> None:
    credential_helper(tmp_path / "bin", "empty", "echo 'credentials not found in native keychain'\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    _docker_config(clean_env, {"credsStore": "empty"})
    assert lookup("127.0.0.1:5999") is None
    path = _docker_config(clean_env, {"auths": {}})
    path.write_text(json.dumps({"auths": {}, "pad": "x" * (1 << 20)}))
    with pytest.raises(OciError, match="at most 1048576 allowed"):
        lookup("127.0.0.1:5999")
    monkeypatch.setenv("OMNI_REGISTRY_USERNAME", USER)
    with pytest.raises(OciError, match="need each other") as refused:
        lookup("127.0.0.1:5999")
    assert refused.value.field == "OMNI_REGISTRY_HOST"
