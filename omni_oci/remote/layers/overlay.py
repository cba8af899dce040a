"""An image's tree as a container runtime leaves it after applying its layers in order,
kept only where it matters: the wanted files and every symbolic link.

The rules are containerd's (and umoci's): a later member wins; a whiteout (`.wh.NAME`)
removes NAME and everything under it from the layers below; an opaque marker
(`.wh..wh..opq`) empties its directory of the layers below; a file, link or device replacing
a directory removes what was under it, whichever layer wrote it; a directory replacing a
file or link removes that.

A runtime resolves a member's parent directories through the symbolic links already in the
tree (containerd's fs.RootPath, umoci's securejoin), inside the image's root. Omni refuses
such a member instead, naming it, and the same for a member under a regular file: a layer
built by a container builder is a diff of real directories and never holds one, and reading
it lexically would describe a file the runtime writes somewhere else. A whiteout or opaque
marker for what its own layer already wrote is refused too: runtimes differ on whether it
stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from omni_oci.format.errors import OciError

# Paths tracked at once (links, wanted files and the directories above them), about 300 bytes
# each: a large vendor base has tens of thousands of links; a layer built to exhaust memory is
# refused at this count.
MAX_TRACKED_PATHS = 250_000


@dataclass(frozen=True)
class LayerFile:
    """A kept member: its bytes when it is a regular file, else None and what it is."""

    path: str
    layer: str
    data: bytes | None
    kind: str = "file"


@dataclass(frozen=True, slots=True)
class _Leaf:
    """A non-directory the tree tracks: a wanted member (`kept`), a symbolic link (`target`), or both."""

    layer: int
    kept: LayerFile | None
    target: str | None = None


_Tree = dict[str, Union["_Tree", _Leaf]]


def _under(tree: _Tree) -> tuple[list[_Leaf], int]:
    """The leaves under `tree`, and how many directories it holds (itself included)."""
    leaves, stack, directories = [], [tree], 0
    while stack:
        directories += 1
        for child in stack.pop().values():
            if isinstance(child, dict):
                stack.append(child)
            else:
                leaves.append(child)
    return leaves, directories


class Overlay:
    """The tracked part of the image's tree, layer after layer."""

    def __init__(self, where: str) -> None:
        self.root: _Tree = {}
        self.layer = -1
        self.where = where
        self.digest = ""
        self.tracked = 0

    def begin_layer(self, index: int, where: str, digest: str) -> None:
        self.layer, self.where, self.digest = index, where, digest

    def _refuse(self, path: str, what: str) -> OciError:
        return OciError(f"{self.where}: {what}", field=path)

    def _parent(self, path: str, *, create: bool) -> tuple[_Tree | None, str]:
        """The directory node holding `path` and its last name; refuses a parent that is a
        symbolic link or a file. None when nothing tracked lies there (and not `create`)."""
        parts = path.split("/")  # a clean relative path (omni_oci.format.tar_members.member_path)
        node: _Tree = self.root
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                if not create:
                    return None, parts[-1]
                child = node[part] = {}
                self._count(1, path)
            if isinstance(child, _Leaf):
                walked = "/".join(parts[: depth + 1])
                what = "symbolic link" if child.target is not None else "regular file"
                raise self._refuse(
                    path,
                    f"member {path} would be written through the {what} {walked} (a runtime resolves it "
                    "elsewhere inside the image; layers built by container builders never do this)",
                )
            node = child
        return node, parts[-1]

    def check_parents(self, path: str) -> None:
        self._parent(path, create=False)

    def _remove(self, path: str, *, lower_only: bool) -> None:
        node, name = self._parent(path, create=False)
        if node is None or name not in node:
            return
        found = node[name]
        leaves, directories = _under(found) if isinstance(found, dict) else ([found], 0)
        if lower_only and any(leaf.layer == self.layer for leaf in leaves):
            raise self._refuse(path, f"a whiteout or opaque marker removes {path}, which its own layer wrote")
        self.tracked -= len(leaves) + directories
        del node[name]

    def _count(self, added: int, path: str) -> None:
        self.tracked += added
        if self.tracked > MAX_TRACKED_PATHS:
            raise self._refuse(
                path,
                f"the image holds more than {MAX_TRACKED_PATHS} symbolic links, wanted files and their directories",
            )

    def _put(self, path: str, leaf: _Leaf) -> None:
        self._remove(path, lower_only=False)
        node, name = self._parent(path, create=True)
        assert node is not None
        node[name] = leaf
        self._count(1, path)

    def directory(self, path: str) -> None:
        node, name = self._parent(path, create=False)
        if node is not None and isinstance(node.get(name), _Leaf):
            self._remove(path, lower_only=False)

    def non_directory(self, path: str, kept: LayerFile | None, target: str | None = None) -> None:
        """A file, link or device at `path`: what was there goes; tracked when kept or a link."""
        if kept is None and target is None:
            self._remove(path, lower_only=False)
        else:
            self._put(path, _Leaf(self.layer, kept, target))

    def hard_link(self, path: str, target: str, layer: str, wanted: bool) -> None:
        self.check_parents(target)
        node, name = self._parent(target, create=False)
        found = node.get(name) if node is not None else None
        source = found.kept if isinstance(found, _Leaf) and found.target is None else None
        if not wanted:
            self.non_directory(path, None)
        elif source is not None and source.data is not None:
            self.non_directory(path, LayerFile(path, layer, source.data))
        else:
            self.non_directory(path, LayerFile(path, layer, None, "hard link"))

    def whiteout(self, path: str) -> None:
        self._remove(path, lower_only=True)

    def opaque(self, directory: str) -> None:
        node = self.root
        if directory:
            parent, name = self._parent(directory, create=False)
            found = parent.get(name) if parent is not None else None
            if not isinstance(found, dict):
                return
            node = found
        for name in list(node):
            self._remove(f"{directory}/{name}" if directory else name, lower_only=True)

    def files(self) -> dict[str, LayerFile]:
        """The kept members the last layer leaves."""
        return {leaf.kept.path: leaf.kept for leaf in _under(self.root)[0] if leaf.kept is not None}
