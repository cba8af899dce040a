"""tools/setup says what it would change before it changes it (issue #55): `--dry-run` on this
set-up host changes nothing (apt's sources, pins and lists, dpkg's status and set-up's own files
stay byte-identical) and says so; its summary of `apt-get -s` (tools/setup_moves.awk) lists
each package and counts those moved to unstable, checked against an independent parse of a
transcript recorded in a fresh Debian 12 root and a table of Inst line shapes. The dry run
against Debian's archive in a fresh root is in the closing notes (tests reach only loopback)."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

SETUP, MOVES, PRIVATE_APT = Path("tools/setup"), Path("tools/setup_moves.awk"), Path("tools/private_apt")
TRANSCRIPT = Path("tests/data/setup/bookworm-bazel.sim")
CORE = "libc6 libstdc++6 dpkg base-files libssl3 libssl3t64"
# What --dry-run must leave as it is: apt's and dpkg's state, and every file set-up writes.
WATCHED = [
    Path("/etc/apt"),
    Path("/var/lib/apt/lists"),
    Path("/var/lib/dpkg/status"),
    Path("/etc/bazel.bazelrc"),
    Path("/etc/bazel/bazelrc"),
    Path("/usr/local/share/omni"),
    Path("/usr/local/bin/buildifier"),
]


def _state() -> dict[str, str]:
    """path -> sha256 (or the link target) of every file under the watched paths."""
    found: dict[str, str] = {}
    for root in WATCHED:
        for path in [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]:
            if path.is_symlink():
                found[str(path)] = "-> " + str(path.readlink())
            elif path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif path.is_dir():
                found[str(path)] = "dir"
    return found


def _summarize(transcript: str) -> list[str]:
    done = subprocess.run(
        ["awk", "-v", f"core={CORE}", "-f", str(MOVES)], input=transcript, capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def test_a_dry_run_on_a_set_up_host_changes_nothing_and_says_so() -> None:
    if subprocess.run(["dpkg", "-s", "bazel-bootstrap"], capture_output=True).returncode != 0:
        pytest.skip("Bazel is not Debian's here: set-up leaves it alone and would ask the public registry")
    before = _state()
    done = subprocess.run(["bash", str(SETUP), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _state() == before
    lines = done.stdout.splitlines()
    assert lines[-1] == "setup: dry run: nothing was changed"
    assert "setup: no Debian package to install or upgrade" in lines
    assert all(line.startswith(("setup: would ", "setup: no Debian", "setup: dry run")) for line in lines), lines


def _independent_parse(transcript: str) -> list[tuple[str, str, str, str]]:
    """(name, old, new, suites) of the first Inst line of each package, parsed by a regex."""
    seen, found = set(), []
    for line in transcript.splitlines():
        match = re.match(r"Inst (\S+) (?:\[([^\]]*)\] )?\((\S+) ([^\[)]*?)(?: \[[^\]]*\])?\)", line)
        if match and match[1] not in seen:
            seen.add(match[1])
            found.append((match[1], match[2] or "", match[3], match[4]))
    return found


def test_the_summary_of_a_recorded_bookworm_transcript_matches_an_independent_parse() -> None:
    transcript = TRANSCRIPT.read_text()
    packages = _independent_parse(transcript)
    lines = _summarize(transcript)
    expected = [
        f"  {'upgrade' if old else 'install':<8} {name} {old + ' -> ' if old else ''}{new} ({suites})"
        for name, old, new, suites in packages
    ]
    assert lines[:-1] == expected
    moved = [p for p in packages if "unstable" in p[3]]
    upgraded = [p for p in moved if p[1]]
    core = [p[0] for p in moved if p[0] in CORE.split()]
    assert lines[-1] == (
        f"{len(packages)} packages installed or upgraded; {len(moved)} of them from Debian unstable "
        f"({len(upgraded)} already installed, moved to unstable's versions), among them {' '.join(core)}"
    )
    # What README and docs/development.md tell a user before they run set-up.
    assert {"libc6", "dpkg", "base-files"} <= {p[0] for p in upgraded} and "libssl3t64" in core
    assert (len(packages), len(moved), len(upgraded)) == (210, 210, 12)


@pytest.mark.parametrize(
    "line, shown",
    [
        ("Inst libc6 [2.36-9] (2.43-7 Debian:unstable [amd64]) [libc-bin:amd64 ]", "upgrade  libc6 2.36-9 -> 2.43-7"),
        ("Inst base-files [12.4] (14.2 Debian:unstable)", "upgrade  base-files 12.4 -> 14.2 (Debian:unstable)"),
        ("Inst zip (3.0-13 Debian:12.15/oldstable [amd64])", "install  zip 3.0-13 (Debian:12.15/oldstable)"),
        (
            "Inst libx (1.0 Debian:12.15/oldstable, Debian-Security:12/oldstable-security [amd64])",
            "install  libx 1.0 (Debian:12.15/oldstable, Debian-Security:12/oldstable-security)",
        ),
    ],
    ids=["upgrade, arch, broken-depends", "upgrade, no arch", "install from the release", "two releases"],
)
def test_each_shape_of_an_inst_line_is_read(line: str, shown: str) -> None:
    lines = _summarize(line + "\nConf x (1 Debian:unstable)\n" + line + "\n")
    assert len(lines) == 2 and lines[0].startswith("  " + shown), lines
    moved = 1 if "unstable" in line else 0
    assert lines[1].startswith(f"1 packages installed or upgraded; {moved} of them from Debian unstable")


# Issue #68: the dry run's private apt runs nothing of the host's. Canary hooks in every list apt
# runs commands from, given as a host's configuration would give them (through APT_CONFIG, and a
# parts directory it names); a local file: archive, so that the update reaches no network.
CANARY_HOOKS = [
    "APT::Update::Pre-Invoke",
    "APT::Update::Post-Invoke",
    "APT::Update::Post-Invoke-Success",
    "DPkg::Pre-Invoke",
    "DPkg::Post-Invoke",
    "DPkg::Pre-Install-Pkgs",
    "AptCli::Hooks::Update",
]


def _canaries(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose APT configuration sets every canary hook, and where they would land."""
    landed, parts = tmp_path / "landed", tmp_path / "conf.d"
    landed.mkdir()
    parts.mkdir()
    hooks = "".join(f'{key} {{ "touch {landed}/{key.replace(":", "_")}"; }};\n' for key in CANARY_HOOKS)
    (parts / "50canary").write_text(hooks)
    config = tmp_path / "apt.conf"
    config.write_text(f'Dir::Etc::Parts "{parts}";\n' + hooks.replace("touch", "touch-main"))
    return {"APT_CONFIG": str(config), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, landed


def _archive(tmp_path: Path, *, present: bool) -> Path:
    repo, sources = tmp_path / "repo", tmp_path / "sources.list"
    if present:
        repo.mkdir()
        (repo / "Packages").write_text("")
    sources.write_text(f"deb [trusted=yes] file:{repo} ./\n")
    return sources


def _private_update(tmp_path: Path, sources: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [str(PRIVATE_APT), str(tmp_path / "state"), str(sources), "apt-get", "update", "-qq"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_the_private_apt_runs_none_of_the_hosts_hooks(tmp_path: Path) -> None:
    env, landed = _canaries(tmp_path)
    sources = _archive(tmp_path, present=True)
    # apt itself reads every canary, from the file and from the parts directory it names.
    dump = subprocess.run(["apt-config", "dump"], env=env, capture_output=True, text=True, timeout=60).stdout
    for key in CANARY_HOOKS:
        assert f'{key}:: "touch {landed}' in dump and f'{key}:: "touch-main {landed}' in dump, key
    done = _private_update(tmp_path, sources, env)
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in landed.iterdir()) == []


def test_a_failed_private_update_is_a_refusal_not_an_empty_plan(tmp_path: Path) -> None:
    env, _ = _canaries(tmp_path)
    sources = _archive(tmp_path, present=False)
    done = _private_update(tmp_path, sources, env)
    assert done.returncode != 0 and "Failed to fetch" in done.stderr, done.stderr


def test_the_private_apt_takes_only_apts_own_commands(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(PRIVATE_APT), str(tmp_path), "/dev/null", "sh", "-c", "true"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "COMMAND must be apt-get, apt-cache or apt-config" in done.stderr


def test_set_up_is_split_by_step_and_runs_every_step() -> None:
    """One file per step (issue 73: no file past ~250 lines), and tools/setup sources each step
    file there is, so a step added without being run, or run without its file, is caught."""
    steps = sorted(path.stem for path in (SETUP.parent / "setup.d").glob("*.sh"))
    assert steps, "tools/setup.d holds no step"
    listed = re.search(r"^for step in ([\w ]+); do$", SETUP.read_text(), flags=re.M)
    assert listed and sorted(listed.group(1).split()) == steps
    for path in [SETUP, *(SETUP.parent / "setup.d").glob("*.sh")]:
        assert len(path.read_text().splitlines()) <= 250, f"{path} is past 250 lines"
