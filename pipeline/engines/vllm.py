"""The vLLM engine: the recipe's launch prefix (default `vllm serve`) + model + host/port + args.

Health is vLLM's `/health`; `/v1/models` is saved as the server info (vLLM has no /server_info);
`/metrics` is always on in vLLM's OpenAI server. `--host` and `--port` are `vllm serve` options;
the model is its positional argument; vLLM uses the checkpoint's tokenizer.
"""
from __future__ import annotations

from pipeline.config.server import args_to_argv
from pipeline.engines.base import LaunchContext, parallel_gpus

DEFAULT_LAUNCH = ("vllm", "serve")
OWNED_FLAGS = ("--host", "--port", "--model")
TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")


class VllmEngine:
    name = "vllm"
    health_path = "/health"
    info_paths = ("/v1/models",)
    metrics_path = "/metrics"
    emulated = False

    def gpus(self, server_args) -> tuple[int, str]:
        return parallel_gpus(args_to_argv(server_args), TP_FLAGS, PP_FLAGS)

    def command(self, ctx: LaunchContext) -> list[str]:
        launch = list(ctx.launch) if ctx.launch else list(DEFAULT_LAUNCH)
        if not launch or not all(isinstance(part, str) and part for part in launch):
            raise ValueError(f"server.launch: got {ctx.launch!r}; expected a non-empty command prefix such as "
                             f"['vllm', 'serve']")
        args = args_to_argv(ctx.server_args)
        for flag in args:
            if flag.split("=", 1)[0] in OWNED_FLAGS:
                raise ValueError(f"server.args: sets {flag.split('=', 1)[0]}; the vllm adapter owns "
                                 f"{', '.join(OWNED_FLAGS)} (model, host and port come from the recipe)")
        # no --tokenizer: the recipe's tokenizer is the client's (aiperf, on the controller)
        return [*launch, ctx.model, "--host", ctx.bind, "--port", str(ctx.port), *args]
