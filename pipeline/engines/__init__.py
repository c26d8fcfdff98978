"""Engine adapters by name: the recipe's `engine:` picks one (base.py has the shape they share)."""
from __future__ import annotations

from pipeline.engines.base import Engine
from pipeline.engines.emulator import EmulatorEngine
from pipeline.engines.sglang import SglangEngine
from pipeline.engines.vllm import VllmEngine

ENGINES: dict[str, type] = {"emulator": EmulatorEngine, "sglang": SglangEngine, "vllm": VllmEngine}


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"engine: unknown engine {name!r}; allowed: {', '.join(ENGINES)}")
    return ENGINES[name]()
