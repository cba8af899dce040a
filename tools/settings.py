"""Environment variables of the image tools and the gate generator, declared once.

The tools take most of their input as flags (their `--help`); these are what they read
from the environment. docs/release.md's table and the tools' `--help` epilogues are generated from
`SETTINGS`; tests/system/settings_test.py fails when a tool reads a variable not declared here.
Variables read by Bazel repository rules (`--repo_env=NAME=...`) are declared here too:
Starlark cannot import this module, so the test checks their names in the .bzl files.
"""

from __future__ import annotations

import os
from pathlib import Path

from attest.edge import settings as declared
from attest.edge.settings import Setting, text

GATE_API_KEY = "OMNI_GATE_API_KEY"
SIGNING_KEY_FILE = "OMNI_SIGNING_KEY_FILE"
SIGNING_KEY = "OMNI_SIGNING_KEY"
SIGNING_KEY_PASSWORD = "OMNI_SIGNING_KEY_PASSWORD"

SETTINGS: tuple[Setting, ...] = (
    Setting(
        GATE_API_KEY,
        "gate_api_key",
        "",
        text,
        "gate generator: the API key both servers require (never a flag); unset: the run stops at its first request",
        secret=True,
    ),
    Setting(
        SIGNING_KEY_FILE,
        "signing_key_file",
        "",
        text,
        "push: PEM ECDSA P-256 private key file (relative: to where `bazel run` started); or --signing-key",
    ),
    Setting(
        SIGNING_KEY, "signing_key", "", text, "push: the same key as PEM text (when no file is given)", secret=True
    ),
    Setting(
        SIGNING_KEY_PASSWORD,
        "signing_key_password",
        "",
        text,
        "push: the password of an encrypted PEM key",
        secret=True,
    ),
    Setting(
        "OMNI_REGISTRY_USERNAME",
        "registry_username",
        "",
        text,
        "push/pull: a registry user (with OMNI_REGISTRY_PASSWORD, for OMNI_REGISTRY_HOST only)",
    ),
    Setting(
        "OMNI_REGISTRY_PASSWORD",
        "registry_password",
        "",
        text,
        "push/pull: that user's password or token (never printed)",
        secret=True,
    ),
    Setting(
        "OMNI_REGISTRY_HOST",
        "registry_host",
        "",
        text,
        "push/pull: the one registry (host[:port]) the two above are sent to",
    ),
    Setting(
        "REGISTRY_AUTH_FILE",
        "registry_auth_file",
        "",
        text,
        "push/pull: a containers auth.json (podman/skopeo), read before Docker's config.json",
    ),
    Setting(
        "XDG_RUNTIME_DIR",
        "xdg_runtime_dir",
        "",
        text,
        "push/pull: without REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json is read",
    ),
    Setting(
        "XDG_STATE_HOME",
        "xdg_state_home",
        "",
        text,
        "push records each pushed digest under it (omni/pushes) for //deploy; default ~/.local/state",
    ),
    Setting(
        "DOCKER_CONFIG",
        "docker_config",
        "",
        text,
        "push/pull: the directory of Docker's config.json (default ~/.docker): auths, credHelpers, credsStore",
    ),
    Setting(
        "SOURCE_DATE_EPOCH",
        "source_date_epoch",
        "0",
        text,
        "layer mtimes and image creation time (seconds since 1970); 0 keeps digests reproducible",
    ),
    Setting(
        "OMNI_PYTHON",
        "python",
        "",
        text,
        "Bazel `--repo_env`: the interpreter @pypi installs for (default: python3 on PATH)",
    ),
    Setting(
        "OMNI_BASE_MIRROR",
        "base_mirror",
        "",
        text,
        "Bazel `--repo_env` and `tools/pin`: a registry mirroring the vendor bases (`--config=release`)",
    ),
    Setting(
        "HF_ENDPOINT",
        "hf_endpoint",
        "",
        text,
        "pin: the hub or mirror the model refs are resolved on (huggingface_hub; HF_TOKEN authenticates)",
    ),
    Setting(
        "OMNI_MUTATION_DURATIONS",
        "mutation_durations",
        "",
        text,
        "mutation driver: set by it for its pytest plugin, the file of unmutated test durations",
    ),
    Setting(
        "OMNI_MUTATION_RECORD",
        "mutation_record",
        "",
        text,
        "mutation driver: set by it to 1 for the unmutated run, which records the durations",
    ),
    Setting(
        "OMNI_MUTATION_KILLERS",
        "mutation_killers",
        "",
        text,
        "mutation driver: set by it for its pytest plugin, the file of tests that killed earlier mutants (run first)",
    ),
    Setting(
        "OMNI_MUTATION_FAILED",
        "mutation_failed",
        "",
        text,
        "mutation driver: set by it for its pytest plugin, where the plugin writes the test that failed",
    ),
)

SIGNING = tuple(s for s in SETTINGS if s.variable.startswith("OMNI_SIGNING_"))
GATE = tuple(s for s in SETTINGS if s.variable == GATE_API_KEY)
PIN = tuple(
    s
    for s in SETTINGS
    if s.variable in ("OMNI_BASE_MIRROR", "HF_ENDPOINT")
    or s.variable.startswith(("OMNI_REGISTRY_", "REGISTRY_AUTH", "DOCKER_CONFIG", "XDG_RUNTIME"))
)


def tools_help(declarations: tuple[Setting, ...]) -> str:
    return "environment:\n" + declared.help_table(declarations)


def user_path(value: str) -> Path:
    """A path as the user typed it: relative to where `bazel run` was started (Bazel sets
    BUILD_WORKING_DIRECTORY; the tool itself runs in its runfiles)."""
    return Path(os.environ.get("BUILD_WORKING_DIRECTORY", ".")) / value
