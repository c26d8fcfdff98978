"""The sglang engine: `python -m vattn.sglang.launch <sglang launch_server args>` on the arm's host.

Both arms run the same command; the recipe's arm env (VATTN=0 / VATTN=1) is the only difference.
The launcher registers the `vattn` attention backend and runs sglang's server unchanged, so every
flag here is one of sglang's own (`check_flags` validates them against the installed sglang).
"""
from __future__ import annotations

from pipeline.config.server import args_to_argv
from pipeline.engines.base import LaunchContext, parallel_gpus

LAUNCHER = "vattn.sglang.launch"
# The adapter owns where the server listens and what it serves; the recipe must not set these.
OWNED_FLAGS = ("--model-path", "--model", "--host", "--port")
# sglang's spellings of its parallel sizes; `--tp` is the one its docs use (argparse takes it for --tp-size)
TP_FLAGS = ("--tp-size", "--tensor-parallel-size", "--tp")
PP_FLAGS = ("--pp-size", "--pipeline-parallel-size")


class SglangEngine:
    name = "sglang"
    health_path = "/health"
    info_paths = ("/server_info", "/get_server_info")
    metrics_path = "/metrics"  # served with --enable-metrics (the configs/servers presets set it)
    emulated = False

    def gpus(self, server_args) -> tuple[int, str]:
        return parallel_gpus(args_to_argv(server_args), TP_FLAGS, PP_FLAGS)

    def command(self, ctx: LaunchContext) -> list[str]:
        args = args_to_argv(ctx.server_args)
        for flag in args:
            if flag.split("=", 1)[0] in OWNED_FLAGS:
                raise ValueError(f"server.args: sets {flag.split('=', 1)[0]}; the sglang adapter owns "
                                 f"{', '.join(OWNED_FLAGS)} (model, host and port come from the recipe)")
        # no --tokenizer-path: the recipe's tokenizer is the client's (aiperf, on the controller) and
        # may be a local path there; sglang serves with the checkpoint's own tokenizer
        return [ctx.python, "-m", LAUNCHER, "--model-path", ctx.model, "--host", ctx.bind, "--port", str(ctx.port),
                *args]


def known_flags() -> set[str]:
    """Every option string of the installed sglang's `launch_server` CLI, with vattn registered."""
    import argparse

    import vattn.sglang
    from sglang.srt.server_args import ServerArgs

    vattn.sglang.register()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return {s for action in parser._actions for s in action.option_strings}


def check_flags(argv: list[str]) -> None:
    """Raise ValueError naming every `--flag` in argv that the installed sglang does not know,
    then let sglang's own parser check the values (choices, types). The launcher's own
    options (`--vattn-base`, `--vattn-dummy-init`) are checked (and removed, as the launcher removes them) first."""
    import argparse

    import vattn.sglang
    from sglang.srt.server_args import ServerArgs

    from vattn.sglang import options

    try:
        argv = options.strip(argv)[0]
    except ValueError as exc:
        raise ValueError(f"server.args: {exc}") from None
    flags = [a.split("=", 1)[0] for a in argv if a.startswith("--")]
    unknown = sorted(set(flags) - known_flags())
    if unknown:
        raise ValueError(f"server.args: sglang does not know {', '.join(unknown)} (check the spelling against "
                         f"`python -m sglang.launch_server --help`)")
    vattn.sglang.register()
    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    try:
        parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"server.args: sglang rejects {argv}: {exc}") from None
