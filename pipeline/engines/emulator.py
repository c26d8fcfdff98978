"""The embedded emulator engine: `python -m pipeline.emulator` (see pipeline/emulator/)."""
from __future__ import annotations

from pipeline.config.server import args_to_argv
from pipeline.engines.base import LaunchContext


class EmulatorEngine:
    name = "emulator"
    health_path = "/health"
    info_paths = ("/server_info",)
    metrics_path = "/metrics"

    def command(self, ctx: LaunchContext) -> list[str]:
        argv = [ctx.python, "-m", "pipeline.emulator", "--host", ctx.bind, "--port", str(ctx.port),
                "--model", ctx.model, "--cycle-log", f"{ctx.artifact_dir}/emulator_cycles.jsonl"]
        if ctx.tokenizer:
            argv += ["--tokenizer", ctx.tokenizer]
        return argv + args_to_argv(ctx.server_args)
