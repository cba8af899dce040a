"""Both sides of every numeric and enumerated limit of the launcher's and boot's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from attest.errors import AttestError
from boot.settings import BootSettings
from launcher.settings import BUILT_IN_API_KEY, LauncherSettings


def _cases(bounds: dict[str, tuple[list[str], list[str]]]) -> list[tuple[str, str, bool]]:
    return [
        (variable, value, accepted)
        for variable, (good, bad) in bounds.items()
        for accepted, values in ((True, good), (False, bad))
        for value in values
    ]


# variable: (accepted values, refused values)
LAUNCHER_BOUNDS = {
    "QWEN_PORT": (["1", "65535", "8103"], ["0", "65536", "-1", "80.5", "", "0x50"]),
    "QWEN_MAX_MODEL_LEN": (["1024", "262144"], ["1023", "262145", "1e4"]),
    "QWEN_GPU_MEMORY_UTILIZATION": (["0.20", "0.90", "0.2", "0.9"], ["0.19", "0.91", "nan", "inf", "-0.5"]),
    "QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT": (["100", "0.001", "5"], ["0", "-1", "100.01", "nan"]),
    "OMNI_HASH_WORKERS": (["0", "1", "1024"], ["-1", "1025", "two"]),
    "NATIVE_MTP_TOKENS": (["1", " 1 "], ["0", "2", "1.0", "one", ""]),
    "INFERENCE_MODE": (
        ["auto", "AUTO", "autoregressive", "ar", "native_mtp", "mtp", "dflash2_canary", "dflash2"],
        ["", "turbo", "speculative"],
    ),
    # Any --dtype vLLM knows (the target profile then allows its own: tests/attest/target_profile_test.py).
    "QWEN_DTYPE": (
        ["float16", "fp16", "half", "FP16", "bfloat16", "bf16", "float32", "fp32", ""],
        ["int8", "auto", "float64", "f16"],
    ),
    "OMNI_TARGET_PROFILE": (["qwen3.8-27b-mi300x", "qwen3.5-tiny-cpu", "x"], ["", "../x", "Qwen", "a/b", "-x"]),
    "QWEN_BIND_HOST": (["127.0.0.1", "::1", "localhost"], ["10.0.0.5", "", "0.0.0.0"]),
}


@pytest.mark.parametrize("variable, value, accepted", _cases(LAUNCHER_BOUNDS))
def test_launcher_setting_bounds(variable: str, value: str, accepted: bool) -> None:
    environment = {variable: value}
    if accepted:
        LauncherSettings.from_env(environment)
    else:
        with pytest.raises(AttestError) as caught:
            LauncherSettings.from_env(environment)
        assert caught.value.field == variable, str(caught.value)
        assert repr(value) in str(caught.value), "the refusal shows the value seen"


def test_the_wildcard_bind_needs_the_internal_only_declaration() -> None:
    assert (
        LauncherSettings.from_env({"QWEN_BIND_HOST": "0.0.0.0", "QWEN_CONTAINER_INTERNAL_ONLY": "1"}).bind_host
        == "0.0.0.0"
    )
    for internal in ("0", "", "no"):
        with pytest.raises(AttestError, match="requires QWEN_CONTAINER_INTERNAL_ONLY=1"):
            LauncherSettings.from_env({"QWEN_BIND_HOST": "0.0.0.0", "QWEN_CONTAINER_INTERNAL_ONLY": internal})


def test_launcher_defaults_and_which_were_used() -> None:
    settings = LauncherSettings.from_env({"QWEN_API_KEY": "k", "MODEL_PATH": "/m"})
    assert (settings.port, settings.max_model_len, settings.gpu_memory_utilization, settings.mtp_tokens) == (
        8103,
        65536,
        0.60,
        1,
    )
    assert settings.checkpoint_manifest == Path("/m/.omni-checkpoint.json")
    assert "MODEL_PATH" not in settings.defaults_used and "QWEN_PORT" in settings.defaults_used
    assert settings.warnings() == [w for w in settings.warnings() if w.startswith("QWEN_CHECKPOINT_MANIFEST_SHA256")]
    assert LauncherSettings.from_env({}).api_key == BUILT_IN_API_KEY
    assert len(LauncherSettings.from_env({}).warnings()) == 2


BOOT_BOUNDS = {
    "SERVER_PORT": (["1", "65535"], ["0", "65536", "x"]),
    "NNODES": (["1", "64"], ["0", "65"]),
    "TP_SIZE": (["1", "512"], ["0", "513"]),
    "DOWNLOAD_ATTEMPTS": (["1", "20"], ["0", "21"]),
    "DOWNLOAD_WORKERS": (["1", "32"], ["0", "33"]),
    "VERIFY_WORKERS": (["0", "256"], ["-1", "257"]),
    "DOWNLOAD_STALL_S": (["0.5", "9999999"], ["0", "-1", "10000000", "nan", "inf"]),
    "MEM_FRACTION_STATIC": (["1", "0.01"], ["0", "1.01", "nan"]),
    "DSPARK_BLOCK_SIZE": (["1", "64"], ["0", "65"]),
    "WARMUP_PROMPT_WORDS": (["1", "100000", ",".join(["5"] * 16)], ["0", "100001", ",".join(["5"] * 17), "a,b"]),
    "OFFLOAD_MODE": (["nvme", "ram"], ["disk", ""]),
    "CHECKPOINT_LOCK_SHA256": (["", "ab" * 32, "AB" * 32], ["ab" * 31, "zz" * 32]),
    "HF_ENDPOINT": (["", "https://huggingface.co", "http://127.0.0.1:8080/mirror"], ["ftp://x", "huggingface.co"]),
}


@pytest.mark.parametrize("variable, value, accepted", _cases(BOOT_BOUNDS))
def test_boot_setting_bounds(tmp_path: Path, variable: str, value: str, accepted: bool) -> None:
    environment = {"STATE_PATH": str(tmp_path), variable: value}
    if variable == "NNODES":
        environment["NODE_RANK"] = "0"
    if accepted:
        BootSettings.from_env(environment)
    else:
        with pytest.raises(AttestError) as caught:
            BootSettings.from_env(environment)
        assert caught.value.field == variable, str(caught.value)


def test_node_rank_must_be_below_nnodes() -> None:
    assert BootSettings.from_env({"NNODES": "3", "NODE_RANK": "2"}).node_rank == 2
    with pytest.raises(AttestError, match="NODE_RANK must be in 0..NNODES-1"):
        BootSettings.from_env({"NNODES": "3", "NODE_RANK": "3"})


# --- attest.edge.settings: the parsers every command's settings are declared with -----------------
def _refusal(parse, raw: str) -> str:
    with pytest.raises(AttestError) as caught:
        parse(raw, "VAR")
    assert caught.value.field == "VAR"
    return str(caught.value)


def test_text_is_at_most_4096_bytes_without_nul_and_stripped() -> None:
    from attest.edge import settings

    assert settings.text(" v ", "VAR") == "v"
    assert settings.text("a" * 4096, "VAR") == "a" * 4096
    assert settings.text("é" * 2048, "VAR") == "é" * 2048  # 4096 bytes
    for raw in ("a" * 4097, "é" * 2048 + "a", "a\x00b"):
        assert _refusal(settings.text, raw) == "VAR must be at most 4096 bytes with no NUL byte"
    assert settings.path(" /x ", "VAR") == Path("/x")
    assert settings.optional_path(" ", "VAR") is None and settings.optional_path("/y", "VAR") == Path("/y")


def test_a_token_is_1_to_128_safe_characters() -> None:
    from attest.edge import settings

    assert settings.token(" aZ9_.:+- ", "VAR") == "aZ9_.:+-"
    assert settings.token("t" * 128, "VAR") == "t" * 128
    for raw in ("t" * 129, "", "a b", "a/b", "a;b"):
        assert "VAR must be a name of letters, digits and . _ : + - (at most 128)" in _refusal(settings.token, raw)


def test_a_refusal_shows_80_characters_of_the_value_at_most() -> None:
    from attest.edge import settings

    assert settings.shown("x" * 80) == repr("x" * 80)
    assert settings.shown("x" * 81) == repr("x" * 77 + "...")


IN_RANGE, NOT_AN_INTEGER = "an integer in 5..10", "an integer in ASCII digits"


@pytest.mark.parametrize(
    "raw, value",
    [
        ("5", 5),
        ("10", 10),
        ("4", IN_RANGE),
        ("-3", IN_RANGE),
        ("11", IN_RANGE),
        ("999999999999", IN_RANGE),
        ("1" * 13, NOT_AN_INTEGER),
        ("1.0", NOT_AN_INTEGER),
        ("", NOT_AN_INTEGER),
        ("--1", NOT_AN_INTEGER),
        # What int() takes and a person reads otherwise: spaces, other scripts' digits, underscores.
        (" 7 ", NOT_AN_INTEGER),
        ("7\n", NOT_AN_INTEGER),
        ("\uff17", NOT_AN_INTEGER),
        ("\u0667", NOT_AN_INTEGER),
        ("\u0e57", NOT_AN_INTEGER),
        ("8_1", NOT_AN_INTEGER),
        ("+7", NOT_AN_INTEGER),
    ],
)
def test_an_integer_has_at_most_12_digits_and_both_bounds(raw: str, value) -> None:
    from attest.edge import settings

    parse = settings.integer(5, 10)
    if isinstance(value, int):
        assert parse(raw, "VAR") == value
        return
    assert _refusal(parse, raw).startswith(f"VAR must be {value}, got ")


def test_an_integer_without_an_upper_bound_and_with_its_own_wording() -> None:
    from attest.edge import settings

    unbounded = settings.integer(-2)
    assert unbounded("-2", "VAR") == -2 and unbounded("999999999999", "VAR") == 999999999999
    assert _refusal(unbounded, "-3") == "VAR must be an integer in >= -2, got '-3'"
    worded = settings.integer(0, 1, expected="0 or 1")
    assert (
        _refusal(worded, "2") == "VAR must be 0 or 1, got '2'"
        and _refusal(worded, "x") == "VAR must be 0 or 1, got 'x'"
    )


def test_a_real_refuses_what_its_predicate_or_float_refuses() -> None:
    from attest.edge import settings

    accept = lambda value: 0 < value <= 1  # noqa: E731
    assert settings.real("0.5", "VAR", "in (0, 1]", accept) == 0.5
    for raw in ("0", "1.5", "nan", "inf", "x", ""):
        assert _refusal(lambda r, v: settings.real(r, v, "in (0, 1]", accept), raw).startswith("VAR must be in (0, 1]")


def test_choice_lower_cases_only_when_asked_and_names_options_then_aliases() -> None:
    from attest.edge import settings

    exact = settings.choice("a", "b", aliases={"x": "a"})
    assert exact(" a ", "VAR") == "a" and exact("x", "VAR") == "a"
    assert _refusal(exact, "A") == "VAR must be one of a, b, x, got 'A'"
    lower = settings.choice("a", "b", lower=True)
    assert lower(" B ", "VAR") == "b"
    assert _refusal(lower, "c") == "VAR must be one of a, b, got 'c'"


def test_read_settings_records_defaults_and_keeps_the_command_error_type() -> None:
    from attest.edge import settings

    class CommandError(AttestError):
        pass

    declared = (
        settings.Setting("A_VAR", "a", "3", settings.integer(1, 5), "an a"),
        settings.Setting(
            "B_VAR",
            "b",
            lambda env: env.get("A_VAR", "") + "!",
            settings.text,
            "a b",
            warn_when_default="b is computed",
        ),
        settings.Setting("C_VAR", "c", "", settings.optional_path, "a c", warn_when_default="no c"),
    )
    values, defaulted = settings.read_settings(declared, {"A_VAR": "4", "C_VAR": "/c"})
    assert values == {"a": 4, "b": "4!", "c": Path("/c")} and defaulted == {"B_VAR"}
    assert settings.default_warnings(declared, defaulted) == ["B_VAR is unset: b is computed"]
    with pytest.raises(CommandError) as caught:
        settings.read_settings(declared, {"A_VAR": "9"}, error=CommandError)
    assert caught.value.field == "A_VAR" and type(caught.value) is CommandError
    with pytest.raises(AttestError) as plain:
        settings.read_settings(declared, {"A_VAR": "9"})
    assert type(plain.value) is AttestError

    class ParserError(AttestError):
        pass

    def strict(raw: str, variable: str) -> str:
        raise ParserError("its own refusal", field=variable)

    own = (settings.Setting("D_VAR", "d", "x", strict, "a d"),)
    with pytest.raises(ParserError):  # a parser's own error type is kept, never converted
        settings.read_settings(own, {}, error=CommandError)

    refusal = AttestError("A_VAR must be fine", field="A_VAR")
    noted = settings.note_default(refusal, declared, frozenset({"A_VAR"}))
    assert str(noted) == "A_VAR must be fine (A_VAR is unset; its default 3 was used)" and noted.field == "A_VAR"
    assert settings.note_default(refusal, declared, frozenset()) is refusal
    assert settings.note_default(refusal, declared, frozenset({"B_VAR"})) is refusal  # another variable's default
    computed = settings.note_default(AttestError("bad", field="B_VAR"), declared, frozenset({"B_VAR"}))
    assert str(computed) == "bad (B_VAR is unset; its default computed was used)"
    assert (
        settings.note_default(AttestError("bad", field="C_VAR"), declared, frozenset({"C_VAR"})).args[0]
        == "bad (C_VAR is unset; its default unset was used)"
    )

    assert settings.help_table(declared).splitlines()[0] == f"  {'A_VAR':<40} an a [default: 3]"
    assert settings.markdown_table(declared).splitlines() == [
        "| variable | default | what |",
        "| --- | --- | --- |",
        "| `A_VAR` | `3` | an a |",
        "| `B_VAR` | computed | a b |",
        "| `C_VAR` | unset | a c |",
    ]


@pytest.mark.parametrize(
    "raw, result",
    [
        ("1", True),
        (" TRUE ", True),
        ("yes", True),
        ("On", True),
        ("0", False),
        ("", False),
        (None, False),
        ("2", False),
        ("y", False),
    ],
)
def test_only_the_true_words_are_true(raw, result: bool) -> None:
    from attest.edge import settings

    assert settings.is_true(raw) is result
    if raw is not None:
        assert settings.flag(raw, "VAR") is result
