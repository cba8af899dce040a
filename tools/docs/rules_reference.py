"""The rules reference of docs/images.md, generated from the rules' own `doc=` strings.

    bazel run //tools/docs:rules_reference            # print the reference
    bazel run //tools/docs:rules_reference -- --write # rewrite the block in docs/images.md

Every public name of tools/defs.bzl is documented, in a section per concern (the private .bzl
file that implements it): rules with an example and their attributes, macros with their
docstring (an example included), providers with their fields. `tests/system/docs_test.py` keeps the block in step and
refuses a public rule, attribute or macro without a doc.

Written here rather than with stardoc, whose Bazel module does not resolve offline: the .bzl
files are evaluated as Python with stand-ins for the Starlark built-ins their top level uses
(`load`, `rule`, `attr.*`, `provider`, `Label`, ...). Function bodies never run, so only the
declarations are read, and a .bzl file whose top level needs another built-in fails loudly.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = "tools/defs.bzl"
PAGE = "docs/images.md"
BEGIN = "<!-- rules:begin (generated from the rules' doc= strings by tools/docs/rules_reference.py; tests/system/docs_test.py keeps it equal) -->"
END = "<!-- rules:end -->"


@dataclass
class Attribute:
    kind: str
    doc: str = ""
    default: Any = None
    mandatory: bool = False
    values: list[str] = field(default_factory=list)


@dataclass
class Rule:
    doc: str
    attrs: dict[str, Attribute]
    executable: bool = False


@dataclass
class Provider:
    doc: str
    fields: dict[str, str]


class _Anything:
    """What a declaration may hold but the reference never shows (toolchain types, configs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __getattr__(self, name: str) -> "_Anything":
        return _Anything()

    def __call__(self, *args: Any, **kwargs: Any) -> "_Anything":
        return _Anything(*args)

    def __repr__(self) -> str:
        return "…"


class _Label(str):
    def __repr__(self) -> str:
        return f'"{self}"'


class _Attr:
    def __getattr__(self, kind: str) -> Callable[..., Attribute]:
        def declare(
            doc: str = "", default: Any = None, mandatory: bool = False, values: list | None = None, **_: Any
        ) -> Attribute:
            return Attribute(kind=kind, doc=doc, default=default, mandatory=mandatory, values=list(values or []))

        return declare


def _rule(
    implementation: Any = None,
    doc: str = "",
    attrs: dict | None = None,
    executable: bool = False,
    test: bool = False,
    **_: Any,
) -> Rule:
    return Rule(doc=doc, attrs=dict(attrs or {}), executable=executable or test)


def _provider(doc: str = "", fields: dict | list | None = None, **_: Any) -> Provider:
    return Provider(doc=doc, fields=dict(fields) if isinstance(fields, dict) else {f: "" for f in fields or []})


def _starlark_builtins() -> dict[str, Any]:
    """The stand-ins for what the top level of our .bzl files uses (and `load`, bound per file)."""
    return {
        "attr": _Attr(),
        "rule": _rule,
        "provider": _provider,
        "Label": _Label,
        "struct": _Anything,
        "select": _Anything,
        "depset": _Anything,
        "json": _Anything(),
        "config": _Anything(),
        "config_common": _Anything(),
        "platform_common": _Anything(),
        "repository_rule": _Anything,
        "module_extension": _Anything,
        "tag_class": _Anything,
        "DefaultInfo": _Anything,
        "OutputGroupInfo": _Anything,
        "fail": _Anything,
        "native": _Anything(),
    }


class Loader:
    """Evaluates .bzl files of this repository (each once); other repositories' are stand-ins."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, dict[str, Any]] = {}

    def path_of(self, label: str, current: str) -> str | None:
        if label.startswith("@"):
            return None
        if label.startswith(":"):
            return str(Path(current).parent / label[1:])
        package, _, name = label.removeprefix("//").partition(":")
        return f"{package}/{name}"

    def module(self, path: str) -> dict[str, Any]:
        if path not in self.modules:
            namespace: dict[str, Any] = {"__builtins__": __builtins__, **_starlark_builtins()}
            namespace["load"] = lambda label, *names, **aliases: self._load(namespace, path, label, names, aliases)
            source = (self.root / path).read_text(encoding="utf-8")
            exec(compile(source, str(self.root / path), "exec"), namespace)  # noqa: S102 - our own .bzl files
            self.modules[path] = namespace
        return self.modules[path]

    def _load(self, namespace: dict, current: str, label: str, names: tuple, aliases: dict) -> None:
        target = self.path_of(label, current)
        loaded = self.module(target) if target else {}
        for name in names:
            namespace[name] = loaded.get(name, _Anything())
        for alias, name in aliases.items():
            namespace[alias] = loaded.get(name, _Anything())


def _public_names(loader: Loader) -> dict[str, Any]:
    namespace = loader.module(PUBLIC)
    given = {"load", *_starlark_builtins()}
    return {name: value for name, value in namespace.items() if not name.startswith("_") and name not in given}


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(attribute: Attribute) -> str:
    if attribute.mandatory:
        return "required"
    if attribute.default is None:
        return {
            "bool": "`False`",
            "string_list": "`[]`",
            "label_list": "`[]`",
            "string_dict": "`{}`",
            "string": '`""`',
        }.get(attribute.kind, "—")
    if isinstance(attribute.default, bool):
        return f"`{attribute.default}`"
    return f"`{attribute.default!r}`".replace("'", '"')


def _docstring(function: Callable) -> str:
    return textwrap.dedent("    " + (function.__doc__ or "").strip()).strip()


# The sections of the reference: the concern each private .bzl file implements, in this order.
CONCERNS = {
    "layer.bzl": "Layers",
    "debian_layer.bzl": "Layers",
    "image.bzl": "Images",
    "index.bzl": "Image indexes",
    "push.bzl": "Pushing and loading",
    "load.bzl": "Pushing and loading",
    "manifests.bzl": "Deploying",
    "py_test.bzl": "Tests",
    "settings.bzl": "Build settings",
    "providers.bzl": "Providers",
}
EXAMPLE = "\n\nExample:\n\n"


def _concerns(root: Path = ROOT) -> dict[str, list[tuple[str, Any]]]:
    """Every public name under the concern of the private file that defines it."""
    loader = Loader(root)
    names = _public_names(loader)
    sections: dict[str, list[tuple[str, Any]]] = {title: [] for title in dict.fromkeys(CONCERNS.values())}
    for name, value in sorted(names.items()):
        homes = [path for path, module in loader.modules.items() if path != PUBLIC and module.get(name) is value]
        title = CONCERNS.get(Path(homes[0]).name if homes else "", "Other")
        sections.setdefault(title, []).append((name, value))
    return {title: items for title, items in sections.items() if items}


def _summary_and_example(doc: str) -> tuple[str, str]:
    summary, _, example = doc.partition(EXAMPLE)
    return summary, textwrap.dedent(example).strip("\n")


def _rule_section(value: Rule) -> list[str]:
    summary, example = _summary_and_example(value.doc)
    rows = [
        "| attribute | type | default | what |",
        "| --- | --- | --- | --- |",
        "| `name` | name | required | the target's name |",
    ]
    for attr_name, attribute in sorted(value.attrs.items()):
        if attr_name.startswith("_"):
            continue
        what = attribute.doc + (f" One of: {', '.join(attribute.values)}." if attribute.values else "")
        rows.append(f"| `{attr_name}` | {attribute.kind} | {_default(attribute)} | {_cell(what)} |")
    parts = [_cell(summary)]
    if example:
        parts.append("```starlark\n" + example + "\n```")
    return parts + ["\n".join(rows)]


def reference(root: Path = ROOT) -> str:
    parts = []
    for title, items in _concerns(root).items():
        parts.append(f"### {title}")
        for name, value in items:
            parts.append(f"#### `{name}`")
            if isinstance(value, Rule):
                parts += _rule_section(value)
            elif isinstance(value, Provider):
                parts.append(_cell(value.doc))
                fields = [f"| `{f}` | {_cell(d)} |" for f, d in value.fields.items()]
                parts.append("\n".join(["| field | what |", "| --- | --- |", *fields]))
            else:
                parts.append("```\n" + _docstring(value) + "\n```")
    return "\n\n".join(parts)


def undocumented(root: Path = ROOT) -> list[str]:
    """Every public rule, attribute, macro or provider field without a doc."""
    missing = []
    for name, value in _public_names(Loader(root)).items():
        if isinstance(value, Rule):
            if not value.doc.strip():
                missing.append(name)
            if EXAMPLE not in value.doc:
                missing.append(f"{name} (no example)")
            missing += [
                f"{name}.{a}"
                for a, attribute in value.attrs.items()
                if not a.startswith("_") and not attribute.doc.strip()
            ]
        elif isinstance(value, Provider):
            if not value.doc.strip():
                missing.append(name)
            missing += [f"{name}.{f}" for f, doc in value.fields.items() if not doc.strip()]
        elif callable(value) and not (value.__doc__ or "").strip():
            missing.append(name)
        elif callable(value) and "Example:" not in (value.__doc__ or ""):
            missing.append(f"{name} (no example)")
    return sorted(missing)


def _replace_block(page: str, block: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?\n" + re.escape(END), flags=re.S)
    if not pattern.search(page):
        raise SystemExit(f"{PAGE} has no {BEGIN} ... {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rules_reference", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write", action="store_true", help=f"rewrite the block in {PAGE}")
    args = parser.parse_args(argv)
    root = Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY") or ROOT)
    block = reference(root)
    missing = undocumented(root)
    if missing:
        print(f"rules_reference: no doc for {', '.join(missing)}", file=sys.stderr)
        return 2
    if not args.write:
        print(block)
        return 0
    path = root / PAGE
    path.write_text(_replace_block(path.read_text(encoding="utf-8"), block), encoding="utf-8")
    print(f"rules_reference: wrote the rules reference into {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
