"""Run by the conformance test with the real SGLang and its parser's imports on the path:
parse each ARGV of a JSON list on stdin (what follows `python -m sglang.launch_server`) with
SGLang's own prepare_server_args."""

from __future__ import annotations

import argparse


def parse(argv: list[str]) -> dict:
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    # Our flags must be full option names: argparse would also accept unambiguous prefixes.
    unknown = [
        arg.split("=", 1)[0]
        for arg in argv
        if arg.startswith("--") and arg.split("=", 1)[0] not in parser._option_string_actions
    ]
    server = prepare_server_args(argv)
    fields = (
        "model_path",
        "served_model_name",
        "tp_size",
        "ep_size",
        "context_length",
        "max_running_requests",
        "max_total_tokens",
        "host",
        "port",
        "nnodes",
        "node_rank",
        "dist_init_addr",
        "speculative_algorithm",
        "attention_backend",
        "moe_runner_backend",
        "chunked_prefill_size",
        "random_seed",
        "api_key",
        "tool_call_parser",
        "reasoning_parser",
        "load_format",
        "trust_remote_code",
        "mem_fraction_static",
        "enable_metrics",
    )
    return {"not_full_option_names": unknown, **{name: getattr(server, name, None) for name in fields}}


if __name__ == "__main__":
    from batch import run  # beside this file, which is sys.path[0]

    raise SystemExit(run(parse))
