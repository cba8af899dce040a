"""Every Kubernetes name grammar the API server checks, in one home, for every flag and every
generated name that takes one.

The grammar is apimachinery's `pkg/util/validation` (validation.go): a DNS-1123 label (object
names such as a namespace), a DNS-1123 subdomain (most object names), a qualified name (label,
node-selector, toleration and namespace-selector keys: `[prefix/]name`, the prefix a non-empty
DNS-1123 subdomain of at most 253 characters, the name at most 63 of `[-A-Za-z0-9_.]`
starting and ending alphanumeric, exactly one `/` or none) and a label value (empty, or a name
of at most 63). Each check refuses naming the flag, so a manifest holds only names the API
server admits: `kubectl apply` never fails half-way on one.
"""

from __future__ import annotations

import re

from tools.deploy.errors import DeployError

DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_SUBDOMAIN = 253
# IsDNS1123Subdomain: its labels are not bounded one by one, only the whole (MAX_SUBDOMAIN).
DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUALIFIED_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
MAX_NAME = 63


def dns_label(flag: str, value: str) -> None:
    if not is_dns_label(value):
        raise DeployError(
            f"{flag} {value!r} is not a DNS label (1-63 lower-case letters, digits or '-', "
            "starting and ending with a letter or digit)",
            field=flag,
        )


def is_dns_label(value: str) -> bool:
    """apimachinery's IsDNS1123Label, exactly."""
    return DNS_LABEL_RE.fullmatch(value) is not None


def is_dns_subdomain(value: str) -> bool:
    """apimachinery's IsDNS1123Subdomain, exactly: the one subdomain check (object names and
    the prefix of a qualified name)."""
    return len(value) <= MAX_SUBDOMAIN and DNS_SUBDOMAIN_RE.fullmatch(value) is not None


def dns_subdomain(flag: str, value: str) -> None:
    """A Kubernetes object name, refused naming the flag."""
    if not is_dns_subdomain(value):
        raise DeployError(
            f"{flag} {value!r} is not a Kubernetes object name (a DNS subdomain: lower-case letters, digits, '-' "
            f"and '.', each part starting and ending with a letter or digit, at most {MAX_SUBDOMAIN} characters)",
            field=flag,
        )


def is_qualified_name(key: str) -> bool:
    """apimachinery's IsQualifiedName, exactly."""
    parts = key.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2:
        prefix = parts[0]
        if not is_dns_subdomain(prefix):
            return False
    name = parts[-1]
    return 0 < len(name) <= MAX_NAME and QUALIFIED_NAME_RE.fullmatch(name) is not None


def qualified_name(flag: str, key: str) -> str:
    """A label, node-selector, toleration or namespace-selector key, refused naming the flag."""
    if not is_qualified_name(key):
        raise DeployError(
            f"{flag} {key!r}: not a label key ([prefix/]name: the prefix a DNS subdomain of at most "
            f"{MAX_SUBDOMAIN} characters, never empty; the name 1-{MAX_NAME} letters, digits, '-', '_' or "
            "'.', starting and ending with a letter or digit)",
            field=flag,
        )
    return key


def is_label_value(value: str) -> bool:
    """apimachinery's IsValidLabelValue: empty, or a qualified name's name part."""
    return value == "" or (len(value) <= MAX_NAME and QUALIFIED_NAME_RE.fullmatch(value) is not None)
