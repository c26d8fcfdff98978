"""The engine adapter shape: how to launch a serving engine and how to ask whether it is up.

An adapter is pure: it builds commands and names endpoints. The registry by name is in
pipeline/engines/__init__.py; how recipe flags become argv is pipeline/config/server.py's args_to_argv.
Starting, waiting and stopping live in pipeline/stages/server.py, the same for every engine and host.
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
