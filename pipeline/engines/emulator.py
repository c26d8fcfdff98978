"""The embedded emulator engine: `python -m pipeline.emulator` (see pipeline/emulator/)."""
from __future__ import annotations

from pathlib import Path

from pipeline.config.emulator import tp_size_source
from pipeline.config.server import args_to_argv
from pipeline.engines.base import LaunchContext
from pipeline.paths import ArmPaths


class EmulatorEngine:
    name = "emulator"
    health_path = "/health"
    info_paths = ("/server_info",)
    metrics_path = "/metrics"
    # it models a server of tp_size GPUs (the model preset's); GPUs that placement lends it run the kernel alone
    emulated = True

    def gpus(self, server_args) -> tuple[int, str]:
        return tp_size_source(args_to_argv(server_args))

    def command(self, ctx: LaunchContext) -> list[str]:
        # One cycle-log file per server start, so a resumed arm keeps each lifetime's cycles apart.
        cycle_dir = ArmPaths(Path(ctx.artifact_dir)).emulator_cycles_dir
        argv = [ctx.python, "-m", "pipeline.emulator", "--host", ctx.bind, "--port", str(ctx.port),
                "--model", ctx.model, "--cycle-log-dir", str(cycle_dir)]
        if ctx.tokenizer:
            argv += ["--tokenizer", ctx.tokenizer]
        return argv + args_to_argv(ctx.server_args)
