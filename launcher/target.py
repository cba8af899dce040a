"""The target profile this launcher serves: which one, and reading it.

Profiles are documents (attest.profile) shipped in launcher/profiles/. Inside an Omni image
the image's pins name the profile and nothing else may choose another; outside one,
OMNI_TARGET_PROFILE names it (default: the Qwen3.8-27B/MI300X profile of the seed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from attest.errors import AttestError
from launcher.errors import LauncherError

if TYPE_CHECKING:
    from attest.pins import BakedImage
    from attest.profile import TargetProfile

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = "qwen3.8-27b-mi300x"
PROFILE_SETTING = "OMNI_TARGET_PROFILE"


def shipped_profiles() -> list[str]:
    return sorted(path.stem for path in PROFILES_DIR.glob("*.json"))


def load_target_profile(name: str, *, field: str = PROFILE_SETTING) -> "TargetProfile":
    """The shipped profile `name`; refuses an unknown name, listing the shipped ones. (That each
    file's `name` is its file name is checked by tests/attest/target_profile_test.py.)"""
    from attest.documents import load_document
    from attest.profile import PROFILE_NAME_RE, TargetProfile

    if not PROFILE_NAME_RE.fullmatch(name) or not (PROFILES_DIR / f"{name}.json").is_file():
        raise LauncherError(
            f"{field}: no target profile named {name!r} (shipped: {', '.join(shipped_profiles())})", field=field
        )
    return load_document(TargetProfile, PROFILES_DIR / f"{name}.json", label=f"target profile {name}")


def select_target_profile(requested: str, requested_by_default: bool, baked: "BakedImage | None") -> "TargetProfile":
    """Inside an image its pins choose; an explicit OMNI_TARGET_PROFILE that differs is refused."""
    if baked is None:
        return load_target_profile(requested)
    pinned = baked.pins.target_profile
    if not pinned:
        raise AttestError(
            "this image's pins name no target_profile: the launcher cannot know what it serves", field="target_profile"
        )
    if not requested_by_default and requested != pinned:
        raise LauncherError(
            f"{PROFILE_SETTING}={requested!r} differs from the image pin target_profile "
            f"{pinned!r}: an image serves only its pinned profile",
            field=PROFILE_SETTING,
        )
    return load_target_profile(pinned, field="target_profile")
