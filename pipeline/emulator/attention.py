"""The emulator's attention models behind one protocol, and the one place that picks between them.

    model   CostModelAttention (cost_attention.py): vattn's cost model on a hardware profile, any CPU
    kernel  KernelAttention (kernel_attention.py): the arm's real vattn kernel timed on a CUDA GPU,
            carrying the cost model as its `predictor` so both are logged

The StepTimer (timing.py) only sees the protocol; the server builds the model here.
"""
from __future__ import annotations

from typing import Any, Protocol

from pipeline.config.emulator import EmulatorConfig
from pipeline.emulator.arm import Arm
from pipeline.emulator.cost_attention import CostModelAttention
from pipeline.emulator.kernel_attention import KernelAttention


class AttentionBackend(Protocol):
    """Time of ONE attention-layer call on this batch, in microseconds."""

    name: str

    def layer_us(self, seq_lens: list[int], q_lens: list[int]) -> float: ...

    def info(self) -> dict[str, Any]: ...


def make_attention(cfg: EmulatorConfig, arm: Arm) -> AttentionBackend:
    """The attention model `cfg.attention` names (torch and the kernel load only for 'kernel')."""
    if cfg.attention == "kernel":
        return KernelAttention(cfg, arm)
    return CostModelAttention(cfg, arm)
