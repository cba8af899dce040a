"""tools/deploy/emit.py: any string, as a value or a key, reads back as the same string under
YAML 1.2 (ruamel.yaml) and YAML 1.1 (PyYAML, whose resolver follows the rules Kubernetes'
Go reader applies to booleans and numbers); the strings readers disagree on are quoted; no
value or header field can end a line of the header comment or start a document."""

from __future__ import annotations

import io

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from tools.deploy import GENERATED_MARKER, dump, render

AMBIGUOUS = [
    "0o17", "017", "0x1F", "1e3", "1E3", "1_000", "12:30", "190:20:30", ".inf", "-.Inf", ".NaN", "1.5",
    "+1", "-0", "on", "Off", "yes", "NO", "y", "N", "true", "False", "null", "Null", "~", "", " ",
    "<<", "=", "2001-12-14", "!tag", "&anchor", "*alias", "- item", "? key", ": v", "#comment", "a: b",
    "a #b", "[1]", "{a: 1}", "|", ">", "%YAML", "---", "...", "'quoted'", '"quoted"', "@at", "`tick",
    "line\nbreak", "tab\there", "cr\rhere", "nel\x85here", "ls\u2028here", "ps\u2029here", "bom\ufeff",
    "bidi\u202eevil", "zero\x00byte", "bell\x07", "ünïcode", "emoji \U0001f600",
]  # fmt: skip


def _read_12(text: str) -> object:
    reader = YAML(typ="safe", pure=True)
    reader.version = (1, 2)
    return list(reader.load_all(io.StringIO(text)))


def _read_11(text: str) -> object:
    return list(yaml.safe_load_all(text))


def _round_trips(value: str) -> None:
    document = [{"value": value, value: "as a key", "list": [value]}]
    text = dump(document)
    assert _read_12(text) == document, text
    assert _read_11(text) == document, text


@pytest.mark.parametrize("value", AMBIGUOUS, ids=range(len(AMBIGUOUS)))
def test_strings_readers_could_take_differently_round_trip(value: str) -> None:
    _round_trips(value)


@pytest.mark.parametrize("value", ["0o17", "1e3", "on", "y", "~", "12:30", "0x1F", "1_000"])
def test_strings_yaml_1_1_and_1_2_disagree_on_are_double_quoted(value: str) -> None:
    assert f'value: "{value}"' in dump([{"value": value}])


def test_plain_names_stay_plain() -> None:
    text = dump([{"apiVersion": "apps/v1", "kind": "Deployment", "image": "r.example/q", "policy": "IfNotPresent"}])
    assert text == "---\napiVersion: apps/v1\nkind: Deployment\nimage: r.example/q\npolicy: IfNotPresent\n"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40))
def test_any_string_round_trips_through_yaml_1_2_and_1_1(value: str) -> None:
    _round_trips(value)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40))
def test_header_fields_never_leave_the_comment(value: str) -> None:
    text = render([{"kind": "Service"}], label=value, image=value, engine=value, model=value)
    lines = text.splitlines()
    assert lines[0].startswith(GENERATED_MARKER) and lines[1].startswith("# engine ")
    assert text.isascii() and lines[2] == "---" and _read_12(text) == [{"kind": "Service"}]
