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
    emulated: bool                # stands for a server of gpus() GPUs, whatever GPUs placement lends it

    def command(self, ctx: LaunchContext) -> list[str]: ...

    def gpus(self, server_args: dict[str, Any] | list[str]) -> tuple[int, str]:
        """GPUs one server spans by its flags, and the flags that say so (a sweep's throughput per GPU)."""
        ...


def parallel_gpus(argv: Sequence[str], tp_flags: Sequence[str], pp_flags: Sequence[str]) -> tuple[int, str]:
    """Tensor x pipeline parallelism, each 1 where argv does not set it, and the flags that set them.

    Data parallelism is not counted: whether its replicas take GPUs of their own depends on other flags
    (sglang's --enable-dp-attention), so a sweep of such a server says how many with placement.gpus_per_arm."""
    count, said = 1, []
    for flags in (tp_flags, pp_flags):
        found = _last_value(argv, flags)
        if found is None:
            continue
        flag, value = found
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"server.args: {flag} {value!r} is not a number of GPUs; give a whole number >= 1")
        count *= int(value)
        said.append(f"{flag} {int(value)}")
    return count, " x ".join(said) if said else f"no {tp_flags[0]}"


def _last_value(argv: Sequence[str], flags: Sequence[str]) -> tuple[str, str] | None:
    """(flag, value) of the last of `flags` in argv, as `--flag VALUE` or `--flag=VALUE`; a later one wins, as in
    argparse."""
    found = None
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in flags and (eq or i + 1 < len(argv)):
            found = (name, value if eq else argv[i + 1])
    return found
