"""The engine adapter shape: how to launch a serving engine and how to ask whether it is up.

An adapter is pure: it builds commands and names endpoints. Starting, waiting and stopping live in
pipeline/stages/server.py, which works the same for every engine and every host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence


@dataclass(frozen=True)
class LaunchContext:
    """What an adapter needs to build one arm's command."""

    model: str
    tokenizer: str | None
    port: int
    bind: str                     # address the server listens on: 127.0.0.1 locally, 0.0.0.0 on SSH hosts
    server_args: dict[str, Any] | list[str]
    launch: list[str] | None      # vllm: the command prefix from the recipe
    artifact_dir: str             # where the server may write extra artifacts, on its host
    python: str = "python3"       # interpreter on the server's host


class Engine(Protocol):
    name: str
    health_path: str              # GET -> 200 once the server serves
    info_paths: Sequence[str]     # GET -> JSON facts saved as server_info.json (first that answers)
    metrics_path: str | None

    def command(self, ctx: LaunchContext) -> list[str]: ...


def args_to_argv(args: dict[str, Any] | list[str]) -> list[str]:
    """{'tp': 2, 'enable_metrics': True, 'x': None, 'ids': [1, 2]} -> ['--tp', '2', '--enable-metrics',
    '--ids', '1', '2']. A list passes through unchanged."""
    if isinstance(args, list):
        return [str(a) for a in args]
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            import json

            argv += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            argv += [flag, str(value)]
    return argv


def get_engine(name: str) -> Engine:
    if name == "emulator":
        from pipeline.engines.emulator import EmulatorEngine
        return EmulatorEngine()
    if name == "sglang":
        from pipeline.engines.sglang import SglangEngine
        return SglangEngine()
    if name == "vllm":
        from pipeline.engines.vllm import VllmEngine
        return VllmEngine()
    raise ValueError(f"engine: unknown engine {name!r}; allowed: emulator, sglang, vllm")
