"""tools/deploy/k8s_names.py: every object name and every key a flag names (node selector,
toleration, namespace selector, ServiceMonitor label) is checked with apimachinery's grammars, the
one module every flag uses, so a manifest never holds a key the API server refuses: a table of bad
keys through the real generator, each refused naming its flag, and Hypothesis properties against
a transcription of validation.go's IsDNS1123Label, IsDNS1123Subdomain, IsQualifiedName and
IsValidLabelValue."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.manifests import generate, refusal
from tools.deploy import DeployError, is_dns_label, is_dns_subdomain, is_label_value, is_qualified_name, qualified_name

QWEN = ("--repository", "registry.example/omni/qwen", "--model-pvc", "qwen-models")
# apimachinery pkg/util/validation/validation.go, as written there.
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def apimachinery_is_qualified_name(value: str) -> bool:
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if len(prefix) == 0 or len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix):
            return False
    else:
        return False
    return len(name) != 0 and len(name) <= 63 and QUALIFIED_NAME.fullmatch(name) is not None


def apimachinery_is_valid_label_value(value: str) -> bool:
    return len(value) <= 63 and (value == "" or QUALIFIED_NAME.fullmatch(value) is not None)


KEY_ALPHABET = "abcZ09-_./"


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet="ab09-.Z_", max_size=12) | st.integers(0, 300).map(lambda n: "a" * n))
def test_object_names_are_judged_as_apimachinery_judges_them(name: str) -> None:
    assert is_dns_subdomain(name) == (len(name) <= 253 and DNS1123_SUBDOMAIN.fullmatch(name) is not None)
    assert is_dns_label(name) == (len(name) <= 63 and DNS1123_LABEL.fullmatch(name) is not None)


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=KEY_ALPHABET, max_size=12) | st.text(max_size=6))
def test_keys_are_judged_as_apimachinery_judges_them(key: str) -> None:
    assert is_qualified_name(key) == apimachinery_is_qualified_name(key)
    assert is_label_value(key) == apimachinery_is_valid_label_value(key)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 300), st.integers(0, 80))
def test_the_length_bounds_are_exact(prefix_length: int, name_length: int) -> None:
    prefix, name = "a" * prefix_length, "b" * name_length
    key = f"{prefix}/{name}" if prefix_length else name
    assert is_qualified_name(key) == apimachinery_is_qualified_name(key)
    assert is_qualified_name(key) == (prefix_length <= 253 and 0 < name_length <= 63)


BAD_KEYS = [
    ("/gpu", "an empty prefix"),
    ("a/b/c", "two slashes"),
    ("Example.com/gpu", "an upper-case prefix"),
    ("example.com/", "an empty name"),
    ("-gpu", "a name starting with '-'"),
    ("gpu_", "a name ending with '_'"),
    ("x" * 64, "a name of 64"),
    ("a" * 254 + "/gpu", "a prefix of 254"),
    ("gpu key", "a space"),
    ("gpu\n", "a trailing newline"),
]


@pytest.mark.parametrize("key, why", BAD_KEYS, ids=[why for _, why in BAD_KEYS])
def test_each_bad_key_is_refused_naming_the_flag(key: str, why: str) -> None:
    with pytest.raises(DeployError, match="not a label key") as refused:
        qualified_name("--node-selector", key)
    assert refused.value.field == "--node-selector", why


# Through the real generator, every flag that takes a key: the three shapes apimachinery refuses
# that the old check let through or refused for another reason.
@pytest.mark.parametrize("key", ["/gpu", "a/b/c", "x" * 64], ids=["empty prefix", "two slashes", "name of 64"])
@pytest.mark.parametrize(
    "flags, field",
    [
        (lambda key: ("--node-selector", f"{key}=x"), "--node-selector"),
        (lambda key: ("--toleration", f"{key}:NoSchedule"), "--toleration"),
        (lambda key: ("--network-policy", "--api-from-namespace", f"{key}=x"), "--api-from-namespace"),
        (lambda key: ("--service-monitor", "--service-monitor-label", f"{key}=x"), "--service-monitor-label"),
    ],
    ids=["node selector", "toleration", "namespace selector", "servicemonitor label"],
)
def test_a_bad_key_is_refused_by_every_flag_naming_it(key: str, flags, field: str) -> None:
    found = refusal(generate("qwen_mi300x", *QWEN, *flags(key)))
    assert found["field"] == field and "not a label key" in found["error"], found


def test_a_good_prefixed_key_passes_every_flag() -> None:
    key = "nvidia.com/gpu.product"
    for flags in (
        ("--node-selector", f"{key}=H100"),
        ("--toleration", f"{key}:NoSchedule"),
        ("--network-policy", "--api-from-namespace", f"{key}=x"),
        ("--service-monitor", "--service-monitor-label", f"{key}=x"),
    ):
        completed = generate("qwen_mi300x", *QWEN, *flags)
        assert completed.returncode == 0, (flags, completed.stderr)
