"""The emulator's command line: one flag per EmulatorConfig field, generated from the model.

`max_running_requests` is `--max-running-requests VALUE`; booleans are bare flags (`--disable-prefix-cache`)
and lists take several values or one comma-separated value (`--accept-probs 0.8 0.6 0.45`). A --config
YAML file sets fields too; flags override it.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from pipeline.config.emulator import SHAPE_FIELDS, ConfigError, EmulatorConfig, build_config


def _help(name: str, field) -> str:
    bounds = [f"{k} {getattr(m, k)}" for m in field.metadata for k in ("ge", "gt", "le", "lt")
              if getattr(m, k, None) is not None]
    if get_origin(field.annotation) is Literal:
        bounds.append("choices: " + " | ".join(map(str, get_args(field.annotation))))
    if name in SHAPE_FIELDS:
        bounds.append("set by model_preset")
    extra = f" [{', '.join(bounds)}]" if bounds else ""
    default = EmulatorConfig.model_fields[name].default
    return f"{field.description}{extra} (default: {default})".replace("%", "%%")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.emulator",
        description="OpenAI-compatible serving emulator: continuous batching, chunked prefill, prefix cache, "
                    "speculative decoding; each cycle sleeps for modelled time (attention from vattn's cost "
                    "model). Arm from env (vattn/switch.py): VATTN=0 baseline kernel + fixed split; VATTN=1 or "
                    "unset vattn with VATTN_PLAN (fixed | length_aware | balanced, default balanced).")
    parser.add_argument("--config", metavar="FILE.yaml", help="YAML file of config fields (flags override it).")
    for name, field in EmulatorConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, nargs="?", const="true", default=None, metavar="true|false",
                                help=_help(name, field))
        elif name == "accept_probs":
            parser.add_argument(flag, dest=name, nargs="+", default=None, metavar="P", help=_help(name, field))
        else:
            parser.add_argument(flag, dest=name, default=None, metavar=name.upper(), help=_help(name, field))
    return parser


def config_from_argv(argv: list[str] | None = None) -> EmulatorConfig:
    args = vars(make_parser().parse_args(argv))
    data: dict[str, Any] = {}
    config_path = args.pop("config")
    if config_path:
        path = Path(config_path)
        if not path.is_file():
            raise ConfigError(f"--config: file {config_path!r} not found")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"--config {path}: expected a mapping of config fields, got {type(data).__name__}")
    for name, value in args.items():
        if value is None:
            continue
        if name == "accept_probs":
            value = [v for item in value for v in str(item).split(",") if v.strip()]
        data[name] = value
    return build_config(data)
