"""The recipe's `server:` block: the engine's flags and env, shared by both arms."""
from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from pipeline.config.base import Strict

EngineArgs = dict[str, Any] | list[str]


class ServerSpec(Strict):
    args: EngineArgs = Field(
        default_factory=dict,
        description="engine flags: a mapping (key -> --key value; true -> bare flag; false/null -> omitted; "
                    "a list -> repeated values) or a literal argv list")
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
