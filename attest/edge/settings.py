"""Settings declared once: the variable, its default, its parser and its help.

Each command (launcher, boot, gate, image tools) lists its environment variables as a
tuple of `Setting`; `read_settings` parses an environment against it, refusing a bad
value with the variable's name and the value seen, and remembers which defaults were
used so a later refusal can say so. `--help` texts and the docs' tables are generated
from the same tuples (`help_table`, `markdown_table`), and tests/system/docs_test.py keeps the docs equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from attest.errors import AttestError

MAX_VALUE_BYTES = 4096
TOKEN_RE = re.compile(r"^[A-Za-z0-9_.:+-]{1,128}$")
TRUE_WORDS = ("1", "true", "yes", "on")
Parser = Callable[[str, str], Any]
Default = str | Callable[[Mapping[str, str]], str]


@dataclass(frozen=True)
class Setting:
    variable: str
    attribute: str
    default: Default
    parse: Parser
    help: str
    # A default that weakens security (a built-in key, no pin): its use is reported as a warning.
    warn_when_default: str = ""
    secret: bool = False

    def default_text(self) -> str:
        if callable(self.default):
            return "computed"
        return self.default or "unset"


def shown(raw: str) -> str:
    return repr(raw if len(raw) <= 80 else raw[:77] + "...")


def refuse(variable: str, raw: str, expected: str) -> AttestError:
    return AttestError(f"{variable} must be {expected}, got {shown(raw)}", field=variable)


def is_true(value: str | None) -> bool:
    return str(value or "").strip().lower() in TRUE_WORDS


def flag(raw: str, variable: str) -> bool:
    return is_true(raw)


def text(raw: str, variable: str) -> str:
    if len(raw.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES or "\x00" in raw:
        raise AttestError(f"{variable} must be at most {MAX_VALUE_BYTES} bytes with no NUL byte", field=variable)
    return raw.strip()


def path(raw: str, variable: str) -> Path:
    return Path(text(raw, variable))


def optional_path(raw: str, variable: str) -> Path | None:
    value = text(raw, variable)
    return Path(value) if value else None


def token(raw: str, variable: str) -> str:
    if not TOKEN_RE.fullmatch(raw.strip()):
        raise refuse(variable, raw, "a name of letters, digits and . _ : + - (at most 128)")
    return raw.strip()


# What a number setting may look like: ASCII digits only. Python's int() and float() also take
# other scripts' digits ("８１０３"), underscores ("8_103"), surrounding spaces and "nan": a value
# that reads differently to a person and to the program is refused instead.
ASCII_INTEGER = re.compile(r"-?[0-9]{1,12}")
ASCII_DECIMAL = re.compile(r"-?(?:[0-9]{1,12}(?:\.[0-9]{0,12})?|\.[0-9]{1,12})(?:[eE][-+]?[0-9]{1,3})?")


def ascii_integer(raw: str) -> int | None:
    """The value of `raw` when it is written in ASCII digits (an optional leading -), else None."""
    return int(raw) if ASCII_INTEGER.fullmatch(raw) else None


def ascii_decimal(raw: str) -> float | None:
    """The value of `raw` when it is an ASCII decimal number (no nan, inf, _ or spaces), else None."""
    return float(raw) if ASCII_DECIMAL.fullmatch(raw) else None


def integer(low: int, high: int | None = None, *, expected: str = "") -> Parser:
    def parse(raw: str, variable: str) -> int:
        value = ascii_integer(raw)
        if value is None:
            raise refuse(variable, raw, expected or "an integer in ASCII digits")
        if value < low or (high is not None and value > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise refuse(variable, raw, expected or f"an integer in {bound}")
        return value

    return parse


def real(raw: str, variable: str, expected: str, accept: Callable[[float], bool]) -> float:
    value = ascii_decimal(raw)
    if value is None:
        raise refuse(variable, raw, expected + " (ASCII digits)")
    if not accept(value):  # NaN and infinities fail every comparison here
        raise refuse(variable, raw, expected)
    return value


def choice(*options: str, aliases: Mapping[str, str] | None = None, lower: bool = False) -> Parser:
    def parse(raw: str, variable: str) -> str:
        value = raw.strip().lower() if lower else raw.strip()
        value = (aliases or {}).get(value, value)
        if value not in options:
            named = [*options, *(aliases or {})]
            raise refuse(variable, raw, "one of " + ", ".join(dict.fromkeys(named)))
        return value

    return parse


def read_settings(
    declarations: tuple[Setting, ...], env: Mapping[str, str], error: type[AttestError] = AttestError
) -> tuple[dict[str, Any], frozenset[str]]:
    """Parsed values by attribute, and the variables whose default was used."""
    values: dict[str, Any] = {}
    defaulted = set()
    for setting in declarations:
        raw = env.get(setting.variable)
        if raw is None:
            defaulted.add(setting.variable)
            raw = setting.default(env) if callable(setting.default) else setting.default
        try:
            values[setting.attribute] = setting.parse(raw, setting.variable)
        except AttestError as exc:
            if type(exc) is AttestError and error is not AttestError:
                raise error(str(exc), field=exc.field) from None
            raise
    return values, frozenset(defaulted)


def default_warnings(declarations: tuple[Setting, ...], defaults_used: frozenset[str]) -> list[str]:
    return [
        f"{setting.variable} is unset: {setting.warn_when_default}"
        for setting in declarations
        if setting.warn_when_default and setting.variable in defaults_used
    ]


def note_default(exc: AttestError, declarations: tuple[Setting, ...], defaults_used: frozenset[str]) -> AttestError:
    """Say in a refusal that the variable at fault was unset and its default was used."""
    for setting in declarations:
        if setting.variable == exc.field and setting.variable in defaults_used:
            default = setting.default_text()
            note = f" ({setting.variable} is unset; its default {default} was used)"
            return type(exc)(str(exc) + note, field=exc.field)
    return exc


def help_table(declarations: tuple[Setting, ...]) -> str:
    """Every setting as `VARIABLE  help [default: ...]`, for --help."""
    return "\n".join(f"  {s.variable:<40} {s.help} [default: {s.default_text()}]" for s in declarations)


def markdown_table(declarations: tuple[Setting, ...]) -> str:
    """A docs table of these settings (tests/system/docs_test.py keeps the page equal to it)."""
    rows = ["| variable | default | what |", "| --- | --- | --- |"]
    for s in declarations:
        default = "computed" if callable(s.default) else (f"`{s.default}`" if s.default else "unset")
        rows.append(f"| `{s.variable}` | {default} | {s.help} |")
    return "\n".join(rows)
