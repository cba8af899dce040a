"""Atomic file writes (a reader sees the old file or the new one, never a torn one), files
created only anew, directories only of their owner's, and one run at a time in a working
directory.

Threat model: a directory this run did not make may hold anything another user planted before
the run: a symlink or a hard link under the very name about to be written, a FIFO. Every file
Omni creates there is created by `create_new` (exclusively, never through a link), and
`os.replace` moves only what this run created; a directory named on a command line that another
user could write is refused first (`refuse_shared_directory`), as ssh refuses such a key
directory. docs/security.md lists the sites.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator

RUN_LOCK = ".omni-run.lock"  # in a working directory: the pid of the run holding it


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644, field: str | None = None) -> None:
    """Write `data` to `path` via a temporary file in the same directory, created with
    `mode` from its first byte, fsynced, then renamed over the target. With `field` (the flag or
    variable that chose the path), a failure (a full disk, no permission) is a refusal naming it;
    what was at `path` stays as it was either way."""
    if field is not None:
        from attest.errors import AttestError

        try:
            write_atomic(path, data, mode=mode)
        except OSError as exc:
            raise AttestError(
                f"cannot write {path}: {exc.strerror or exc}; what was there is left as it was", field=field
            ) from None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def create_new(path: Path, *, mode: int = 0o644) -> BinaryIO:
    """`path` opened for writing as a new, empty file of this run's: whatever stands at its name
    (a symlink, or a hard link to a file elsewhere, planted there) is unlinked first, never opened
    or written through (O_EXCL | O_NOFOLLOW). The caller's directory must be its own for the run
    (a run lock held), so nothing can be planted between the unlink and the create."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise IsADirectoryError(f"{path} is a directory where a file of this run's belongs") from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, mode), "wb")


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def refuse_shared_directory(path: Path, *, field: str) -> None:
    """A directory named on a command line, where it exists, must be a directory (not a link) of
    the user running Omni (or root's) that no other user can write: not writable by group or
    others unless sticky. Anything else could have been planted by another user before the run;
    it is refused, naming the path and its owner and mode."""
    from attest.errors import AttestError

    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise AttestError(f"{field} {path} cannot be examined: {exc.strerror}", field=field) from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise AttestError(f"{field} {path} is not a directory (a link or a file)", field=field)
    owner, mode = _owner(info.st_uid), stat.S_IMODE(info.st_mode)
    if info.st_uid not in (os.geteuid(), 0):
        raise AttestError(
            f"{field} {path} is owned by {owner}, not by you ({_owner(os.geteuid())}): another user's directory "
            "is refused; name one of your own",
            field=field,
        )
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise AttestError(
            f"{field} {path} (owner {owner}, mode {mode:04o}) is writable by group or others without the "
            "sticky bit: anything in it may have been planted; remove that write bit or name another directory",
            field=field,
        )


def require_replaceable(path: Path, required_keys: frozenset[str], *, what: str, field: str) -> None:
    """Never overwrite what this tool did not write: an existing `path` must be a JSON
    object holding `required_keys` (a document of the kind about to replace it), read
    bounded. Refuses naming `field` (the flag or variable that chose the path) otherwise."""
    from attest.errors import AttestError
    from attest.reader import MAX_JSON_BYTES, loads_object, read_file

    if not os.path.lexists(path):
        return
    try:
        existing = loads_object(read_file(path, label=str(path), max_bytes=MAX_JSON_BYTES).data, label=str(path))
    except AttestError:
        existing = {}
    if not required_keys <= set(existing):
        raise AttestError(
            f"{path} exists and is not {what}; it was left as it is (choose another path, or move it aside)",
            field=field,
        )


def canonical_json(value: Any) -> bytes:
    """Sorted keys, two-space indent, trailing newline: stable bytes for stable digests."""
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


@contextlib.contextmanager
def exclusive_run(directory: Path, *, what: str, field: str) -> Iterator[None]:
    """Hold `directory`'s run lock (created 0700 with its lock file 0600, neither followed if a
    link) for the block: a second run on the same directory is refused at once, naming the
    holder's pid, instead of racing it for the same partial files. The kernel releases the lock
    when its holder dies, so a killed run never blocks the next. When the block ends the holder
    removes the lock file (and the directory, where nothing else is left in it) before it lets
    go: a run that locked the file as it was being removed sees that it is gone and tries again."""
    from attest.errors import AttestError

    try:
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise AttestError(f"{directory} cannot be created: {exc.strerror}", field=field) from None
    if directory.is_symlink() or not directory.is_dir():
        raise AttestError(f"{directory} is not a directory of this run's own (a link or a file)", field=field)
    path = directory / RUN_LOCK
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise AttestError(f"{path} cannot be opened: {exc.strerror} (a link is refused)", field=field) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 16, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise AttestError(
                f"{what} is in use by another run (pid {holder}, holding {path}): wait for it to end or stop it, "
                "then run again",
                field=field,
            ) from None
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False) if os.path.lexists(path) else None
        if there is not None and (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
            break
        os.close(fd)  # the file was replaced between open and lock: lock the one there now
    else:
        raise AttestError(f"{path} keeps changing under this run", field=field)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
            directory.rmdir()  # only where empty: resumable partial files stay
        os.close(fd)
