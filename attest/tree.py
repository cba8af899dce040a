"""Files under a root, reached without ever following a symlink.

Each component is opened relative to its parent's descriptor with O_NOFOLLOW, so a link
planted anywhere on the way (or swapped in between a check and a use) makes the walk fail
instead of leading out of the root. Names must already be safe (attest.primitives.
safe_relative_name).
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from attest.errors import AttestError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _refusal(name: str, exc: OSError, what: str) -> AttestError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return AttestError(f"{name}: a symlink or non-directory lies on its path inside the root ({what})", field=name)
    if exc.errno == errno.ENOENT:
        return AttestError(f"{name} is missing", field=name)
    return AttestError(f"{name} cannot be {what}: {exc.strerror}", field=name)


@contextmanager
def parent_dir(root: Path, name: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """A descriptor of `name`'s parent directory under `root` and the leaf name."""
    parts = name.split("/")
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise AttestError(f"the root {root} cannot be opened as a directory: {exc.strerror}", field=str(root)) from None
    try:
        for part in parts[:-1]:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise _refusal(name, exc, "created") from None
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _refusal(name, exc, "opened") from None
            os.close(fd)
            fd = child
        yield fd, parts[-1]
    finally:
        os.close(fd)


@contextmanager
def open_regular(root: Path, name: str) -> Iterator[int]:
    """`name` under `root` opened for reading: a regular file, no symlink anywhere."""
    with parent_dir(root, name) as (parent, leaf):
        try:
            fd = os.open(leaf, _FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise _refusal(name, exc, "opened") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise AttestError(f"{name} is not a regular file", field=name)
        os.set_blocking(fd, True)
        yield fd
    finally:
        os.close(fd)


def stat_regular(root: Path, name: str) -> os.stat_result | None:
    """`name`'s stat (no symlink followed), None when it does not exist."""
    try:
        with open_regular(root, name) as fd:
            return os.fstat(fd)
    except AttestError as exc:
        if str(exc).endswith("is missing"):
            return None
        raise


def place(temporary: Path, root: Path, name: str) -> None:
    """Rename `temporary` (on the same filesystem) to `name` under `root`, creating the
    parent directories, through descriptors that follow no symlink."""
    with parent_dir(root, name, create=True) as (parent, leaf):
        try:
            existing = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise AttestError(f"{name} exists as a directory", field=name)
        # rename() replaces a symlink at the destination itself; it never writes through it.
        os.replace(temporary, leaf, dst_dir_fd=parent)


def walk_files(
    root: Path, skip_files: frozenset[str] = frozenset(), skip_dirs: frozenset[str] = frozenset()
) -> Iterator[tuple[str, bool]]:
    """Every non-directory under `root` as (relative name, is_symlink); top-level files (and
    links) named in `skip_files` and top-level directories named in `skip_dirs` are left out: a
    directory under a file's name is walked like any other, so nothing hides under a working
    name. Symlinked directories are reported, never entered."""
    for directory, dirs, files in os.walk(root, followlinks=False):
        relative = os.path.relpath(directory, root)
        prefix = "" if relative == "." else relative + "/"
        for entry in list(dirs):
            if os.path.islink(os.path.join(directory, entry)):
                dirs.remove(entry)
                if not (not prefix and entry in skip_files):
                    yield prefix + entry, True
        if not prefix:
            dirs[:] = [d for d in dirs if d not in skip_dirs]
            files = [f for f in files if f not in skip_files]
        for entry in files:
            yield prefix + entry, os.path.islink(os.path.join(directory, entry))
