"""The recipe's `server:` block: the engine's flags and env, shared by both arms."""
from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from pipeline.config.base import Strict


def _no_empty_lists(args: dict[str, Any] | list[str]) -> dict[str, Any] | list[str]:
    # args_to_argv would write `--key` with no value after it: a bare flag, which an engine reads as a switch or
    # refuses (the emulator's --accept-probs takes one or more), never as "no values"
    empty = [k for k, v in args.items() if v == []] if isinstance(args, dict) else []
    if empty:
        raise ValueError(f"{empty[0]}: an empty list; a list gives a flag's values: give at least one, or null to "
                         f"leave the flag out")
    return args


EngineArgs = Annotated[dict[str, Any] | list[str], AfterValidator(_no_empty_lists)]


class ServerSpec(Strict):
    args: EngineArgs = Field(
        default_factory=dict,
        description="engine flags: a mapping (key -> --key value; true -> bare flag; false/null -> omitted; "
                    "a list -> the flag and its values, at least one) or a literal argv list")
    env: dict[str, str] = Field(default_factory=dict, description="env for both arms (not the kernel switch)")
    port: int = Field(30000, ge=1024, le=65535, description="port of the first server; concurrent arms use +1")
    startup_timeout_s: float = Field(900, gt=0, description="how long to wait for /health before giving up")
    launch: list[str] | None = Field(None, description="vllm: the launch command prefix (default `vllm serve`)")


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
            argv += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            argv += [flag, str(value)]
    return argv
