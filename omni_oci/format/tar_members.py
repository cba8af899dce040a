"""Tar members checked before anything is written: the one rule for every tar Omni reads.

A member name must be relative and stay inside the archive's root (no `..`, no NUL); only
regular files, directories, symbolic links and hard links are accepted. `extract_all` writes
such a tar, read by omni_oci.format.tar_reader (members as the container runtimes read them), into a
directory without trusting anything else in it: links may not point out of the directory,
owners are never applied, set-id bits are dropped, and a member never writes through a
symbolic link that an earlier member made.

Why by hand and not `TarFile.extractall(filter="data")`: extraction filters arrived in
Python 3.11.4, Debian 12's python3 is 3.11.2, and tarfile reads some headers differently from
the runtimes (omni_oci.format.tar_reader says which).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from omni_oci.format.errors import OciError
from omni_oci.format.tar_reader import MemberData, TarMember, TarStream, read_members

COPY_CHUNK = 1 << 20
PERMISSION_BITS = 0o777
PATH_MAX = 4096


def clean_name(source: str | Path, name: str, *, kind: str = "tar") -> str:
    """`name` as a clean relative path (`.` for the root); refuses absolute and climbing names
    and names no runtime can create. `kind` starts the refusal ("layer tar", "base layer", ...)."""
    if len(name) > PATH_MAX // 4 and len(name.encode("utf-8", "surrogateescape")) > PATH_MAX:
        raise OciError(
            f"{kind} {source}: member {name[:64]!r}... is longer than {PATH_MAX} bytes (Linux's PATH_MAX: "
            "no runtime can create it)",
            field=f"{source}:{name[:64]}",
        )
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if name.startswith("/") or ".." in parts or "\x00" in name:
        raise OciError(
            f"{kind} {source}: member {name!r} is absolute or leaves the tar's root", field=f"{source}:{name}"
        )
    return "/".join(parts) or "."


def member_path(source: str | Path, name: str, *, kind: str = "tar") -> PurePosixPath:
    """clean_name as a path."""
    return PurePosixPath(clean_name(source, name, kind=kind))


def _link_stays_inside(source: str | Path, member: TarMember, relative: PurePosixPath) -> None:
    """A symbolic link's target, read from the link's own directory, must stay inside the root."""
    target = member.linkname
    if not target or target.startswith("/") or "\x00" in target:
        raise OciError(
            f"tar {source}: symbolic link {member.name!r} points to {target!r}; "
            "expected a relative target inside the archive",
            field=f"{source}:{member.name}",
        )
    depth = len(relative.parts) - 1
    for part in PurePosixPath(target).parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            raise OciError(
                f"tar {source}: symbolic link {member.name!r} points to {target!r}, outside the archive's root",
                field=f"{source}:{member.name}",
            )


def _no_link_on_the_way(source: str | Path, root: Path, relative: PurePosixPath, name: str) -> None:
    """Refuses a member whose parent directories include a symbolic link already written."""
    current = root
    for part in relative.parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise OciError(
                f"tar {source}: member {name!r} would be written through the symbolic link {current.relative_to(root)}",
                field=f"{source}:{name}",
            )


def _make_room(source: str | Path, path: Path, name: str) -> None:
    """Creates `path`'s parents and removes a file or link already there (a later member
    replaces an earlier one); a directory written before is never replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        raise OciError(
            f"tar {source}: member {name!r} would replace a directory written before it", field=f"{source}:{name}"
        )
    if path.is_symlink() or path.exists():
        path.unlink()


def _write_file(data: MemberData, path: Path, mode: int) -> None:
    with open(path, "xb") as out:
        while chunk := data.read(COPY_CHUNK):
            out.write(chunk)
    path.chmod(mode)


def extract_all(stream: TarStream, dest: Path, *, source: str | Path) -> list[str]:
    """Writes every member of the tar `stream` under `dest` (created); returns the relative
    paths written. `source` names the tar in refusals.

    Refuses, naming the tar and the member, anything omni_oci.format.tar_reader or `member_path`
    refuses, a device, FIFO or other special file, a link pointing outside `dest`, and a hard
    link to a member not written before it. Nothing is written for a refused archive's later
    members.
    """
    dest.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    regular_files: set[str] = set()
    for member, data in read_members(stream, f"tar {source}", field=str(source)):
        relative = member_path(source, member.name)
        if str(relative) == ".":
            continue
        _no_link_on_the_way(source, dest, relative, member.name)
        path = dest / relative
        mode = member.mode & PERMISSION_BITS
        if member.kind == "dir":
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                path.unlink()
                regular_files.discard(str(relative))
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(mode | 0o700)  # the owner must be able to write what follows into it
        elif member.kind == "file":
            _make_room(source, path, member.name)
            _write_file(data, path, mode)
            regular_files.add(str(relative))
        elif member.kind == "symlink":
            _link_stays_inside(source, member, relative)
            _make_room(source, path, member.name)
            os.symlink(member.linkname, path)
            regular_files.discard(str(relative))
        elif member.kind == "hardlink":
            target = member_path(source, member.linkname)
            if str(target) not in regular_files or (dest / target).is_symlink():
                raise OciError(
                    f"tar {source}: hard link {member.name!r} points to {member.linkname!r}, "
                    "which is not a regular file written before it",
                    field=f"{source}:{member.name}",
                )
            _make_room(source, path, member.name)
            os.link(dest / target, path)
            regular_files.add(str(relative))
        else:
            raise OciError(
                f"tar {source}: member {member.name!r} is a device, FIFO or other special file; "
                "only files, directories and links are extracted",
                field=f"{source}:{member.name}",
            )
        written.append(str(relative))
    return written
